"""What the SFT and GRPO scripts share: the command line (:mod:`medvqa_env.cli`), the env factory,
the policy set-up (device, dtype, freezing, LoRA, reference model, system prompt), the run record
(``args.json``) with its resume check, and the held-out evaluation."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from agents.models import load_policy
from medvqa_env.errors import ConfigError

SHORT_SYSTEM_PROMPT = (
    "You answer questions about medical images. You cannot see the image; call the tool "
    '<tool_call>{"name": "ground", "arguments": {"text": "lesion"}}</tool_call> to find lesions, '
    "then give the final answer as \\boxed{answer}."
)
"""The CPU demo's prompt (``--demo-prompt``): short, for a blind text model with the oracle ``ground``."""


# ==============================================================================================
# Command line
# ==============================================================================================
def parse_args(cls, argv: Sequence[str] | None = None, prog: str | None = None):
    """``--field value`` for every field of dataclass ``cls`` (see :mod:`medvqa_env.cli`)."""
    from medvqa_env.cli import parse_dataclass

    return parse_dataclass(cls, argv, prog=prog)


# ==============================================================================================
# Env factory
# ==============================================================================================
def tool_config(spec: Any) -> dict[str, Any]:
    """Any tool spelling (see :func:`tool_backends.config.load_tool_config`) -> the toolbox config;
    ``""`` -> no tools.

    >>> tool_config("ground=oracle,image_zoom_in")
    {'ground': {'backend': 'local', 'engine': 'oracle'}, 'image_zoom_in': {'backend': 'local'}}
    """
    from tool_backends.config import load_tool_config

    return load_tool_config(spec)


def reward_spec(name: str | None, options: Sequence[str] | Mapping[str, Any] | None = None) -> str | None:
    """``--reward`` + ``--reward-opt`` -> the one string the env (and a Ray worker) resolves.

    >>> reward_spec("armed", ["max_threshold=0.9"])
    'armed:max_threshold=0.9'
    """
    from medvqa_env.config import parse_options, parse_spec

    if name is None and not options:
        return None
    base, opts = parse_spec(name or "default", "reward")
    opts.update(parse_options(options, "--reward-opt"))
    if not opts:
        return base
    return base + ":" + ",".join(f"{k}={json.dumps(v)}" for k, v in opts.items())


def env_kwargs(dataset: str, split: str, tools: Any, max_turns: int, dataset_options: Mapping | Sequence | None = None,
               *, tool_options: Sequence[str] | None = None, answer_protocol: str = "boxed",
               reward: str | None = None, format_penalty: float = 0.0) -> dict:
    """Plain keyword arguments for :class:`~medvqa_env.env.MedVQAEnv` (what pools and actors get):
    the tool config resolved (so a typo fails here, once), loader options parsed."""
    from medvqa_env.config import parse_options
    from tool_backends.config import with_tool_options

    out = {"dataset": dataset, "split": split, "tools": with_tool_options(tool_config(tools), tool_options) or [],
           "max_turns": max_turns, "dataset_options": parse_options(dataset_options, "--dataset-opt"),
           "answer_protocol": answer_protocol}
    if reward is not None:
        out["reward"] = reward
    if format_penalty:  # the env's reward for a turn that neither calls a tool nor answers
        out["format_penalty"] = float(format_penalty)
    return out


def run_env_kwargs(args: Any, split: str) -> dict:
    """:func:`env_kwargs` from a trainer's ``Args`` (its dataset, tools, reward, protocol)."""
    return env_kwargs(args.dataset, split, args.tools, args.max_turns, args.dataset_opt,
                      tool_options=args.tool_opt, answer_protocol=args.answer_protocol,
                      reward=reward_spec(args.reward, args.reward_opt),
                      format_penalty=float(getattr(args, "format_penalty", 0.0) or 0.0))


