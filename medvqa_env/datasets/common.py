"""Small helpers shared by the dataset loaders: where the data is, split names, image checks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from medvqa_env.errors import DatasetError

SPLIT_ALIASES = {"validation": "val", "validate": "val", "valid": "val", "dev": "val",
                 "training": "train", "testing": "test"}
"""Other names of the canonical splits (``train``, ``val``, ``test``); matched case-insensitively."""


def local_root(root: str | Path | None, env: str, name: str) -> Path:
    """The dataset folder the user named (``root``, else ``$env``), absolute; never a download."""
    value = root or os.environ.get(env)
    if not value:
        raise DatasetError(f"{name}: no root given; pass root=... or set ${env}")
    path = Path(os.path.abspath(value))
    if not path.is_dir():
        raise DatasetError(f"{name}: root {str(path)!r} is not a folder")
    return path


def split_key(split: str) -> str:
    """The canonical name of ``split``: aliases folded, case ignored, other names kept.

    >>> split_key("Validation"), split_key("dev"), split_key("test_2")
    ('val', 'val', 'test_2')
    """
    key = str(split).strip().lower()
    return SPLIT_ALIASES.get(key, key)


def split_matches(value: object, split: str) -> bool:
    """Whether a row's ``split`` field names ``split`` (aliases count as the same split).

    >>> split_matches("validation", "val"), split_matches("VAL", "dev"), split_matches("train", "test")
    (True, True, False)
    """
    return split_key(str(value)) == split_key(split)


def split_names(split: str) -> list[str]:
    """Every spelling of ``split`` a published layout may use for its file or folder.

    >>> split_names("val")
    ['val', 'validation', 'validate', 'valid', 'dev']
    """
    key = split_key(split)
    return [key] + [alias for alias, canonical in SPLIT_ALIASES.items() if canonical == key]


def canonical_split(split: str, known: tuple[str, ...], name: str) -> str:
    """``validation``/``validate``/``valid``/``dev`` -> ``val``; anything unknown is an error.

    >>> canonical_split("validation", ("train", "val", "test"), "X")
    'val'
    """
    key = split_key(split)
    if key not in known:
        raise DatasetError(f"{name} splits are {sorted(known)}, got {split!r}")
    return key


def image_problem(ref: str) -> str | None:
    """Why image ``ref`` cannot be read (``"does not exist"``, ``"is a directory, not an image
    file"``, a bad ``#slice=...`` fragment), or ``None`` when it names a file."""
    from medvqa_env.images import split_image_ref  # the one parser of image fragments (``ct.dcm#window=...``)

    try:
        path = split_image_ref(ref)[0]
    except ValueError as e:
        return f"has a bad fragment: {e}"
    if os.path.isfile(path):
        return None
    return "is a directory, not an image file" if os.path.isdir(path) else "does not exist"


def check_image_files(records: Iterable, where: str) -> None:
    """Fail early, naming the source, the record and the file, if an image is not a file."""
    for r in records:
        for p in r.image_paths:
            problem = image_problem(p)
            if problem:
                raise DatasetError(f"{where}: record {r.id!r}: image {p!r} {problem}")
