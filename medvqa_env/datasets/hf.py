"""Hugging Face datasets stored locally: a ``save_to_disk`` folder, or a folder of parquet /
arrow files (a hub snapshot you downloaded yourself). Offline only: nothing is fetched.

* A folder with ``dataset_dict.json`` or ``state.json`` is read with ``datasets.load_from_disk``
  (needs the ``datasets`` package); image features are read as their raw bytes, not re-encoded.
* Otherwise the parquet (``*.parquet``) or arrow (``*.arrow``) files whose name or folder starts
  with the split (``test-00000-of-00001.parquet``, ``data/test/...``) are read with ``pyarrow``.

Images may be stored as ``{"bytes", "path"}`` structs (the HF ``Image`` feature), raw bytes,
PIL images, or paths relative to the dataset folder. Embedded images are written once into a cache
folder under a name derived from the SHA-256 of their bytes (``cache_dir``, else
``$MEDVQA_CACHE/hf``, else ``~/.cache/medvqa-gym/hf``), atomically, so repeated loads and parallel
workers share them.

``columns`` maps record fields to the dataset's column names; by default the first present
column of :data:`DEFAULT_COLUMNS` is used for each field.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from medvqa_env.datasets.common import RecordCollector, split_key, split_names
from medvqa_env.datasets.jsonl import record_from_row
from medvqa_env.errors import DatasetError
from medvqa_env.records import VQADataset

DEFAULT_COLUMNS: dict[str, tuple[str, ...]] = {
    "image": ("image", "images", "img", "image_path", "image_name", "Figure_path", "figure"),
    "question": ("question", "Question", "query", "problem"),
    "answer": ("answer", "Answer", "answers", "gt_answer", "label"),
    "answer_type": ("answer_type", "question_type_closed_open"),
    "options": ("options", "choices", "options_dict"),
    "answer_label": ("answer_label", "Answer_label"),
    "id": ("id", "qid", "question_id"),
    "modality": ("modality", "image_modality"),
    "organ": ("organ", "location", "image_organ"),
    "question_type": ("question_type", "content_type"),
}
_MAGIC = ((b"\x89PNG", ".png"), (b"\xff\xd8", ".jpg"), (b"GIF8", ".gif"), (b"BM", ".bmp"),
          (b"II*\x00", ".tif"), (b"MM\x00*", ".tif"), (b"RIFF", ".webp"))


def default_cache_dir() -> Path:
    base = os.environ.get("MEDVQA_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "medvqa-gym") / "hf"


def image_to_file(value: Any, folder: Path, cache_dir: Path, where: str) -> str:
    """One image cell -> a path on disk (embedded bytes are cached by content hash)."""
    data = None
    if isinstance(value, Mapping):
        if value.get("bytes"):
            data = value["bytes"]
        elif value.get("path"):
            value = value["path"]
        else:
            raise DatasetError(f"{where}: image struct has neither bytes nor path")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    elif hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image
        buf = io.BytesIO()
        value.save(buf, format="PNG")
        data = buf.getvalue()
    if data is None:
        if not isinstance(value, (str, os.PathLike)):
            raise DatasetError(f"{where}: unsupported image value of type {type(value).__name__}")
        p = Path(value)
        return str(p if p.is_absolute() else folder / p)
    data = bytes(data)
    suffix = next((s for magic, s in _MAGIC if data.startswith(magic)), ".img")
    target = cache_dir / f"{hashlib.sha256(data).hexdigest()[:32]}{suffix}"
    if not target.is_file():
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{target.name}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except OSError as e:
            raise DatasetError(f"{where}: cannot write image cache file {str(target)!r}: {e}") from None
    return str(target)


def _pick_columns(names: Iterable[str], columns: Mapping[str, str] | None, where: str) -> dict[str, str]:
    names = list(names)
    chosen: dict[str, str] = {}
    for field, candidates in DEFAULT_COLUMNS.items():
        if columns and field in columns:
            if columns[field] not in names:
                raise DatasetError(f"{where}: column {columns[field]!r} (for {field}) not found; have {names}")
            chosen[field] = columns[field]
            continue
        found = next((c for c in candidates if c in names), None)
        if found:
            chosen[field] = found
    unknown = sorted(set(columns or {}) - set(DEFAULT_COLUMNS))
    if unknown:
        raise DatasetError(f"{where}: unknown record field(s) {unknown} in columns; use {sorted(DEFAULT_COLUMNS)}")
    for field in ("image", "question", "answer"):
        if field not in chosen:
            raise DatasetError(f"{where}: no {field} column (tried {list(DEFAULT_COLUMNS[field])}); have {names}; "
                               f"pass columns={{{field!r}: ...}}")
    return chosen


def _rows_from_disk(folder: Path, split: str) -> tuple[list[dict[str, Any]], str]:
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{folder} was saved with datasets.save_to_disk; `pip install datasets` to read it") from None
    try:
        loaded = datasets.load_from_disk(str(folder))
    except (OSError, ValueError, FileNotFoundError) as e:
        raise DatasetError(f"{folder}: cannot load_from_disk: {e}") from None
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        key = next((k for k in (split, *split_names(split)) if k in loaded), None)
        if key is None:
            raise DatasetError(f"{folder}: no split {split!r}; have {names}")
        loaded, where = loaded[key], f"{folder}/{key}"
    else:
        where = str(folder)
    for name, feature in loaded.features.items():  # raw image bytes, not decoded PIL images
        if isinstance(feature, datasets.Image):
            loaded = loaded.cast_column(name, datasets.Image(decode=False))
    rows = []
    for row in loaded:
        for name, feature in loaded.features.items():
            if isinstance(feature, datasets.ClassLabel) and isinstance(row.get(name), int):
                row[name] = feature.int2str(row[name])
        rows.append(row)
    return rows, where


def _split_files(folder: Path, split: str) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.suffix in (".parquet", ".arrow") and p.is_file())
    if not files:
        raise DatasetError(f"{folder}: no dataset_dict.json, state.json, *.parquet or *.arrow files")
    keys = {split, *split_names(split)}

    def matches(p: Path) -> bool:
        rel = p.relative_to(folder)
        if any(part in keys for part in rel.parts[:-1]):
            return True
        return any(re.match(rf"{re.escape(k)}($|[-.])", p.stem) for k in keys)

    chosen = [p for p in files if matches(p)]
    if not chosen:
        raise DatasetError(f"{folder}: no file for split {split!r}; found {[str(p.relative_to(folder)) for p in files]}")
    return chosen


def _rows_from_files(files: list[Path]) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for p in files:
        try:
            if p.suffix == ".parquet":
                table = pq.read_table(p)
            else:
                with pa.memory_map(str(p)) as source:
                    try:
                        table = pa.ipc.open_stream(source).read_all()
                    except pa.ArrowInvalid:
                        source.seek(0)
                        table = pa.ipc.open_file(source).read_all()
        except (pa.ArrowException, OSError) as e:
            raise DatasetError(f"{p}: cannot read: {e}") from None
        rows.extend(table.to_pylist())
    return rows


def load_hf(path: str | Path, split: str = "test", columns: Mapping[str, str] | None = None,
            cache_dir: str | Path | None = None, dataset: str | None = None, limit: int | None = None,
            check_images: bool | str = "exists", on_invalid: str = "error") -> VQADataset:
    """Load a locally stored HF dataset as records (see the module docstring). ``on_invalid``
    (``"error"``/``"skip"``) and ``check_images`` (``"exists"``/``"decode"``/``"none"``, or
    ``True``/``False``): see :mod:`medvqa_env.datasets.common`."""
    folder = Path(path).absolute()
    if not folder.is_dir():
        raise DatasetError(f"HF dataset folder {str(folder)!r} does not exist (load_hf is offline only)")
    name = dataset or folder.name
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        rows, where = _rows_from_disk(folder, split)
        sources = [where]
    else:
        files = _split_files(folder, split)
        rows, where = _rows_from_files(files), str(files[0].parent)
        sources = [str(p) for p in files]
    if not rows:
        raise DatasetError(f"{where}: split {split!r} is empty")
    cols = _pick_columns(rows[0].keys(), columns, where)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    out = RecordCollector(name, on_invalid, check_images, sources=sources, limit=limit)
    for i, row in enumerate(rows):
        rid = f"{name}_{split}_{row[cols['id']] if 'id' in cols else i}"
        try:
            raw = row[cols["image"]]
            images = raw if isinstance(raw, (list, tuple)) else [raw]
            if not images or any(v is None for v in images):
                raise DatasetError(f"no image in column {cols['image']!r}")
            fields: dict[str, Any] = {
                "id": rid,
                "image_paths": [image_to_file(v, folder, cache, f"{where}: row {i}") for v in images],
                "question": row[cols["question"]],
                "answer": row[cols["answer"]],
            }
            for field in ("answer_type", "options", "answer_label", "modality", "organ", "question_type"):
                if field in cols and row.get(cols[field]) not in (None, ""):
                    fields[field] = row[cols[field]]
            record = record_from_row(fields, line=i, dataset=name, split=split_key(split), root=folder, unit="row")
        except DatasetError as e:
            text = str(e)
            for prefix in (f"{where}: row {i}: ", f"row {i}: "):  # record_from_row and image_to_file name the row
                text = text[len(prefix):] if text.startswith(prefix) else text
            out.reject(where, f"row {i}", text, rid)
            continue
        out.add(record, where, f"row {i}")
        if out.full:
            break
    return out.dataset()