def system_prompt_of(args: Any) -> str | None:
    """The prompt that replaces the env's: ``--system-prompt``, the demo's with ``--demo-prompt``,
    else ``None`` (the env's own: its tools' schemas and answer protocol)."""
    if args.demo_prompt and args.system_prompt:
        raise ConfigError("expected --demo-prompt or --system-prompt, got both")
    return SHORT_SYSTEM_PROMPT if args.demo_prompt else args.system_prompt


def select_indices(dataset: str, split: str, answer_types: str, limit: int | None = None,
                   dataset_options: dict | None = None) -> list[int]:
    """Indices of the split's records whose answer type is in ``answer_types`` (comma list)."""
    from medvqa_env.datasets import load_dataset

    from medvqa_env.config import parse_options

    ds = load_dataset(dataset, split=split, **parse_options(dataset_options, "--dataset-opt"))
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
                 need_reference: bool, device: str = "cpu", dtype: str | torch.dtype = "float32"):
    """``(model, encoder, kind, reference)`` on ``device`` in ``dtype``; ``reference`` is ``None``
    when not needed or when LoRA is on (then the adapters are switched off to get reference
    log-probs)."""
    model, encoder, kind = load_policy(name, system_prompt=system_prompt, seed=seed, device=device, dtype=dtype)
    reference = None
    if need_reference and lora_rank <= 0:
        reference = copy.deepcopy(model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    model = setup_trainable(model, train_layers, lora_rank)
    model.train()
    return model, encoder, kind, reference


def make_optimizer(model, lr: float, weight_decay: float = 0.01) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, fused where torch has the fused kernel for their
    device (CPU, CUDA): one pass over the parameters instead of a dozen element-wise ops each (the
    optimiser phase of ``benchmarks/bench_train.py`` measures it). The update is AdamW's, equal
    to the unfused one to float rounding (tested)."""
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def count_trainable(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total


def save_policy(model, encoder, path, run_info: Mapping[str, Any] | None = None) -> None:
    """A plain HF folder (LoRA merged) that :func:`agents.models.load_policy` loads back, with
    ``medvqa_run.json`` (system prompt, run config)."""
    from train.checkpoint import save_model_folder

    save_model_folder(model, encoder, path, run_info, merge=True)


# ==============================================================================================
# The run record: args.json, and a resume that cannot mix settings
# ==============================================================================================
MAY_CHANGE_ON_RESUME = frozenset({
    "out", "resume", "allow_changed", "steps", "eval_every", "eval_size", "save_every", "keep", "save_final",
    "torch_threads", "tensorboard", "report_to", "wandb_project", "env_workers", "micro_batch", "device",
})
"""Settings that do not change what is learned; anything else differing refuses a resume."""

NEW_SETTINGS = frozenset({"format_penalty", "misread_share", "guidance", "oversample"})
"""Settings added after runs were recorded: a record without one ran with its default."""


def resolved_config(args: Any) -> dict[str, Any]:
    """``args`` as JSON, plus what it resolves to (tool config, reward, prompt) and provenance."""
    from medvqa_env.provenance import provenance

    from tool_backends.identity import describe_tools

    config = dataclasses.asdict(args)
    from tool_backends.config import with_tool_options

    tools = tool_config(args.tools) if hasattr(args, "tools") else None
    if tools is not None:  # --tool-opt too: a protocol run names its tool build by seed here
        tools = with_tool_options(tools, getattr(args, "tool_opt", None))
    resolved = {"tools": tools,
                "system_prompt": system_prompt_of(args) if hasattr(args, "demo_prompt") else None}
    if resolved["tools"] is not None:  # trained tools by content hash (None until built: record_settings refreshes it)
        resolved["tool_identity"] = describe_tools(resolved["tools"], dataset=getattr(args, "dataset", None))
    if hasattr(args, "reward"):
        resolved["reward"] = reward_spec(args.reward, args.reward_opt) or "default"
    oversample = str(getattr(args, "oversample", "") or "")
    if oversample and Path(oversample.rpartition(":")[0]).is_file():  # train.grpo --oversample: its ids by content
        import hashlib

        resolved["oversample_ids_sha256"] = hashlib.sha256(Path(oversample.rpartition(":")[0]).read_bytes()).hexdigest()
    if hasattr(args, "policy"):  # what a LoRA adapter folder names as its base
        policy = Path(args.policy).expanduser()
        resolved["base_model"] = str(policy.resolve()) if policy.is_dir() else args.policy
    return {"args": config, "resolved": resolved, "provenance": provenance()}


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any], allowed: Sequence[str] = ()) -> list[str]:
    """``["lr: 2e-05 -> 0.001", ...]`` for the settings that differ and may not.

    >>> config_differences({"lr": 2e-5, "steps": 10}, {"lr": 1e-3, "steps": 20})
    ['lr: 2e-05 -> 0.001']
    """
    free = MAY_CHANGE_ON_RESUME | set(allowed)
    out = []
    for key in sorted(set(old) | set(new)):
        if key in free:
            continue
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def check_resume(out: Path, args: Any, checkpoint: Path | None) -> None:
    """Refuse to resume ``out`` with different settings (listing them) unless ``--allow-changed``
    names them (or is ``all``); refuse a ``--steps`` below the checkpoint's step."""
    path = out / "args.json"
    if checkpoint is None or not path.is_file():
        return
    record = json.loads(path.read_text())
    # a setting the record lacks did not exist when it was written: the run had its default
    defaults = {f.name: f.default for f in dataclasses.fields(args) if f.default is not dataclasses.MISSING}
    old = {**{k: v for k, v in defaults.items() if k in NEW_SETTINGS}, **record.get("args", {})}
    foreign = other_trainer(record.get("args", {}), args)
    if foreign:
        this = type(args).__module__
        hint = (f" To start from that run's model, pass --policy {out / 'final'}." if (out / "final").is_dir() else "")
        raise ConfigError(f"{out} holds a {foreign} run, not a {this} one; a {this} run needs a folder of its "
                          f"own: use another --out (e.g. --out {out}_{this.rsplit('.', 1)[-1]}).{hint}")
    allowed = [a.strip() for a in str(getattr(args, "allow_changed", "") or "").split(",") if a.strip()]
    diffs = [] if "all" in allowed else config_differences(old, dataclasses.asdict(args), allowed)
    if diffs:
        raise ConfigError(f"{out} holds a run with other settings; resuming would mix them:\n  "
                          + "\n  ".join(diffs) + "\nUse another --out, or --allow-changed "
                          + ",".join(d.split(":")[0] for d in diffs) + " to resume with the new values.")
    recorded_tools = (record.get("resolved") or {}).get("tool_identity")
    if recorded_tools and hasattr(args, "tools") and not {"all", "tools"} & set(allowed):
        from tool_backends.identity import check_tools, describe_tools

        # build=True: a trained tool missing here is built now (the env would build it anyway), then compared
        check_tools(recorded_tools, describe_tools(tool_config(args.tools), build=True,
                                                   dataset=getattr(args, "dataset", None)), str(out),
                    "Use another --out, or --allow-changed tools to resume with these tools.")
    step = int(checkpoint.name.rsplit("_", 1)[-1])
    if args.steps < step:
        raise ConfigError(f"{out} is at step {step}, past --steps {args.steps}; nothing to train "
                          "(use a larger --steps to continue, or another --out)")


TRAINER_MARKS = {"tool_share": "train.sft", "algo": "train.grpo"}
"""A setting only one trainer has: a record holding it that this trainer lacks is that trainer's."""


def other_trainer(recorded: Mapping[str, Any], args: Any) -> str | None:
    """The trainer whose run ``recorded`` (an ``args.json``'s ``args``) is, when it is not the one
    ``args`` belongs to; ``None`` when it is (or cannot be told).

    >>> from train import grpo, sft
    >>> other_trainer({"tool_share": 0.5, "lr": 1e-3}, grpo.Args()), other_trainer({"algo": "grpo"}, grpo.Args())
    ('train.sft', None)
    """
    names = {f.name for f in dataclasses.fields(args)}
    return next((trainer for key, trainer in TRAINER_MARKS.items() if key in recorded and key not in names), None)


def write_run_record(out: Path, args: Any, resumed_at: int | None) -> dict[str, Any]:
    """Write ``args.json`` (the resolved config); a resume with allowed changes is appended to
    ``resumes.jsonl`` so the record shows every setting the run ever had."""
    record = resolved_config(args)
    path = out / "args.json"
    if resumed_at is not None and path.is_file():
        old = json.loads(path.read_text()).get("args", {})
        changes = config_differences(old, record["args"], allowed=()) + [
            f"{k}: {old.get(k)!r} -> {v!r}" for k, v in record["args"].items()
            if k in MAY_CHANGE_ON_RESUME and old.get(k) != v and k not in ("resume", "allow_changed")]
        with (out / "resumes.jsonl").open("a") as f:
            f.write(json.dumps({"step": resumed_at, "changes": changes}) + "\n")
    record["dataset_skipped"] = record_dataset_skips(out, args)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record


def record_dataset_skips(out: Path, args: Any) -> dict[str, Any] | None:
    """The rows the trainer's datasets skipped (``--dataset-opt on_invalid=skip``), per split
    (``split`` and ``eval_split``): listed in ``out/skipped_records.jsonl`` (empty: none), counted
    in ``args.json`` and on stderr; a split whose every row was skipped is an error naming it."""
    import logging

    from medvqa_env.config import parse_options
    from medvqa_env.datasets import load_dataset
    from medvqa_env.provenance import SKIPPED_FILE, write_skipped_of, check_not_all_skipped, dataset_provenance

    if not isinstance(getattr(args, "dataset", None), str):
        return None
    options = parse_options(getattr(args, "dataset_opt", None), "--dataset-opt")
    splits = [s for s in dict.fromkeys((getattr(args, "split", None), getattr(args, "eval_split", None))) if s]
    loaded = [(load_dataset(args.dataset, split=s, **options), {"split": s}) for s in splits]
    write_skipped_of(loaded, out)
    counts: dict[str, Any] = {}
    for dataset, fields in loaded:
        check_not_all_skipped(dataset, out / SKIPPED_FILE)
        prov = dataset_provenance(dataset)
        counts[fields["split"]] = {"n_records": len(dataset), "n_skipped": prov.n_skipped if prov else 0,
                                   "skipped_by_reason": prov.skipped_by_reason() if prov else {}}
        if prov is not None and prov.n_skipped:
            logging.getLogger("train").warning("%s/%s: %d row(s) skipped by the loader (%s); listed in %s",
                                               args.dataset, fields["split"], prov.n_skipped,
                                               ", ".join(f"{k} {v}" for k, v in prov.skipped_by_reason().items()),
                                               out / SKIPPED_FILE)
    return counts


# ==============================================================================================
# Held-out evaluation
# ==============================================================================================
def evaluate_heldout(model, encoder, pool, indices: Sequence[int], max_new_tokens: int, seed: int = 0,
                     micro_batch: int = 32, prefix: str = "eval", answers_path: str | Path | None = None,
                     step: int | None = None, tag: str | None = None, generator: Any = None) -> dict[str, float]:
    """Greedy episodes on ``indices`` (one each); accuracy, mean reward, format and tool use, and
    on OPEN questions ``<prefix>/open/armed_avg`` and ``<prefix>/open/exact_match``; the answers'
    diversity (``<prefix>/distinct_answers``, ``answer_entropy``, ``top_answer_share``: a constant
    answer shows). With ``answers_path`` every episode's answer is appended there as a JSON line
    (``step``, ``tag`` -- e.g. an image ablation -- record, gold, answer, correct, reward, tool calls).
    ``generator`` replaces the model's greedy decoding (a scripted baseline, scored the same way)."""
    from eval.answers import answer_diversity
    from train.metrics_log import rollout_metrics
    from train.rollout import HFGenerator, collect_rollouts

    gen = generator or HFGenerator(model, encoder, max_new_tokens=max_new_tokens, greedy=True)
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
        out[f"{prefix}/" + key.split("/")[1]] = m.get(key, float("nan"))
    out.update({f"{prefix}/" + k: v for k, v in m.items() if k.startswith("open/")})  # ARMed Avg, EM on OPEN
    diversity = answer_diversity(t.answer for t in trajs)
    out.update({f"{prefix}/distinct_answers": float(diversity["distinct"]),
                f"{prefix}/answer_entropy": diversity["entropy_bits"],
                f"{prefix}/top_answer_share": diversity["top_share"]})
    if answers_path is not None:
        write_heldout_answers(answers_path, trajs, step=step, tag=tag)
    return out


def evaluate_ablations(model, encoder, args: Any, indices: Sequence[int], answers_path: str | Path | None,
                       step: int | None) -> dict[str, float]:
    """:func:`evaluate_heldout` once per mode of ``args.eval_ablations`` (``blank``, ``shuffle``:
    see :mod:`medvqa_env.ablation`) on the held-out split, keys ``eval_<mode>/...``: how much of
    the score was the picture's."""
    from eval.ablation import ablation_modes
    from medvqa_env.pool import EnvPool

    out: dict[str, float] = {}
    for mode in ablation_modes(getattr(args, "eval_ablations", "") or None):
        pool = EnvPool({**run_env_kwargs(args, args.eval_split), "image_ablation": mode}, min(len(indices), 32))
        try:
            out.update(evaluate_heldout(model, encoder, pool, indices, args.max_new_tokens, prefix=f"eval_{mode}",
                                        answers_path=answers_path, step=step, tag=mode))
        finally:
            pool.close()
    return out


def write_heldout_answers(path: str | Path, trajectories: Sequence[Any], step: int | None = None,
                          tag: str | None = None) -> None:
    """Append one JSON line per held-out episode: what was answered, not only how it scored."""
    rows = []
    for t in trajectories:
        row = {"step": step, "tag": tag, "record_id": t.record_id, "answer_type": t.answer_type,
               "gold": t.ground_truth, "answer": t.answer, "correct": t.correct, "reward": round(float(t.reward), 4),
               "format_ok": t.format_ok, "tool_calls": list(t.tool_calls), "end_reason": t.end_reason,
               "turns": [text[:160] for text in t.turn_texts]}
        scores = {k: round(float(v), 4) for k, v in t.components.items() if k in ("bleu1", "rouge1", "bertscore", "cosine")}
        if scores:
            row["open_metrics"] = scores
        rows.append(json.dumps(row, default=str))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(rows) + ("\n" if rows else ""))


