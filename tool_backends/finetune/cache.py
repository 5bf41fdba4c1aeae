"""Trained tool folders built on first use and cached, like the embedded dataset's files.

``trained_folder("ground")`` returns the folder of a grounder trained on the embedded train
split, training it first if no process has yet. Cache: ``$MEDVQA_CACHE/tools``, else
``~/.cache/medvqa-gym/tools``; one folder per (tool, dataset, split, options, steps, seed,
recipe version), named by a hash of them. A build trains on one torch thread (the same weights
whatever the machine's core count; the other cores stay with the processes waiting for it),
holds an exclusive lock file (processes that race on the same folder wait for the first and then
load its result), trains under a temporary name and renames the finished folder into place, so a
folder that exists is complete.
"""

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


def cache_key(kind: str, dataset: str, split: str, dataset_options: Mapping[str, Any], val_options: Mapping[str, Any],
              steps: int | None, seed: int) -> str:
    """The folder name: readable parts and a hash of everything that changes the result.

    >>> cache_key("ground", "embedded", "train", {}, {"n": 400}, None, 0)[:28]
    'ground-embedded-train-seed0-'
    """
    what = {"kind": kind, "recipe": RECIPE_VERSION[kind], "dataset": dataset, "split": split,
            "dataset_options": dict(dataset_options), "val_options": dict(val_options), "steps": steps, "seed": seed}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9_.]+", "_", Path(dataset).name)[:40]
    return f"{kind}-{slug}-{split}-seed{seed}-{digest}"


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
                   steps: int | None = None, seed: int = 0, device: str = "cpu", root: str | Path | None = None) -> Path:
    """The cached folder of tool ``kind`` trained on ``dataset``'s ``split``; trains it first when
    missing (logging that it does, and how long it took)."""
    from tool_backends.finetune import finetune

    defaults = DATASET_DEFAULTS.get(dataset, {})
    dataset_options = dict(dataset_options if dataset_options is not None else defaults.get("dataset_options", {}))
    val_options = dict(val_options if val_options is not None else defaults.get("val_options", dataset_options))
    base = Path(root) if root else cache_root()
    folder = base / cache_key(kind, dataset, split, dataset_options, val_options, steps, seed)
    if is_complete(folder):
        return folder
    base.mkdir(parents=True, exist_ok=True)
    with file_lock(base / f".{folder.name}.lock"):
        if is_complete(folder):  # another process built it while this one waited
            log.info("trained %s tool: using %s, built by another process", kind, folder)
            return folder
        log.warning("trained %s tool: none cached at %s; training it now on %s/%s (first use only; a few CPU "
                    "minutes)", kind, folder, dataset, split)
        t0 = time.perf_counter()
        args = FinetuneArgs(out=str(folder), dataset=dataset, split=split, dataset_opt=dataset_options,  # type: ignore[arg-type]
                            val_opt=val_options, steps=steps, seed=seed, device=device,  # type: ignore[arg-type]
                            torch_threads=1)
        info = finetune(kind, args)
        log.warning("trained %s tool: trained in %.0f s (%.0f CPU s), cached at %s", kind, time.perf_counter() - t0,
                    info.get("train_cpu_seconds") or 0.0, folder)
    return folder
