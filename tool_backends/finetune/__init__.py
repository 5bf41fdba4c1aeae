"""Train a tool's model on a dataset's annotations: ``python -m tool_backends.finetune KIND``.

``ground`` trains the ``centernet`` grounder on boxes (and mask extents), ``segment`` a SAM on
masks from box prompts, ``classify`` a CLIP on image-level labels. Each writes a folder that a config names
by path (``tools={"ground": {"engine": "trained", "path": DIR}}``; the kind's own engine loads it
too: ``{"engine": "centernet", "model": DIR}``), with ``medvqa_tool.json`` saying what it was
trained on, how, and how well it did on validation data, and the folder's content hash
(:mod:`tool_backends.finetune.manifest`). ``medvqa-tools build KIND --out DIR`` is the same
command. The ``trained`` engines without ``path`` (:mod:`tool_backends.finetune.cache`) run the
same build on first use and cache the folder.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from medvqa_env.errors import ConfigError
from tool_backends.finetune.common import KINDS, TOOL_INFO, FinetuneArgs, write_info
from tool_backends.finetune.manifest import build_identity, content_hash, quality_line

TRAINERS = {"ground": "tool_backends.finetune.ground:train_ground",
            "segment": "tool_backends.finetune.segment:train_segment",
            "classify": "tool_backends.finetune.classify:train_classify"}
ENGINE_OF = {"ground": "centernet", "segment": "sam", "classify": "clip"}
"""The engine that loads each kind's folder by path."""


def finetune(kind: str, args: FinetuneArgs) -> dict[str, Any]:
    """Train tool ``kind`` as ``args`` say and write ``args.out``; its provenance dict.

    The folder is written under a temporary name beside ``args.out`` and renamed into place, so
    ``args.out`` is either the previous complete folder or the new one. An existing ``args.out``
    that is not a trained tool folder (no ``medvqa_tool.json``) is never replaced.
    """
    import importlib

    from medvqa_env.errors import unknown_name_message

    if kind not in TRAINERS:
        raise ConfigError(unknown_name_message("tool kind", kind, KINDS))
    if not args.out:
        args = dataclasses.replace(args, out=f"runs/tools/{kind}")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / TOOL_INFO).is_file())):
        raise ConfigError(f"--out {str(out)!r} exists and is not a trained tool folder; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    module, _, name = TRAINERS[kind].partition(":")
    train = getattr(importlib.import_module(module), name)
    identity = build_identity(kind, args)  # before training: a dataset that does not load fails now
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        info = train(args, str(tmp))
        info["build"] = identity
        info["held_out"] = quality_line(info)
        info["build_cpu_seconds"] = round(time.process_time() - cpu0, 2)  # data, training, validation, saving
        info["build_wall_seconds"] = round(time.perf_counter() - wall0, 2)
        info["content_hash"] = content_hash(tmp, info)
        write_info(tmp, info)
        replace_folder(tmp, out)
        info["out"] = str(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info


def replace_folder(new: Path, target: Path) -> None:
    """Put folder ``new`` at ``target`` (an existing ``target`` is moved aside, then removed)."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
