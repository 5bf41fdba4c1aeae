"""JSONL manifests: the project's record schema (``docs/datasets.md``) and MedBridgeRL's fields (seed 004).

Each line is one record; ``VQARecord.to_dict()`` of any record is a valid line. Accepted field
names (first found wins):

=============  ===========================================================
field          names
=============  ===========================================================
id             ``id``, ``qid``, ``dataset_name`` + ``dataset_index``; else ``<dataset>_<line>``
images         ``image_paths`` (list), ``images`` (list), ``image`` / ``image_path`` (str)
question       ``question``
answer         ``answer``, ``answer_label`` (MCQ letter), ``gt_answer``
options        ``options`` (dict, or list -> A, B, ...), ``options_dict``
answer_type    ``answer_type`` (CLOSED/OPEN/MCQ); inferred when absent
split          ``split`` (``val``/``validation``/``valid``/``validate``/``dev`` are one split)
=============  ===========================================================

plus ``dataset``, ``modality``, ``organ``, ``question_type``, ``annotations`` and ``metadata``;
any other key is kept in ``metadata``. Relative image (and mask) paths resolve against ``root``
(default: the manifest's folder) and are stored absolute. An image path may carry an image
fragment (``scan.dcm#window=40,400``, ``vol.nii.gz#slice=80``), passed through untouched.

Strict: an MCQ needs options and an answer that is one of their letters (an answer given as the
text of exactly one option becomes its letter); ``answer_type: MCQ`` without options, an empty
question or answer, a list of several answers, or a repeated id is an error naming the manifest,
the line and the record.
"""

from __future__ import annotations

import json
import string
import warnings
from pathlib import Path
from typing import Any, Mapping

from medvqa_env.datasets.common import RecordCollector, split_key, split_matches
from medvqa_env.errors import ConfigError, DatasetError
from medvqa_env.records import Annotations, AnswerType, VQADataset, VQARecord, answer_text

_YES_NO = {"yes", "no"}
_IMAGE_KEYS = ("image_paths", "images", "image", "image_path", "image_name")
_ANSWER_KEYS = ("answer", "answer_label", "gt_answer")
_KNOWN = {"id", "qid", "dataset_name", "dataset_index", "question", "options", "options_dict", "answer_type",
          "dataset", "split", "modality", "organ", "question_type", "annotations", "metadata",
          *_IMAGE_KEYS, *_ANSWER_KEYS}


def infer_answer_type(answer: str, options: Mapping[str, str]) -> AnswerType:
    """MCQ if there are options, CLOSED for a yes/no answer, OPEN otherwise."""
    if options:
        return AnswerType.MCQ
    if str(answer).strip().strip(".").lower() in _YES_NO:
        return AnswerType.CLOSED
    return AnswerType.OPEN


def _options(row: Mapping[str, Any]) -> dict[str, str]:
    opts = row.get("options_dict") or row.get("options") or {}
    if isinstance(opts, (list, tuple)):
        if len(opts) > len(string.ascii_uppercase):
            raise DatasetError(f"expected at most 26 options, got {len(opts)}")
        return {string.ascii_uppercase[i]: str(v).strip() for i, v in enumerate(opts)}
    if isinstance(opts, Mapping):
        return {str(k).strip().upper(): str(v).strip() for k, v in opts.items()}
    raise DatasetError(f"options must be a dict or list, got {type(opts).__name__}")


def _images(row: Mapping[str, Any]) -> list[str]:
    for key in _IMAGE_KEYS:
        if key in row and row[key]:
            value = row[key]
            return [value] if isinstance(value, str) else [str(v) for v in value]
    raise DatasetError(f"no image field (one of {list(_IMAGE_KEYS)})")


def mcq_letter(answer: str, options: Mapping[str, str]) -> str:
    """The option letter an MCQ answer names: the letter itself (any case), or the letter of the one
    option whose text equals the answer; anything else is returned unchanged (and then refused by
    the record's check).

    >>> opts = {"A": "CT", "B": "MRI"}
    >>> mcq_letter("b", opts), mcq_letter("mri", opts), mcq_letter("PET", opts)
    ('B', 'B', 'PET')
    """
    key = answer.strip().upper()
    if key in options:
        return key
    hits = [k for k, v in options.items() if v.strip().lower() == answer.strip().lower()]
    return hits[0] if len(hits) == 1 else answer


def _record_id(row: Mapping[str, Any], dataset: str, line: int) -> str:
    if row.get("id") not in (None, "") or row.get("qid") not in (None, ""):
        return str(row["id"] if row.get("id") not in (None, "") else row["qid"])
    if "dataset_index" in row:
        return f"{row.get('dataset_name', dataset)}_{row['dataset_index']}"
    return f"{dataset}_{line}"


