"""Checkpoints a user can evaluate and a killed run can resume from.

A checkpoint is a folder ``<out>/checkpoints/step_<N>/`` that is an ordinary Hugging Face model
folder -- ``model.safetensors`` + ``config.json`` (or, under LoRA, a PEFT adapter folder:
``adapter_model.safetensors`` + ``adapter_config.json`` naming its base), the tokenizer and image
processor, and ``medvqa_run.json`` (the system prompt actually shown, the env settings and chat
rendering it was trained with -- :func:`trained_settings` -- and the resolved run config) -- so
``eval.run --agent vlm --agent-opt model=<out>/checkpoints/step_<N>`` loads it as it is. Beside
the model, ``trainer_state/`` holds what resuming needs: ``optimizer.pt`` (tensors only, read with
``weights_only=True``), ``rng.json`` and ``state.json`` (step, running accuracy, reward-function
state, wall time). Nothing in a checkpoint is executable: a resumed run never unpickles arbitrary
objects, so a crafted checkpoint folder cannot run code (an older run's ``rng.pt`` is read with
``weights_only=True`` and numpy arrays allowed, nothing else).

The folder is written under a temporary name and renamed into place, then ``latest`` (a one-line
file) is replaced atomically: a kill at any moment leaves the previous checkpoint intact. Only the
newest ``keep`` checkpoints stay (``keep=0`` keeps all).
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

RUN_FILE = "medvqa_run.json"
STATE_DIR = "trainer_state"


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step of a checkpoint folder ``.../step_000010``.

    >>> checkpoint_step("runs/x/checkpoints/step_000010")
    10
    """
    return int(Path(path).name.rsplit("_", 1)[-1])


def trained_settings(encoder: Any, pool: Any, index: int = 0, max_new_tokens: int | None = None) -> dict[str, Any]:
    """What ``medvqa_run.json`` records so ``eval.run`` can run the model as it was trained: the
    system prompt actually shown (the override, else the env's own text, taken from a reset of
    ``pool``'s first slot on record ``index``) and where it came from, the env settings (tool
    turns, tools, answer protocol, observation style), how the trainer's encoder rendered the
    chat (plain ChatML, images shrunk to ``max_image_side``, text models' ``image_token``), and how
    its held-out evaluation decoded (``generation``: greedy, ``max_new_tokens`` per turn) -- the
    decoding ``eval.run`` uses by default, so it reproduces the trainer's held-out figures."""
    _, info = pool.reset([(0, {"index": int(index)})])[0]
    env = dict(pool.spec.env_kwargs)
    override = getattr(encoder, "system_prompt", None)
    return {
        "system_prompt": override if override is not None else info["system_prompt"],
        "system_prompt_source": "override" if override is not None else "env",
        "env": {"max_turns": env.get("max_turns", 3), "tools": env.get("tools"),
                "answer_protocol": env.get("answer_protocol", "boxed"),
                "observation_style": env.get("observation_style", "observation_tag")},
        "encoder": {"chat_format": "chatml", "max_image_side": getattr(encoder, "max_image_side", None),
                    "image_token": getattr(encoder, "image_token", None)},
        "generation": {"do_sample": False, "temperature": 0.0,
                       **({"max_new_tokens": int(max_new_tokens)} if max_new_tokens else {})},
    }


