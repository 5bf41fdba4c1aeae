"""Small helpers shared by the dataset loaders: where the data is, split names, image checks, and
what a loader does with a row it cannot use (:class:`RecordCollector`)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable

from medvqa_env.errors import DatasetError

log = logging.getLogger("medvqa_env.datasets")

ON_INVALID = ("error", "skip")
"""What a loader does with a row it cannot use: ``error`` (the default) raises a
:class:`DatasetError` naming file, line (or entry / row) and record; ``skip`` leaves the row out
and lists it (file, line, id, reason) in the dataset's provenance."""
CHECK_IMAGES = ("exists", "decode", "none")
"""How a loader checks a record's images: ``exists`` (the default: each is a file), ``decode`` (each
is opened and fully decoded like the env will, so an unreadable or undecodable one is found at load,
not at ``reset``), ``none``. ``True``/``False`` mean ``exists``/``none``."""

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


def image_problem(ref: str, decode: bool = False) -> str | None:
    """Why image ``ref`` cannot be read (``"does not exist"``, ``"is a directory, not an image
    file"``, a bad ``#slice=...`` fragment; with ``decode``, why decoding it fails), or ``None``
    when it names a file (that decodes)."""
    from medvqa_env.images import load_image, split_image_ref  # the one parser of image fragments

    try:
        path = split_image_ref(ref)[0]
    except ValueError as e:
        return f"has a bad fragment: {e}"
    if not os.path.isfile(path):
        return "is a directory, not an image file" if os.path.isdir(path) else "does not exist"
    if decode:
        try:
            load_image(ref)
        except DatasetError as e:
            text = str(e)
            prefix = f"image {str(ref)!r}"
            return ("cannot be decoded: " + text[len(prefix):].lstrip(": ")) if text.startswith(prefix) else text
    return None


def check_image_files(records: Iterable, where: str) -> None:
    """Fail early, naming the source, the record and the file, if an image is not a file."""
    for r in records:
        for p in r.image_paths:
            problem = image_problem(p)
            if problem:
                raise DatasetError(f"{where}: record {r.id!r}: image {p!r} {problem}")


def json_error(path: Path | str, error: json.JSONDecodeError, where: str = "") -> DatasetError:
    """A broken JSON document (or JSONL line) as a :class:`DatasetError` keeping line and column.

    >>> try:
    ...     json.loads('[{"a": 1,}]')
    ... except json.JSONDecodeError as e:
    ...     print(json_error("x.json", e))
    x.json: invalid JSON: Expecting property name enclosed in double quotes (line 1, column 10)
    """
    at = f"column {error.colno}" if where else f"line {error.lineno}, column {error.colno}"
    return DatasetError(f"{path}: {where + ': ' if where else ''}invalid JSON: {error.msg} ({at})")


def check_policy(on_invalid: str, check_images: bool | str) -> tuple[str, str]:
    """``(on_invalid, check_images)`` validated, ``True``/``False`` read as ``exists``/``none``.

    >>> check_policy("skip", True), check_policy("error", "decode")
    (('skip', 'exists'), ('error', 'decode'))
    """
    if on_invalid not in ON_INVALID:
        raise DatasetError(f"expected on_invalid in {list(ON_INVALID)}, got {on_invalid!r}")
    images = {True: "exists", False: "none"}.get(check_images, check_images) if isinstance(check_images, bool) \
        else check_images
    if images not in CHECK_IMAGES:
        raise DatasetError(f"expected check_images in {list(CHECK_IMAGES)} (or True/False), got {check_images!r}")
    return on_invalid, images


