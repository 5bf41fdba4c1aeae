"""Generic JSONL manifests: the project's own field names and MedBridgeRL's (seed 004).

Each line is one record. Accepted field names (first found wins):

=============  ===========================================================
field          names
=============  ===========================================================
id             ``id``, ``qid``, ``dataset_name`` + ``dataset_index``
images         ``image_paths`` (list), ``images`` (list), ``image`` (str)
question       ``question``
answer         ``answer``, ``answer_label`` (MCQ letter), ``gt_answer``
options        ``options`` (dict, or list -> A, B, ...), ``options_dict``
answer_type    ``answer_type`` (CLOSED/OPEN/MCQ); inferred when absent
=============  ===========================================================

Relative image paths resolve against ``image_root`` (default: the manifest's folder).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any, Mapping

from medvqa_env.errors import DatasetError
from medvqa_env.records import Annotations, AnswerType, VQADataset, VQARecord

_YES_NO = {"yes", "no"}


def infer_answer_type(answer: str, options: Mapping[str, str]) -> AnswerType:
    """MCQ if there are options, CLOSED for a yes/no answer, OPEN otherwise."""
    if options:
        return AnswerType.MCQ
    if str(answer).strip().strip(".").lower() in _YES_NO:
        return AnswerType.CLOSED
    return AnswerType.OPEN


def _options(row: Mapping[str, Any]) -> dict[str, str]:
    opts = row.get("options_dict") or row.get("options") or {}
    if isinstance(opts, list):
        return {string.ascii_uppercase[i]: str(v) for i, v in enumerate(opts)}
    if isinstance(opts, Mapping):
        return {str(k).strip().upper(): str(v) for k, v in opts.items()}
    raise DatasetError(f"options must be a dict or list, got {type(opts).__name__}")


def _images(row: Mapping[str, Any]) -> list[str]:
    for key in ("image_paths", "images", "image", "image_path", "image_name"):
        if key in row and row[key]:
            value = row[key]
            return [value] if isinstance(value, str) else [str(v) for v in value]
    raise DatasetError("no image field (image_paths / images / image)")


def record_from_row(row: Mapping[str, Any], *, line: int, dataset: str, split: str, image_root: Path) -> VQARecord:
    """Map one manifest row to a record; every problem names the line."""
    try:
        if "id" in row or "qid" in row:
            rid = str(row.get("id", row.get("qid")))
        elif "dataset_index" in row:
            rid = f"{row.get('dataset_name', dataset)}_{row['dataset_index']}"
        else:
            rid = f"{dataset}_{line}"
        options = _options(row)
        answer = row.get("answer_label") if options and row.get("answer_label") else row.get("answer", row.get("gt_answer"))
        if answer is None:
            raise DatasetError("no answer field (answer / answer_label)")
        if "question" not in row:
            raise DatasetError("no question field")
        answer_type = AnswerType.parse(row["answer_type"]) if row.get("answer_type") else infer_answer_type(str(answer), options)
        if answer_type is AnswerType.MCQ and not options:
            answer_type = infer_answer_type(str(answer), options)
        paths = tuple(str(p if Path(p).is_absolute() else (image_root / p)) for p in _images(row))
        return VQARecord(
            id=rid,
            image_paths=paths,
            question=str(row["question"]),
            answer=str(answer),
            answer_type=answer_type,
            dataset=str(row.get("dataset", row.get("dataset_name", dataset))),
            split=str(row.get("split", split)),
            options=options if answer_type is AnswerType.MCQ else {},
            modality=row.get("modality"),
            organ=row.get("organ"),
            question_type=row.get("question_type"),
            annotations=Annotations.from_dict(row.get("annotations")),
            metadata={k: v for k, v in row.items() if k in ("phrase_type", "source_qid", "content_type")},
        )
    except DatasetError as e:
        raise DatasetError(f"line {line}: {e}") from None
    except (TypeError, ValueError, KeyError) as e:
        raise DatasetError(f"line {line}: {type(e).__name__}: {e}") from None


def load_jsonl(path: str | Path, split: str | None = "test", image_root: str | Path | None = None,
               dataset: str | None = None, check_images: bool = True, limit: int | None = None) -> VQADataset:
    """Load a JSONL manifest. ``split=None`` keeps every row; otherwise rows whose ``split``
    field differs are dropped (rows without one are kept)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"manifest {str(path)!r} does not exist")
    root = Path(image_root) if image_root else path.parent
    name = dataset or path.stem
    records = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}: line {line_no}: invalid JSON: {e.msg}") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}: line {line_no}: expected a JSON object")
            if split is not None and row.get("split", split) != split:
                continue
            try:
                records.append(record_from_row(row, line=line_no, dataset=name, split=split or "test", image_root=root))
            except DatasetError as e:
                raise DatasetError(f"{path}: {e}") from None
            if limit is not None and len(records) >= limit:
                break
    if check_images:
        check_image_files(records, str(path))
    return VQADataset(records, name=name)


def check_image_files(records, where: str) -> None:
    """Fail early, naming the record and the file, if an image does not exist."""
    for r in records:
        for p in r.image_paths:
            if not Path(p).is_file():
                raise DatasetError(f"{where}: record {r.id!r}: image {p!r} does not exist")
