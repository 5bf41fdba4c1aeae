"""VQA-RAD (Lau et al. 2018), from its distributed JSON (``trainset.json`` / ``testset.json`` as
split by MEVF, with ``images/``) or from a ``qa.jsonl`` manifest.

``root`` defaults to ``$MEDVQA_VQA_RAD`` or ``../shared/data/vqa_rad`` relative to the working
directory at load time (record paths are stored absolute). All VQA-RAD images are radiographs, CTs or MRIs; ``organ`` is HEAD, CHEST or ABD.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from medvqa_env.datasets.common import RecordCollector, canonical_split, json_error
from medvqa_env.datasets.jsonl import infer_answer_type
from medvqa_env.errors import DatasetError
from medvqa_env.records import AnswerType, VQADataset, VQARecord

SPLIT_FILES = {"train": "trainset.json", "test": "testset.json"}


def default_root() -> Path:
    return Path(os.environ.get("MEDVQA_VQA_RAD", "../shared/data/vqa_rad"))


def load_vqa_rad(split: str = "test", root: str | Path | None = None, limit: int | None = None,
                 answer_types: tuple[str, ...] | None = None, on_invalid: str = "error",
                 check_images: bool | str = "exists") -> VQADataset:
    """Load a VQA-RAD split (``train``, ``test``). ``on_invalid`` (``"error"``/``"skip"``) and
    ``check_images`` (``"exists"``/``"decode"``/``"none"``): see :mod:`medvqa_env.datasets.common`."""
    root = Path(os.path.abspath(root or default_root()))
    split = canonical_split(split, tuple(SPLIT_FILES), "VQA-RAD")
    candidates = [root / "source" / SPLIT_FILES[split], root / SPLIT_FILES[split]]
    manifest = next((p for p in candidates if p.is_file()), None)
    if manifest is None:
        raise DatasetError(f"VQA-RAD {split} file not found; looked for {[str(c) for c in candidates]}")
    image_dir = root / "images"
    try:
        rows = json.loads(manifest.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise json_error(manifest, e) from None
    if not isinstance(rows, list):
        raise DatasetError(f"{manifest}: expected a JSON list of questions, got {type(rows).__name__}")
    out = RecordCollector("vqa_rad", on_invalid, check_images, sources=[manifest], limit=limit)
    wanted = {AnswerType.parse(t) for t in answer_types} if answer_types else None
    for i, row in enumerate(rows):
        rid = None
        try:
            rid = f"vqarad_{split}_{row['qid']}"
            answer = str(row["answer"]).strip()
            kind = AnswerType.parse(row["answer_type"]) if row.get("answer_type") else infer_answer_type(answer, {})
            if wanted and kind not in wanted:
                continue
            record = VQARecord(
                id=rid,
                image_paths=(str(image_dir / row["image_name"]),),
                question=str(row["question"]).strip(),
                answer=answer,
                answer_type=kind,
                dataset="vqa_rad",
                split=split,
                modality=None,
                organ=str(row.get("image_organ", "")).strip().upper() or None,
                question_type=row.get("question_type"),
                metadata={"phrase_type": row.get("phrase_type"), "source_qid": row["qid"]},
            )
        except DatasetError as e:
            out.reject(manifest, f"entry {i}", str(e), rid)
            continue
        except (KeyError, TypeError, ValueError) as e:
            out.reject(manifest, f"entry {i}", f"{type(e).__name__}: {e}", rid)
            continue
        out.add(record, manifest, f"entry {i}")
        if out.full:
            break
    return out.dataset()