# ==============================================================================================
# The end of a run: what it reached, where the model is, how to check it
# ==============================================================================================
HELDOUT_FIGURES = (("accuracy", "accuracy", ".3f"), ("open/armed_avg", "OPEN ARMed Avg", ".3f"),
                   ("open/exact_match", "OPEN EM", ".3f"), ("reward_mean", "mean reward", "+.3f"),
                   ("format_ok", "format ok", ".3f"), ("calls_per_episode", "tool calls/ep", ".2f"),
                   ("distinct_answers", "distinct answers", ".0f"))


def reproduce_command(args: Any, model_dir: str | Path, kind: str, out: str | Path) -> str:
    """The ``python -m eval.run`` command that evaluates ``model_dir`` on the trainer's held-out
    questions (``--eval-split``, ``--answer-types``, the first ``--eval-size``) as the trainer's
    greedy evaluation does: the checkpoint's own tools, turns and prompt (read from its
    ``medvqa_run.json``), the same generation length, no sampling."""
    import shlex

    agent = "vlm" if kind == "vlm" else "text-llm"
    cmd = ["python", "-m", "eval.run", "--agent", agent, "--agent-opt", f"model={model_dir}",
           "--agent-opt", f"max_new_tokens={args.max_new_tokens}", "--agent-opt", "temperature=0",
           "--dataset", args.dataset]
    for opt in args.dataset_opt or ():
        cmd += ["--dataset-opt", opt]
    cmd += ["--split", args.eval_split]
    if args.answer_types:
        cmd += ["--answer-types", args.answer_types]
    cmd += ["--limit", str(args.eval_size), "--out", str(out)]
    if getattr(args, "device", "auto") not in (None, "auto", "cpu"):
        cmd += ["--device", args.device]
    if getattr(args, "dtype", "float32") not in (None, "float32"):
        cmd += ["--dtype", args.dtype]
    return " ".join(shlex.quote(c) for c in cmd)


