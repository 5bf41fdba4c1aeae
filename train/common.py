"""What the SFT and GRPO scripts share: CLI parsing of a config dataclass, the env factory, the
policy set-up (freezing, LoRA, reference model) and the held-out evaluation."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import typing
from typing import Any, Sequence

import torch

from agents.models import load_policy
from medvqa_env.errors import ConfigError

SHORT_SYSTEM_PROMPT = (
    "You answer questions about medical images. You cannot see the image; call the tool "
    '<tool_call>{"name": "ground", "arguments": {"text": "lesion"}}</tool_call> to find lesions, '
    "then give the final answer as \\boxed{answer}."
)


# ==============================================================================================
# CLI from a dataclass (fields' docstrings become --help)
# ==============================================================================================
def field_docs(cls) -> dict[str, str]:
    """The string literal under each field of a dataclass (CleanRL-style docs)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            docs[a.target.id] = str(b.value.value)
    return docs


def parse_args(cls, argv: Sequence[str] | None = None):
    """``--field value`` for every field of dataclass ``cls``; bools take ``true/false``."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(description=(cls.__doc__ or "").strip().splitlines()[0])
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        parser.add_argument(f"--{f.name}", type=_converter(kind), default=default, help=docs.get(f.name, ""))
    return cls(**vars(parser.parse_args(argv)))


def _converter(kind):
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    base = args[0] if args else kind
    if base is bool:
        return lambda s: str(s).lower() in ("1", "true", "yes", "y")
    if base in (int, float):
        return lambda s: None if str(s).lower() == "none" else base(s)
    return lambda s: None if str(s).lower() == "none" else str(s)


# ==============================================================================================
# Env factory
# ==============================================================================================
def tool_config(spec: str) -> dict[str, Any]:
    """``"ground=oracle,image_zoom_in"`` -> the toolbox config; ``""`` -> no tools.

    >>> tool_config("ground=oracle,image_zoom_in")
    {'ground': {'backend': 'local', 'engine': 'oracle'}, 'image_zoom_in': {'backend': 'local'}}
    """
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, engine = part.partition("=")
        out[name] = {"backend": "local", **({"engine": engine} if engine else {})}
    return out


def env_kwargs(dataset: str, split: str, tools: str, max_turns: int, dataset_options: dict | None = None) -> dict:
    """Plain keyword arguments for :class:`~medvqa_env.env.MedVQAEnv` (what pools and actors get)."""
    return {"dataset": dataset, "split": split, "tools": tool_config(tools) or [], "max_turns": max_turns,
            "dataset_options": dict(dataset_options or {})}


def select_indices(dataset: str, split: str, answer_types: str, limit: int | None = None,
                   dataset_options: dict | None = None) -> list[int]:
    """Indices of the split's records whose answer type is in ``answer_types`` (comma list)."""
    from medvqa_env.datasets import load_dataset

    ds = load_dataset(dataset, split=split, **dict(dataset_options or {}))
    wanted = {t.strip().upper() for t in answer_types.split(",") if t.strip()}
    idx = [i for i, r in enumerate(ds) if not wanted or r.answer_type.value in wanted]
    if not idx:
        raise ConfigError(f"expected records of types {sorted(wanted)} in {dataset}/{split}, got none")
    return idx[:limit] if limit else idx


# ==============================================================================================
# Policy
# ==============================================================================================
def decoder_layers(model) -> torch.nn.ModuleList:
    """The transformer blocks of the language model (the longest ``ModuleList`` named ``layers``)."""
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and name.endswith("layers") and "visual" not in name:
            if best is None or len(mod) > len(best):
                best = mod
    if best is None:
        raise ConfigError(f"expected a model with decoder layers, got {type(model).__name__}")
    return best


def setup_trainable(model, train_layers: int = 0, lora_rank: int = 0, lora_alpha: int = 16):
    """All parameters train (``train_layers=0``), or only the top ``train_layers`` blocks (and the
    final norm); with ``lora_rank > 0`` LoRA adapters on the attention projections of those blocks."""
    layers = decoder_layers(model)
    n = len(layers)
    chosen = list(range(n - train_layers, n)) if 0 < train_layers < n else list(range(n))
    if lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=0.0,
                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], layers_to_transform=chosen)
        return get_peft_model(model, cfg)
    if 0 < train_layers < n:
        for p in model.parameters():
            p.requires_grad_(False)
        for i in chosen:
            for p in layers[i].parameters():
                p.requires_grad_(True)
        for name, mod in model.named_modules():
            if name.endswith("norm") and "layers" not in name and "visual" not in name:
                for p in mod.parameters():
                    p.requires_grad_(True)
    return model


def build_policy(name: str, system_prompt: str | None, train_layers: int, lora_rank: int, seed: int,
                 need_reference: bool):
    """``(model, encoder, kind, reference)``; ``reference`` is ``None`` when not needed or when
    LoRA is on (then the adapters are switched off to get reference log-probs)."""
    model, encoder, kind = load_policy(name, system_prompt=system_prompt, seed=seed)
    reference = None
    if need_reference and lora_rank <= 0:
        reference = copy.deepcopy(model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    model = setup_trainable(model, train_layers, lora_rank)
    model.train()
    return model, encoder, kind, reference


def count_trainable(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total


def save_policy(model, encoder, path) -> None:
    """A plain HF folder (LoRA merged) that :func:`agents.models.load_policy` loads back."""
    to_save = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    to_save.save_pretrained(path)
    encoder.save_pretrained(path)


# ==============================================================================================
# Held-out evaluation
# ==============================================================================================
def evaluate_heldout(model, encoder, pool, indices: Sequence[int], max_new_tokens: int, seed: int = 0,
                     micro_batch: int = 32) -> dict[str, float]:
    """Greedy episodes on ``indices`` (one each); accuracy, mean reward, format and tool use."""
    from train.metrics_log import rollout_metrics
    from train.rollout import HFGenerator, collect_rollouts

    gen = HFGenerator(model, encoder, max_new_tokens=max_new_tokens, greedy=True)
    out: dict[str, float] = {}
    trajs = []
    for k in range(0, len(indices), pool.size):
        chunk = indices[k:k + pool.size]
        batch = collect_rollouts(gen, pool, encoder, [(seed, {"index": int(i)}) for i in chunk],
                                 micro_batch=micro_batch)
        trajs.extend(batch.trajectories)
    m = rollout_metrics(trajs)
    for key in ("rollout/accuracy", "rollout/reward_mean", "rollout/format_ok", "tools/calls_per_episode",
                "rollout/answered"):
        out["eval/" + key.split("/")[1]] = m.get(key, float("nan"))
    return out
