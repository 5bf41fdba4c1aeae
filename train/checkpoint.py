"""Atomic checkpoints a killed run can resume from.

A checkpoint is a folder ``<out>/checkpoints/step_<N>/`` holding ``trainable.pt`` (only the
parameters that train: all of them, the top layers, or LoRA adapters), ``optimizer.pt`` and
``state.json`` (step, RNG states, running accuracy, reward-function state, metrics so far). It is
written under a temporary name and renamed into place, then ``latest`` (a one-line file) is
replaced atomically: a kill at any moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(out_dir: str | os.PathLike, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically and keep only the newest ``keep``."""
    root = Path(out_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".step_{step:06d}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(trainable_state(model), tmp / "trainable.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({**state, "step": step}, default=float))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _atomic_write_text(root / "latest", final.name)
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The folder ``latest`` names, or ``None`` when there is no complete checkpoint."""
    root = Path(out_dir) / "checkpoints"
    marker = root / "latest"
    if not marker.is_file():
        return None
    path = root / marker.read_text().strip()
    return path if (path / "state.json").is_file() else None


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Load weights (and optimizer, RNG) saved by :func:`save_checkpoint`; returns ``state.json``."""
    path = Path(path)
    weights = torch.load(path / "trainable.pt", map_location="cpu")
    params = dict(model.named_parameters())
    missing = [n for n in weights if n not in params]
    if missing:
        raise ValueError(f"expected the checkpoint's parameters in the model, got unknown names {missing[:3]}")
    with torch.no_grad():
        for n, t in weights.items():
            params[n].copy_(t)
    if optimizer is not None and (path / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu"))
    if restore_rng and (path / "rng.pt").is_file():
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return json.loads((path / "state.json").read_text())
