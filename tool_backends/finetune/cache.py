"""Trained tool folders built on first use and cached, like the embedded dataset's files.

``trained_folder("ground")`` returns the folder of a grounder trained on the embedded train
split, building it first if no process has yet. Cache: ``$MEDVQA_CACHE/tools``, else
``~/.cache/medvqa-gym/tools``; one folder per build identity
(:func:`tool_backends.finetune.manifest.build_identity`: the resolved recipe, dataset, split,
options and a hash of their records, seed, code version, torch version, thread count and
device), named by a hash of it, so a change to any of them builds a new folder instead of
silently reusing a stale one. A build trains on one torch thread (the same weights on every run
on one machine; the other cores stay with the processes waiting for it), holds an exclusive lock
file (processes that race on the same folder wait for the first and then load its result), trains
under a temporary name and renames the finished folder into place, so a folder that exists is
complete. A build says so on stderr in one sentence (with the command that builds the tool
ahead) and shows the build's progress bar."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from tool_backends.finetune.common import TOOL_INFO, FinetuneArgs

log = logging.getLogger(__name__)

RECIPE_VERSION = {"ground": 1, "segment": 2, "classify": 1}
"""Bump a kind's number when its training changes: cached folders of the old recipe are then ignored."""
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {"embedded": {"dataset_options": {"n": 3200}, "val_options": {"n": 400}}}
"""Per-dataset defaults of the ``trained`` engines. Embedded: 3,200 train questions (800 images of
the train split's stream instead of the default 200) and 400 val questions (100 images to choose
a threshold on instead of 25); the test split's images are drawn from another stream."""


def cache_root() -> Path:
    base = os.environ.get("MEDVQA_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "medvqa-gym") / "tools"


def cache_key(identity: Mapping[str, Any]) -> str:
    """The folder name of a build identity (:func:`~tool_backends.finetune.manifest.build_identity`):
    readable parts and a hash of all of it.

    >>> cache_key({"kind": "ground", "dataset": "embedded", "split": "train", "seed": 0, "steps": 3})[:28]
    'ground-embedded-train-seed0-'
    """
    digest = hashlib.sha256(json.dumps(dict(identity), sort_keys=True, default=str).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9_.]+", "_", Path(str(identity["dataset"])).name)[:40]
    return f"{identity['kind']}-{slug}-{identity['split']}-seed{identity['seed']}-{digest}"


def cache_args(kind: str, dataset: str = "embedded", split: str = "train",
               dataset_options: Mapping[str, Any] | None = None, val_options: Mapping[str, Any] | None = None,
               steps: int | None = None, seed: int = 0, device: str = "cpu", root: str | Path | None = None,
               torch_threads: int = 1) -> FinetuneArgs:
    """The :class:`FinetuneArgs` of the cached build of ``kind`` (the ``trained`` engine's options,
    with :data:`DATASET_DEFAULTS`; ``out`` is the cache folder)."""
    from tool_backends.finetune.manifest import build_identity

    defaults = DATASET_DEFAULTS.get(dataset, {})
    dataset_options = dict(dataset_options if dataset_options is not None else defaults.get("dataset_options", {}))
    val_options = dict(val_options if val_options is not None else defaults.get("val_options", dataset_options))
    args = FinetuneArgs(dataset=dataset, split=split, dataset_opt=dataset_options,  # type: ignore[arg-type]
                        val_opt=val_options, steps=steps, seed=seed, device=device,  # type: ignore[arg-type]
                        torch_threads=torch_threads)
    base = Path(root) if root else cache_root()
    args.out = str(base / cache_key(build_identity(kind, args)))
    return args


def is_complete(folder: Path) -> bool:
    return (folder / TOOL_INFO).is_file()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if needed) for the block; where the
    platform has no ``fcntl`` the block runs unlocked (the rename still keeps folders whole)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def trained_folder(kind: str, dataset: str = "embedded", split: str = "train",
                   dataset_options: Mapping[str, Any] | None = None, val_options: Mapping[str, Any] | None = None,
                   steps: int | None = None, seed: int = 0, device: str = "cpu", root: str | Path | None = None,
                   progress: bool = True) -> Path:
    """The cached folder of tool ``kind`` trained on ``dataset``'s ``split``; builds it first when
    missing (saying so on stderr, with the build's progress bar unless ``progress=False``)."""
    import dataclasses

    from tool_backends.finetune import finetune
    from tool_backends.finetune.manifest import quality_line

    args = cache_args(kind, dataset, split, dataset_options, val_options, steps, seed, device, root)
    folder = Path(str(args.out))
    if is_complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(folder.parent / f".{folder.name}.lock"):
        if is_complete(folder):  # another process built it while this one waited
            log.info("trained %s tool: using %s, built by another process", kind, folder)
            return folder
        log.warning("trained %s tool: none built for this recipe yet; training it now on %s/%s into %s (once, a "
                    "few CPU minutes; to build it ahead: `%s`, then tools={%r: {'engine': 'trained', 'path': DIR}})",
                    kind, dataset, split, folder, build_command(kind, args), kind)
        t0 = time.perf_counter()
        info = finetune(kind, dataclasses.replace(args, progress=progress))
        log.warning("trained %s tool: trained in %.0f s (%.0f CPU s), cached at %s; %s", kind,
                    time.perf_counter() - t0, info.get("train_cpu_seconds") or 0.0, folder, quality_line(info))
    return folder


def build_command(kind: str, args: FinetuneArgs, out: str = "DIR") -> str:
    """The ``medvqa-tools build`` command line that builds what ``args`` describe into ``out``.

    >>> build_command("ground", FinetuneArgs(dataset_opt={"n": 48}, steps=2))
    'medvqa-tools build ground --out DIR --dataset-opt n=48 --steps 2'
    """
    parts = ["medvqa-tools", "build", kind, "--out", out]
    if args.dataset != "embedded":
        parts += ["--dataset", str(args.dataset)]
    if args.split != "train":
        parts += ["--split", str(args.split)]
    for flag, opts in (("--dataset-opt", args.dataset_opt), ("--val-opt", args.val_opt)):
        items = opts.items() if isinstance(opts, Mapping) else (o.partition("=")[::2] for o in opts)
        parts += [p for k, v in items for p in (flag, f"{k}={json.dumps(v) if not isinstance(v, str) else v}")]
    for flag, value, default in (("--steps", args.steps, None), ("--seed", args.seed, 0), ("--device", args.device, "cpu")):
        if value != default:
            parts += [flag, str(value)]
    return " ".join(parts)
