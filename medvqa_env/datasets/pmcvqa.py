"""PMC-VQA (Zhang et al., 2023) from its published layout::

    <root>/train.csv  test.csv  train_2.csv  test_2.csv  test_clean.csv
    <root>/images/<Figure_path>          (or figures/, images_2/, or next to the CSV)

Columns: ``Figure_path``, ``Question``, ``Answer``, ``Choice A`` .. ``Choice D`` (values like
``"A:CT"`` or ``" A: CT "``), ``Answer_label`` (the letter). Every record is MCQ: ``options``
maps the letters to the choice text with the ``"A:"`` prefix removed, ``answer`` is the letter.

``split`` names the CSV without ``.csv`` (``train``, ``test``, ``train_2``, ``test_2``,
``test_clean``). ``root`` defaults to ``$MEDVQA_PMCVQA``.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from medvqa_env.datasets.common import RecordCollector, local_root
from medvqa_env.errors import DatasetError
from medvqa_env.records import AnswerType, VQADataset, VQARecord

SPLITS = ("train", "test", "train_2", "test_2", "test_clean")
IMAGE_FOLDERS = ("images", "figures", "images_2", "")
LETTERS = "ABCD"
_PREFIX = re.compile(r"^\s*\(?([A-Da-d])\s*[:.)]\s*")
REQUIRED = ("Figure_path", "Question", "Choice A", "Choice B")


def strip_choice(value: str, letter: str) -> str:
    """``"A:CT"`` -> ``"CT"``; a value without its letter prefix is kept as is.

    >>> strip_choice(" B: Magnetic resonance ", "B"), strip_choice("CT scan", "A")
    ('Magnetic resonance', 'CT scan')
    """
    m = _PREFIX.match(value)
    if m and m.group(1).upper() == letter:
        return value[m.end():].strip()
    return value.strip()


def _letter(row: dict[str, str], options: dict[str, str]) -> str:
    label = (row.get("Answer_label") or "").strip().upper()
    if label in options:
        return label
    answer = (row.get("Answer") or "").strip()
    m = _PREFIX.match(answer)
    if m and m.group(1).upper() in options:
        return m.group(1).upper()
    for letter, text in options.items():
        if answer and answer.lower() == text.lower():
            return letter
    raise DatasetError(f"no answer letter: Answer_label={row.get('Answer_label')!r}, Answer={answer!r:.60}")


def _image_dir(root: Path, rel: str) -> Path:
    for folder in IMAGE_FOLDERS:
        if (root / folder / rel).is_file():
            return root / folder
    return root / "images"


def load_pmcvqa(split: str = "test", root: str | Path | None = None, limit: int | None = None,
                image_dir: str | Path | None = None, on_invalid: str = "error",
                check_images: bool | str = "exists") -> VQADataset:
    """Load one PMC-VQA CSV as MCQ records. ``image_dir`` overrides where figures are looked up.
    ``on_invalid`` (``"error"``/``"skip"``) and ``check_images`` (``"exists"``/``"decode"``/``"none"``):
    see :mod:`medvqa_env.datasets.common`."""
    root = local_root(root, "MEDVQA_PMCVQA", "PMC-VQA")
    key = str(split)
    manifest = root / f"{key}.csv"
    if not manifest.is_file():
        have = sorted(p.stem for p in root.glob("*.csv"))
        raise DatasetError(f"PMC-VQA split {split!r} not found: no {str(manifest)!r}; CSVs in root: {have} "
                           f"(published: {list(SPLITS)})")
    out = RecordCollector("pmcvqa", on_invalid, check_images, sources=[manifest], limit=limit)
    folder: Path | None = Path(image_dir) if image_dir else None
    try:
        with manifest.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise DatasetError(f"{manifest}: missing column(s) {missing}; have {reader.fieldnames}")
            for index, row in enumerate(reader):
                line = reader.line_num
                rid = f"pmcvqa_{key}_{index}"
                try:
                    options = {L: strip_choice(row[f"Choice {L}"], L) for L in LETTERS
                               if (row.get(f"Choice {L}") or "").strip()}
                    rel = (row["Figure_path"] or "").strip()
                    if not rel:
                        raise DatasetError("empty Figure_path")
                    if folder is None:
                        folder = _image_dir(root, rel)
                    record = VQARecord(
                        id=rid,
                        image_paths=(str(folder / rel),),
                        question=(row["Question"] or "").strip(),
                        answer=_letter(row, options),
                        answer_type=AnswerType.MCQ,
                        dataset="pmcvqa",
                        split=key,
                        options=options,
                        metadata={"answer_text": (row.get("Answer") or "").strip(), "figure": rel,
                                  "source_row": index},
                    )
                except DatasetError as e:
                    out.reject(manifest, f"line {line}", str(e), rid)
                    continue
                out.add(record, manifest, f"line {line}")
                if out.full:
                    break
    except csv.Error as e:
        raise DatasetError(f"{manifest}: malformed CSV: {e}") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{manifest}: not UTF-8 text: {e}") from None
    return out.dataset()