def record_from_row(row: Mapping[str, Any], *, line: int, dataset: str, split: str, root: Path,
                    unit: str = "line") -> VQARecord:
    """Map one manifest row to a record; every problem names the ``unit`` (``line 7``, ``row 6``)
    and the record."""
    rid = None
    try:
        rid = _record_id(row, dataset, line)
        options = _options(row)
        raw = row.get("answer_label") if options and row.get("answer_label") else next(
            (row[k] for k in ("answer", "gt_answer") if row.get(k) is not None), None)
        if raw is None:
            raise DatasetError(f"no answer field (one of {list(_ANSWER_KEYS)})")
        answer = answer_text(raw)
        if not isinstance(row.get("question"), str):
            raise DatasetError(f"expected a question string, got {row.get('question')!r:.60}" if "question" in row
                               else "no question field")
        answer_type = AnswerType.parse(row["answer_type"]) if row.get("answer_type") else infer_answer_type(answer, options)
        if answer_type is AnswerType.MCQ:
            if not options:
                raise DatasetError("answer_type is MCQ but the row has no options (give options, or answer_type "
                                   "CLOSED/OPEN)")
            answer = mcq_letter(answer, options)
        paths = tuple(str(p if Path(p).is_absolute() else (root / p)) for p in _images(row))
        annotations = Annotations.from_dict(_rooted_masks(row.get("annotations"), root))
        metadata = dict(row.get("metadata") or {})
        metadata.update({k: v for k, v in row.items() if k not in _KNOWN})
        return VQARecord(
            id=rid,
            image_paths=paths,
            question=row["question"],
            answer=answer,
            answer_type=answer_type,
            dataset=str(row.get("dataset", row.get("dataset_name", dataset))),
            split=split_key(row["split"]) if row.get("split") else split,
            options=options if answer_type is AnswerType.MCQ else {},
            modality=row.get("modality"),
            organ=row.get("organ"),
            question_type=row.get("question_type"),
            annotations=annotations,
            metadata=metadata,
        )
    except DatasetError as e:
        msg = str(e)
    except (TypeError, ValueError, KeyError) as e:
        msg = f"{type(e).__name__}: {e}"
    where = f"{unit} {line}" + (f": record {rid!r}" if rid is not None and not msg.startswith(f"record {rid!r}") else "")
    raise DatasetError(f"{where}: {msg}")


def _rooted_masks(annotations: Any, root: Path) -> Any:
    """Mask paths in a row are relative to ``root`` like image paths."""
    if not isinstance(annotations, Mapping) or not annotations.get("masks"):
        return annotations
    masks = [dict(m, path=str(root / m["path"])) if isinstance(m, Mapping) and isinstance(m.get("path"), str)
             and not Path(m["path"]).is_absolute() else m for m in annotations["masks"]]
    return {**annotations, "masks": masks}


def _root(path: Path, root: str | Path | None, image_root: str | Path | None) -> Path:
    if image_root is not None:
        if root is not None and Path(root) != Path(image_root):
            raise ConfigError(f"got both root={str(root)!r} and image_root={str(image_root)!r}; "
                              f"image_root is the old name of root: pass root only")
        warnings.warn("load_jsonl(image_root=...) is deprecated; use root=... like every other loader",
                      DeprecationWarning, stacklevel=3)
        root = image_root
    return (Path(root) if root is not None else path.parent).absolute()


def default_name(rows: list[dict[str, Any]], path: Path) -> str:
    """The dataset name when none is given: the rows' common ``dataset`` (or ``dataset_name``)
    field, else the manifest's folder name (``.../vqa_rad/qa.jsonl`` -> ``vqa_rad``), never the
    file name."""
    names = {str(r.get("dataset", r.get("dataset_name"))) for r in rows if r.get("dataset", r.get("dataset_name"))}
    if len(names) == 1 and len(rows) == sum(1 for r in rows if r.get("dataset", r.get("dataset_name"))):
        return names.pop()
    return path.absolute().parent.name or "jsonl"


def _read_rows(path: Path, out: RecordCollector) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                out.reject(path, f"line {line_no}", f"invalid JSON: {e.msg} (column {e.colno})")
                continue
            if not isinstance(row, dict):
                out.reject(path, f"line {line_no}", f"expected a JSON object, got {type(row).__name__}")
                continue
            rows.append((line_no, row))
    return rows


def load_jsonl(path: str | Path, split: str | None = "test", root: str | Path | None = None,
               dataset: str | None = None, check_images: bool | str = "exists", limit: int | None = None,
               image_root: str | Path | None = None, on_invalid: str = "error") -> VQADataset:
    """Load a JSONL manifest (see the module docstring).

    ``split=None`` keeps every row; otherwise rows whose ``split`` field names another split are
    dropped (rows without one are kept), and a manifest whose rows name splits but none of
    ``split`` is an error listing the splits it has. ``root``: folder relative paths resolve
    against (default: the manifest's folder); ``image_root`` is its deprecated old name.
    ``dataset``: the dataset's name (default: see :func:`default_name`). ``on_invalid``
    (``"error"``/``"skip"``) and ``check_images`` (``"exists"``/``"decode"``/``"none"``, or
    ``True``/``False``): see :mod:`medvqa_env.datasets.common`.
    """
    path = Path(path).absolute()
    if not path.is_file():
        raise DatasetError(f"manifest {str(path)!r} does not exist" + (" (it is a directory)" if path.is_dir() else ""))
    base = _root(path, root, image_root)
    out = RecordCollector("jsonl", on_invalid, check_images, sources=[path], limit=limit)
    rows = _read_rows(path, out)
    out.name = name = dataset or default_name([r for _, r in rows], path)
    wanted = split_key(split) if split is not None else None
    selected = [(n, r) for n, r in rows if wanted is None or not r.get("split") or split_matches(r["split"], wanted)]
    if wanted is not None and rows and not selected:
        have = sorted({split_key(r["split"]) for _, r in rows if r.get("split")})
        raise DatasetError(f"{path}: no row has split {split!r}; the manifest's splits are {have}")
    for line_no, row in selected:
        try:
            record = record_from_row(row, line=line_no, dataset=name, split=wanted or "test", root=base)
        except DatasetError as e:
            where, _, reason = str(e).partition(": ")
            out.reject(path, where, reason, _row_id(row, name, line_no))
            continue
        out.add(record, path, f"line {line_no}")
        if out.full:
            break
    return out.dataset()


def _row_id(row: Mapping[str, Any], dataset: str, line: int) -> str | None:
    try:
        return _record_id(row, dataset, line)
    except Exception:  # noqa: BLE001 -- a row too broken to name
        return None