def record_settings(out_dir: str | os.PathLike, record: dict[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """Put :func:`trained_settings` (the prompt actually shown, env and encoder settings, held-out
    decoding) and the tools' identities (:func:`tool_backends.identity.describe_tools`, now that the
    env has built them) into the run record's ``resolved`` block and rewrite ``<out>/args.json``: the
    record never says ``system_prompt: null`` for a run that showed the env's prompt."""
    record["resolved"].update({k: settings[k] for k in ("system_prompt", "system_prompt_source", "env", "encoder",
                                                        "generation") if k in settings})
    if record["resolved"].get("tools") is not None:  # the env has built its trained tools by now: their hashes
        from tool_backends.identity import describe_tools

        record["resolved"]["tool_identity"] = describe_tools(record["resolved"]["tools"])
    _atomic_write_text(Path(out_dir) / "args.json", json.dumps(record, indent=1, default=str) + "\n")
    return record


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def rng_state_to_json(state: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`rng_state` as JSON-able data (no pickle): numbers, lists, base64 tensor bytes."""
    version, internal, gauss = state["python"]
    name, keys, pos, has_gauss, cached = state["numpy"]
    out = {"python": [version, list(internal), gauss],
           "numpy": [str(name), np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
           "torch": _tensor_b64(state["torch"])}
    if "cuda" in state:
        out["cuda"] = [_tensor_b64(t) for t in state["cuda"]]
    return out


def rng_state_from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`rng_state_to_json`; ``ValueError`` when ``data`` is not such a state."""
    try:
        version, internal, gauss = data["python"]
        name, keys, pos, has_gauss, cached = data["numpy"]
        state = {"python": (int(version), tuple(int(v) for v in internal), None if gauss is None else float(gauss)),
                 "numpy": (str(name), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)),
                 "torch": _tensor_from_b64(data["torch"])}
        if "cuda" in data:
            state["cuda"] = [_tensor_from_b64(t) for t in data["cuda"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"expected an RNG state written by save_checkpoint, got {type(e).__name__}: {e}") from None
    return state


def _tensor_b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().astype(np.uint8).tobytes()).decode("ascii")


def _tensor_from_b64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8).clone()


def load_rng_state(state_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The RNG state saved in a checkpoint's ``trainer_state/``: ``rng.json``, or an older run's
    ``rng.pt`` read with ``weights_only=True`` (numpy arrays allowed, nothing else: a pickle that
    would run code is refused with ``ValueError`` before anything in it runs); ``None`` if neither."""
    state_dir = Path(state_dir)
    if (state_dir / "rng.json").is_file():
        return rng_state_from_json(json.loads((state_dir / "rng.json").read_text()))
    legacy = state_dir / "rng.pt"
    if not legacy.is_file():
        return None
    allowed = [np.ndarray, np.dtype, np.dtypes.UInt32DType]
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    allowed.append(_reconstruct)
    try:
        with torch.serialization.safe_globals(allowed):
            return dict(torch.load(legacy, weights_only=True, map_location="cpu"))
    except Exception as e:  # torch's UnpicklingError names the global it refused
        raise ValueError(f"{legacy} is not a plain RNG state (refused, nothing in it was run): "
                         f"{str(e).strip().splitlines()[-1][:300]}") from None


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def is_adapter(model: torch.nn.Module) -> bool:
    """A PEFT (LoRA) model: its saves are adapter folders."""
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def save_model_folder(model: torch.nn.Module, encoder: Any, path: str | os.PathLike,
                      run_info: Mapping[str, Any] | None = None, merge: bool = False) -> Path:
    """Write ``model`` as an HF folder ``path`` (safetensors), with the tokenizer/processor of
    ``encoder`` and ``medvqa_run.json``. Under LoRA: the adapter folder (its
    ``base_model_name_or_path`` is ``run_info["base_model"]``), or the merged model with ``merge``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    info = dict(run_info or {})
    if is_adapter(model) and merge:
        model = model.merge_and_unload()
    if is_adapter(model):
        base = info.get("base_model")
        if base:
            for cfg in model.peft_config.values():
                cfg.base_model_name_or_path = str(base)
        model.save_pretrained(str(path))
    elif hasattr(model, "save_pretrained"):
        model.save_pretrained(str(path))
    else:  # a plain torch module (tests): its state dict as safetensors
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
                  str(path / "model.safetensors"))
    if encoder is not None:
        encoder.save_pretrained(str(path))
    if encoder is not None and "system_prompt" not in info:
        info["system_prompt"] = getattr(encoder, "system_prompt", None)
    (path / RUN_FILE).write_text(json.dumps(info, indent=1, default=str) + "\n")
    return path


def save_checkpoint(out_dir: str | os.PathLike, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], keep: int = 2, encoder: Any = None,
                    run_info: Mapping[str, Any] | None = None) -> Path:
    """Write checkpoint ``step`` atomically and keep only the newest ``keep`` (0 = all)."""
    root = Path(out_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".step_{step:06d}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model_folder(model, encoder, tmp, {**dict(run_info or {}), "step": step})
    (tmp / STATE_DIR).mkdir()
    torch.save(optimizer.state_dict(), tmp / STATE_DIR / "optimizer.pt")
    (tmp / STATE_DIR / "rng.json").write_text(json.dumps(rng_state_to_json(rng_state())))
    (tmp / STATE_DIR / "state.json").write_text(json.dumps({**state, "step": step}, default=float))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _atomic_write_text(root / "latest", final.name)
    if keep > 0:
        for old in list_checkpoints(out_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(out_dir) / "checkpoints"
    return sorted(p for p in root.glob("step_*") if (p / STATE_DIR / "state.json").is_file())


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The folder ``latest`` names, or ``None`` when there is no complete checkpoint."""
    root = Path(out_dir) / "checkpoints"
    marker = root / "latest"
    if not marker.is_file():
        return None
    path = root / marker.read_text().strip()
    return path if (path / STATE_DIR / "state.json").is_file() else None


def load_weights(path: Path, model: torch.nn.Module) -> None:
    """Put the weights saved in ``path`` into ``model`` (the same architecture, built as the run
    builds it): adapter weights under LoRA, else the whole model, loaded by transformers (which
    maps its on-disk names to the module's) and copied in."""
    if is_adapter(model):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(model, load_file(str(path / "adapter_model.safetensors")))
        return
    if hasattr(model, "save_pretrained") and (path / "config.json").is_file():
        loaded = type(model).from_pretrained(str(path), dtype=next(model.parameters()).dtype)
        source = loaded.state_dict()
    else:
        from safetensors.torch import load_file

        source = load_file(str(path / "model.safetensors"))
    result = model.load_state_dict(source, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"expected the checkpoint's parameters in the model, got unknown names "
                         f"{result.unexpected_keys[:3]}")


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Load weights (and optimizer, RNG) saved by :func:`save_checkpoint`; returns ``state.json``."""
    path = Path(path)
    with torch.no_grad():
        load_weights(path, model)
    state_dir = path / STATE_DIR
    if optimizer is not None and (state_dir / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(state_dir / "optimizer.pt", map_location="cpu", weights_only=True))
    if restore_rng:
        state = load_rng_state(state_dir)
        if state is not None:
            set_rng_state(state)
    return json.loads((state_dir / "state.json").read_text())


POLICY_FIELDS = ("kind", "base_model", "system_prompt", "env", "encoder", "generation")
"""The fields of :data:`RUN_FILE` that make the checkpoint the policy it is at evaluation (what
``eval.run`` reads to evaluate it as trained), beside its files."""


def policy_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of what a checkpoint *is* as a policy, the same wherever, whenever and by whichever
    commit it was written: every file of the model folder (weights, config, tokenizer, image
    processor) except ``trainer_state/`` (resuming only: optimizer, RNG, wall time), the settings
    it is evaluated with (:data:`POLICY_FIELDS` of :data:`RUN_FILE`) and the content hash of each
    trained tool it was trained with. The run record in :data:`RUN_FILE` (arguments, commit,
    machine) stays out: it says how the policy was made, recorded beside it. A plain
    :func:`~medvqa_env.provenance.content_sha256` of the folder moves with the trainer's wall time,
    so a bit-identical rerun could never match it."""
    import hashlib

    from medvqa_env.provenance import content_sha256

    folder = Path(path)
    h = hashlib.sha256(content_sha256(folder, exclude=(RUN_FILE, STATE_DIR)).encode())
    run_file = folder / RUN_FILE
    if run_file.is_file():
        info = json.loads(run_file.read_text())
        tools = ((info.get("resolved") or {}).get("tool_identity") or {}).items()
        policy = {**{k: info.get(k) for k in POLICY_FIELDS},
                  "tool_hashes": {name: (d or {}).get("content_hash") for name, d in sorted(tools)}}
        h.update(json.dumps(policy, sort_keys=True, default=str).encode())
    return h.hexdigest()
