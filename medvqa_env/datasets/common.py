"""Small helpers shared by the loaders of published datasets."""

from __future__ import annotations

import os
from pathlib import Path

from medvqa_env.errors import DatasetError


def local_root(root: str | Path | None, env: str, name: str) -> Path:
    """The dataset folder the user named (``root``, else ``$env``); never a download."""
    value = root or os.environ.get(env)
    if not value:
        raise DatasetError(f"{name}: no root given; pass root=... or set ${env}")
    path = Path(value)
    if not path.is_dir():
        raise DatasetError(f"{name}: root {str(path)!r} is not a folder")
    return path


def canonical_split(split: str, known: tuple[str, ...], name: str) -> str:
    """``validation``/``validate``/``valid``/``dev`` -> ``val``; anything unknown is an error.

    >>> canonical_split("validation", ("train", "val", "test"), "X")
    'val'
    """
    key = {"validate": "val", "validation": "val", "valid": "val", "dev": "val"}.get(str(split), str(split))
    if key not in known:
        raise DatasetError(f"{name} splits are {sorted(known)}, got {split!r}")
    return key