class RecordCollector:
    """The records a loader keeps, and what it does with a row it cannot use.

    A loader calls :meth:`add` with each record it built (and where it came from: the file and
    ``"line 7"`` / ``"entry 3"`` / ``"row 5"``) and :meth:`reject` with each row it could not build,
    and stops reading once :attr:`full`. ``on_invalid="error"`` raises at the first bad row;
    ``"skip"`` leaves it out and lists it (``source``, ``where``, ``record_id``, ``reason``). Images
    are checked as :data:`CHECK_IMAGES` says: when skipping, as each record comes (so ``limit``
    counts usable records); with ``error``, all at the end, raising for the first unreadable one
    with the count of all. A repeated id is a bad row too (the later one). :meth:`dataset` returns
    the :class:`VQADataset` with its provenance attached
    (:func:`medvqa_env.provenance.dataset_provenance`).
    """

    def __init__(self, name: str, on_invalid: str = "error", check_images: bool | str = "exists",
                 sources: Iterable[str | Path] = (), limit: int | None = None) -> None:
        self.name, self.limit = name, limit
        self.on_invalid, self.check_images = check_policy(on_invalid, check_images)
        self.sources = [str(s) for s in sources]
        self.records: list[Any] = []
        self.wheres: list[tuple[str, str]] = []
        self.skipped: list[dict[str, Any]] = []
        self._first: dict[str, str] = {}  # record id -> where it was first seen
        self._verdicts: dict[str, str | None] = {}  # image -> problem (an image of several questions is checked once)

    @property
    def full(self) -> bool:
        """Whether ``limit`` records are in (the loader stops reading)."""
        return self.limit is not None and len(self.records) >= self.limit

    def add(self, record: Any, source: str | Path, where: str) -> None:
        """Keep ``record`` from row ``where`` of ``source`` (unless its id repeats or, when skipping,
        an image is unreadable)."""
        if record.id in self._first:
            self.reject(source, where, f"duplicate id (first used on {self._first[record.id]})", record.id)
            return
        if self.on_invalid == "skip":
            problem = self._image_problem(record)
            if problem:
                self.reject(source, where, problem, record.id)
                return
        self._first[record.id] = where or str(source)
        self.records.append(record)
        self.wheres.append((str(source), where))

    def reject(self, source: str | Path, where: str, reason: str, record_id: str | None = None) -> None:
        """Row ``where`` (``"line 7"``) of ``source`` is unusable because of ``reason``: raise or skip it."""
        if self.on_invalid == "error":
            rid = f"record {record_id!r}: " if record_id and f"record {record_id!r}" not in reason else ""
            raise DatasetError(f"{source}: {where + ': ' if where else ''}{rid}{reason}")
        self.skipped.append({"source": str(source), "where": where, "record_id": record_id, "reason": reason})

    def dataset(self) -> Any:
        """The kept records as a :class:`VQADataset` with its :class:`DatasetProvenance`."""
        from medvqa_env.provenance import DatasetProvenance, attach_provenance
        from medvqa_env.records import VQADataset

        if self.on_invalid == "error":
            self._raise_for_images()
        if self.skipped:
            first = self.skipped[0]
            log.warning("%s: skipped %d invalid row(s) (on_invalid='skip'); the first: %s %s: %s", self.name,
                        len(self.skipped), first["source"], first["where"], first["reason"])
        dataset = VQADataset(self.records, name=self.name)
        n_bad = sum(1 for v in self._verdicts.values() if v)
        attach_provenance(dataset, DatasetProvenance(
            name=self.name, sources=list(dict.fromkeys(self.sources)), n_records=len(self.records),
            on_invalid=self.on_invalid, check_images=self.check_images, n_images_checked=len(self._verdicts),
            n_images_decoded=len(self._verdicts) - n_bad if self.check_images == "decode" else 0,
            skipped=list(self.skipped)))
        return dataset

    def _image_problem(self, record: Any) -> str | None:
        if self.check_images == "none":
            return None
        for p in record.image_paths:
            if p not in self._verdicts:
                self._verdicts[p] = image_problem(p, decode=self.check_images == "decode")
            if self._verdicts[p]:
                return f"image {p!r} {self._verdicts[p]}"
        return None

    def _raise_for_images(self) -> None:
        bad = [(where, r.id, problem) for r, where in zip(self.records, self.wheres)
               if (problem := self._image_problem(r))]
        if bad:
            (source, where), rid, problem = bad[0]
            more = (f" ({len(bad)} of {len(self.records)} records have an unreadable image; on_invalid='skip' "
                    f"loads the others and lists these)") if len(bad) > 1 else ""
            raise DatasetError(f"{source}: {where + ': ' if where else ''}record {rid!r}: {problem}{more}")
