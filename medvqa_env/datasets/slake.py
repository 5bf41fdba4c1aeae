"""SLAKE (Liu et al., ISBI 2021) from its published layout::

    <root>/train.json  validate.json  test.json        (validation.json is accepted too)
    <root>/imgs/xmlab<N>/source.jpg                     the image
    <root>/imgs/xmlab<N>/mask.png                       semantic mask (optional)
    <root>/imgs/xmlab<N>/detection.json                 [{label: [x, y, w, h]}, ...] (optional)

Each JSON entry has ``img_id``, ``img_name`` (``xmlab102/source.jpg``), ``question``, ``answer``,
``answer_type`` (OPEN/CLOSED), ``q_lang`` (en/zh), ``modality``, ``location``, ``content_type``,
``base_type`` and ``qid``. Only English questions are kept unless ``lang`` says otherwise.

``mask.png`` becomes ``Mask("mask", path)``: SLAKE stores every structure of an image in one
label image (non-zero = some annotated structure) without a per-image legend. Detection boxes
become ``Box(label, (x, y, x + w, y + h))``.

``root`` defaults to ``$MEDVQA_SLAKE``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from medvqa_env.datasets.common import RecordCollector, canonical_split, json_error, local_root
from medvqa_env.datasets.jsonl import infer_answer_type
from medvqa_env.errors import DatasetError
from medvqa_env.records import Annotations, AnswerType, Box, Mask, VQADataset, VQARecord

SPLIT_FILES = {"train": ("train.json",), "val": ("validate.json", "validation.json"), "test": ("test.json",)}


def parse_detection(data: Any, where: str) -> tuple[Box, ...]:
    """SLAKE ``detection.json`` -> boxes. Accepts a list of ``{label: [x, y, w, h]}`` (the
    published form), one such dict, or a label mapped to several boxes.

    >>> parse_detection([{"Liver": [10, 20, 30, 40]}], "x")
    (Box(label='Liver', bbox=(10.0, 20.0, 40.0, 60.0), image_index=0),)
    """
    items = data if isinstance(data, list) else [data]
    boxes = []
    for item in items:
        if not isinstance(item, dict):
            raise DatasetError(f"{where}: expected {{label: [x, y, w, h]}} entries, got {item!r:.80}")
        for label, value in item.items():
            groups = value if value and isinstance(value[0], (list, tuple)) else [value]
            for g in groups:
                if not isinstance(g, (list, tuple)) or len(g) != 4:
                    raise DatasetError(f"{where}: box of {label!r} must be [x, y, w, h], got {g!r:.80}")
                try:
                    x, y, w, h = (float(v) for v in g)
                except (TypeError, ValueError):
                    raise DatasetError(f"{where}: box of {label!r} must hold numbers, got {g!r:.80}") from None
                boxes.append(Box(str(label), (x, y, x + w, y + h)))
    return tuple(boxes)


def _annotations(folder: Path, cache: dict[Path, Annotations]) -> Annotations:
    if folder in cache:
        return cache[folder]
    boxes: tuple[Box, ...] = ()
    det = folder / "detection.json"
    if det.is_file():
        try:
            boxes = parse_detection(json.loads(det.read_text(encoding="utf-8")), str(det))
        except json.JSONDecodeError as e:
            raise json_error(det, e) from None
    mask = folder / "mask.png"
    masks = (Mask("mask", str(mask)),) if mask.is_file() else ()
    cache[folder] = Annotations(boxes=boxes, masks=masks)
    return cache[folder]


def load_slake(split: str = "test", root: str | Path | None = None, lang: str | None = "en",
               limit: int | None = None, annotations: bool = True, on_invalid: str = "error",
               check_images: bool | str = "exists") -> VQADataset:
    """Load a SLAKE split (``train``, ``val``/``validate``, ``test``).

    ``lang``: ``"en"`` (default), ``"zh"``, or ``None`` for both. ``annotations=False`` skips
    reading masks and boxes. ``on_invalid``: ``"error"`` (default) or ``"skip"`` a bad entry (the
    official ``train.json`` has one English question with an empty answer, qid 1622);
    ``check_images``: ``"exists"``, ``"decode"`` or ``"none"`` (see
    :mod:`medvqa_env.datasets.common`).
    """
    root = local_root(root, "MEDVQA_SLAKE", "SLAKE")
    key = canonical_split(split, tuple(SPLIT_FILES), "SLAKE")
    manifest = next((root / f for f in SPLIT_FILES[key] if (root / f).is_file()), None)
    if manifest is None:
        raise DatasetError(f"SLAKE {key} file not found; looked for {[str(root / f) for f in SPLIT_FILES[key]]}")
    try:
        rows = json.loads(manifest.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise json_error(manifest, e) from None
    if not isinstance(rows, list):
        raise DatasetError(f"{manifest}: expected a JSON list of questions, got {type(rows).__name__}")
    ann_cache: dict[Path, Annotations] = {}
    out = RecordCollector("slake", on_invalid, check_images, sources=[manifest], limit=limit)
    for i, row in enumerate(rows):
        rid = None
        try:
            if lang is not None and isinstance(row, dict) and str(row.get("q_lang", "en")) != lang:
                continue
            qid = row.get("qid", i)
            rid = f"slake_{key}_{qid}"
            image = root / "imgs" / str(row["img_name"])
            answer = str(row["answer"]).strip()
            kind = AnswerType.parse(row["answer_type"]) if row.get("answer_type") else infer_answer_type(answer, {})
            record = VQARecord(
                id=rid,
                image_paths=(str(image),),
                question=str(row["question"]).strip(),
                answer=answer,
                answer_type=kind,
                dataset="slake",
                split=key,
                modality=row.get("modality") or None,
                organ=row.get("location") or None,
                question_type=row.get("content_type") or None,
                annotations=_annotations(image.parent, ann_cache) if annotations else Annotations(),
                metadata={k: row[k] for k in ("img_id", "q_lang", "base_type", "content_type", "location")
                          if k in row} | {"source_qid": qid},
            )
        except DatasetError as e:
            out.reject(manifest, f"entry {i}", str(e), rid)
            continue
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            out.reject(manifest, f"entry {i}", f"{type(e).__name__}: {e}", rid)
            continue
        out.add(record, manifest, f"entry {i}")
        if out.full:
            break
    return out.dataset()