def run_summary(trainer: str, args: Any, out: str | Path, kind: str | None, n_heldout: int) -> str:
    """The lines a trainer ends with: the final held-out figures (the last evaluation in
    ``metrics.jsonl``, image ablations included), the saved model's path and the ``eval.run``
    command that reproduces the figure."""
    from train.checkpoint import latest_checkpoint
    from train.metrics_log import read_metrics

    out = Path(out)
    rows = read_metrics(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else []
    final = next((r for r in reversed(rows) if "eval/accuracy" in r), {})
    model_dir = out / "final" if (out / "final").is_dir() else latest_checkpoint(out)
    if kind is None and model_dir is not None:  # a finished run met again: the save says what it is
        from agents.models import read_run_file

        kind = read_run_file(model_dir).get("kind", "vlm")
    where = f"{args.eval_split} split, {n_heldout} {args.answer_types or 'all'} questions"
    lines = [f"== {trainer} done: {final.get('step', '?')} of {args.steps} steps in {out} =="]
    if final:
        shown = [f"{title} {final[f'eval/{key}']:{spec}}" for key, title, spec in HELDOUT_FIGURES
                 if isinstance(final.get(f"eval/{key}"), (int, float))]
        lines.append(f"held-out ({where}, greedy) at step {final['step']}: " + ", ".join(shown))
        for mode in sorted({k.split("/")[0][5:] for k in final if k.startswith("eval_") and k.endswith("/accuracy")}):
            lines.append(f"  with the images {mode}: accuracy {final[f'eval_{mode}/accuracy']:.3f}")
    else:
        lines.append("held-out: no evaluation was logged")
    if model_dir is None:
        lines.append("checkpoint: none saved (--save-final false and no --save-every step)")
    else:
        lines.append(f"checkpoint: {model_dir}")
        lines.append("reproduce the held-out figure: "
                     + reproduce_command(args, model_dir, kind, out / "eval" / Path(model_dir).name))
    from train.run_report import takeoff_flags

    flags = takeoff_flags(rows, out / "heldout_answers.jsonl") if trainer == "train.grpo" else []
    for flag in flags:
        lines.append(f"WARNING: did not take off: {flag}")
    lines.append(f"metrics: {out / 'metrics.jsonl'}; every held-out answer: {out / 'heldout_answers.jsonl'}")
    pictures = [f"learning curves: {out / 'curves.png'}"] if (out / "curves.png").is_file() else []
    if (out / "tb").is_dir():
        pictures.append(f"TensorBoard: tensorboard --logdir {out / 'tb'}")
    pictures.append(f"compare runs: python -m train.plot_curves --runs \"{Path(out).name}={out}\" --out {out / 'curves.png'}")
    lines.extend(pictures)
    return "\n".join(lines)
