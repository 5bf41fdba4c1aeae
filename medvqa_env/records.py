"""The one record schema every dataset loader produces.

A :class:`VQARecord` is one question about one or more images. Loaders for VQA-RAD, SLAKE,
PathVQA, PMC-VQA, MedBridgeRL JSONL and the embedded default all map their fields onto it, so
the env, the tools, the rewards and the evaluation never look at a dataset's own layout.
"""

from __future__ import annotations

import enum
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from medvqa_env.errors import DatasetError

MIN_MCQ_OPTIONS = 2


def answer_text(value: Any) -> str:
    """One ground-truth answer string from a manifest value; the one rule every loader uses.

    A string or number is kept (stripped). A list holding one distinct value is that value. A list
    of several values is refused: it may mean "any of these" (alternatives) or "all of these" (a
    multi-part answer), and scoring against one string cannot honour either silently. A loader
    whose format documents alternatives (VQA-Med's ``#``) picks the first itself and keeps the rest
    in ``metadata["answer_alternatives"]``.

    >>> answer_text(" Yes "), answer_text(3), answer_text(["left", "left"])
    ('Yes', '3', 'left')
    >>> answer_text(["a", "b"])
    Traceback (most recent call last):
    ...
    medvqa_env.errors.DatasetError: answer is a list of 2 values ['a', 'b']; a record has one ground-truth answer: write one string (the answer, or the parts joined, e.g. 'a and b')
    """
    if isinstance(value, (list, tuple)):
        distinct = list(dict.fromkeys(str(v).strip() for v in value if str(v).strip()))
        if len(distinct) != 1:
            raise DatasetError(f"answer is a list of {len(value)} values {list(value)!r:.120}; a record has one "
                               f"ground-truth answer: write one string (the answer, or the parts joined, e.g. "
                               f"'a and b')")
        value = distinct[0]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DatasetError(f"expected the answer to be a string, got {type(value).__name__} {value!r:.60}")
    text = str(value).strip()
    if not text:
        raise DatasetError("the answer is empty")
    return text


class AnswerType(str, enum.Enum):
    """How an answer is scored: rule-based (CLOSED yes/no, MCQ letter) or open text."""

    CLOSED = "CLOSED"
    OPEN = "OPEN"
    MCQ = "MCQ"

    @classmethod
    def parse(cls, value: str | "AnswerType") -> "AnswerType":
        if isinstance(value, AnswerType):
            return value
        key = str(value).strip().upper()
        aliases = {"YES/NO": "CLOSED", "YESNO": "CLOSED", "CLOSE": "CLOSED", "OPEN-ENDED": "OPEN",
                   "MULTIPLE-CHOICE": "MCQ", "MULTI-CHOICE": "MCQ", "CHOICE": "MCQ"}
        key = aliases.get(key, key)
        try:
            return cls(key)
        except ValueError:
            raise ValueError(
                f"expected an answer type in {[t.value for t in cls]}, got {value!r}"
            ) from None


@dataclass(frozen=True)
class Box:
    """An annotated region in pixel coordinates of image ``image_index`` (x0, y0, x1, y1)."""

    label: str
    bbox: tuple[float, float, float, float]
    image_index: int = 0

    def __post_init__(self) -> None:
        if len(self.bbox) != 4 or not self.bbox[0] <= self.bbox[2] or not self.bbox[1] <= self.bbox[3]:
            raise DatasetError(f"box {self.label!r}: expected bbox [x0, y0, x1, y1] with x0 <= x1 and y0 <= y1, "
                               f"got {list(self.bbox)!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "bbox": list(self.bbox), "image_index": self.image_index}


@dataclass(frozen=True)
class Mask:
    """An annotated binary mask stored as an image file (non-zero = inside); ``path`` is made
    absolute when the mask is created, so a later ``chdir`` does not break it."""

    label: str
    path: str
    image_index: int = 0

    def __post_init__(self) -> None:
        if not str(self.path).strip():
            raise DatasetError(f"mask {self.label!r} has an empty path")
        object.__setattr__(self, "path", os.path.abspath(str(self.path)))

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "path": self.path, "image_index": self.image_index}


@dataclass(frozen=True)
class Annotations:
    """Optional ground-truth regions: used by the oracle tool engine and grounding rewards."""

    boxes: tuple[Box, ...] = ()
    masks: tuple[Mask, ...] = ()
    labels: tuple[str, ...] = ()  # image-level labels (e.g. class names for classification)

    @property
    def empty(self) -> bool:
        return not (self.boxes or self.masks or self.labels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "boxes": [b.to_dict() for b in self.boxes],
            "masks": [m.to_dict() for m in self.masks],
            "labels": list(self.labels),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "Annotations":
        """``{"boxes": [{"label", "bbox", "image_index"}], "masks": [{"label", "path", ...}],
        "labels": [...]}``; a malformed entry raises :class:`DatasetError` naming it."""
        if not data:
            return cls()
        if not isinstance(data, Mapping):
            raise DatasetError(f"expected annotations to be an object with boxes/masks/labels, got {data!r:.80}")
        unknown = sorted(set(data) - {"boxes", "masks", "labels"})
        if unknown:
            raise DatasetError(f"annotations: unknown key(s) {unknown}; expected boxes, masks, labels")

        def entries(kind: str, build):
            out = []
            for i, item in enumerate(data.get(kind) or ()):
                try:
                    out.append(build(item))
                except DatasetError as e:
                    raise DatasetError(f"annotations.{kind}[{i}]: {e}") from None
                except (KeyError, TypeError, ValueError) as e:
                    raise DatasetError(f"annotations.{kind}[{i}]: {type(e).__name__}: {e} in {item!r:.80}") from None
            return tuple(out)

        boxes = entries("boxes", lambda b: Box(str(b["label"]), tuple(float(v) for v in b["bbox"]),
                                               int(b.get("image_index", 0))))
        masks = entries("masks", lambda m: Mask(str(m["label"]), str(m["path"]), int(m.get("image_index", 0))))
        labels = data.get("labels") or ()
        if isinstance(labels, str) or not all(isinstance(v, str) for v in labels):
            raise DatasetError(f"annotations.labels: expected a list of strings, got {labels!r:.80}")
        return cls(boxes=boxes, masks=masks, labels=tuple(labels))


@dataclass(frozen=True)
class VQARecord:
    """One medical VQA question (the full schema, with an example per answer type, is in
    ``docs/datasets.md``).

    ``image_paths`` are made absolute when the record is created (relative ones resolve against
    the working directory at that moment), so a later ``chdir`` does not break a loaded dataset; an
    entry may carry an image fragment (``ct.dcm#window=40,400``, see :mod:`medvqa_env.images`).
    ``options`` maps MCQ letters to option text (empty for CLOSED/OPEN); ``answer`` is the ground
    truth text (for MCQ: one of the option letters).

    Creation validates: a non-empty id, question and answer, at least one image, an answer that
    does not normalise to nothing (``"."``: :func:`rewards.normalize.normalize_text`), and an MCQ
    with at least two options whose answer is one of their letters. Each failure is a
    :class:`DatasetError` naming the record; loaders prefix the file and line.
    """

    id: str
    image_paths: tuple[str, ...]
    question: str
    answer: str
    answer_type: AnswerType
    dataset: str
    split: str = "test"
    options: Mapping[str, str] = field(default_factory=dict)
    modality: str | None = None
    organ: str | None = None
    question_type: str | None = None
    annotations: Annotations = field(default_factory=Annotations)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id.strip():
            raise DatasetError(f"a record needs a non-empty id, got {self.id!r}")
        where = f"record {self.id!r}"
        if isinstance(self.image_paths, str) or not self.image_paths:
            raise DatasetError(f"{where} has no image paths (expected a list of paths, got {self.image_paths!r:.80})")
        if not all(isinstance(p, (str, os.PathLike)) and str(p).strip() for p in self.image_paths):
            raise DatasetError(f"{where}: expected non-empty image paths, got {list(self.image_paths)!r:.120}")
        object.__setattr__(self, "image_paths", tuple(os.path.abspath(str(p)) for p in self.image_paths))
        for name in ("question", "answer"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise DatasetError(f"{where} has an empty {name} (got {value!r:.60})")
        if not isinstance(self.answer_type, AnswerType):
            try:
                object.__setattr__(self, "answer_type", AnswerType.parse(self.answer_type))
            except ValueError as e:
                raise DatasetError(f"{where}: {e}") from None
        if self.answer_type is AnswerType.MCQ:
            if len(self.options) < MIN_MCQ_OPTIONS:
                raise DatasetError(f"{where} is MCQ but has {len(self.options)} option(s) {dict(self.options)!r:.80}; "
                                   f"an MCQ needs at least {MIN_MCQ_OPTIONS} (or give the record answer_type "
                                   f"CLOSED/OPEN)")
            if self.answer not in self.options:
                raise DatasetError(f"{where}: MCQ answer {self.answer!r:.60} is not one of its options "
                                   f"{sorted(self.options)} (the answer of an MCQ is an option letter)")
        else:
            from rewards.normalize import normalize_text  # the normalisation every score uses

            if not normalize_text(self.answer):
                raise DatasetError(f"{where} has an empty answer once normalised (got {self.answer!r:.60}: nothing "
                                   f"but punctuation); no answer can be scored against it")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["answer_type"] = self.answer_type.value
        data["image_paths"] = list(self.image_paths)
        data["options"] = dict(self.options)
        data["annotations"] = self.annotations.to_dict()
        data["metadata"] = dict(self.metadata)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "VQARecord":
        return cls(
            id=str(data["id"]),
            image_paths=(data["image_paths"],) if isinstance(data["image_paths"], str) else tuple(data["image_paths"]),
            question=str(data["question"]),
            answer=answer_text(data["answer"]),
            answer_type=AnswerType.parse(data["answer_type"]),
            dataset=str(data.get("dataset", "custom")),
            split=str(data.get("split", "test")),
            options=dict(data.get("options") or {}),
            modality=data.get("modality"),
            organ=data.get("organ"),
            question_type=data.get("question_type"),
            annotations=Annotations.from_dict(data.get("annotations")),
            metadata=dict(data.get("metadata") or {}),
        )


class VQADataset(Sequence[VQARecord]):
    """An ordered, indexable collection of records with a name (what ``reset(options=)`` indexes)."""

    def __init__(self, records: Sequence[VQARecord], name: str = "custom") -> None:
        self._records = tuple(records)
        self.name = name
        self._by_id: dict[str, int] = {}
        for i, r in enumerate(self._records):
            first = self._by_id.setdefault(r.id, i)
            if first != i:
                raise DatasetError(f"dataset {name!r} has duplicate record id {r.id!r} (records {first} and {i})")

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return VQADataset(self._records[index], self.name)
        return self._records[index]

    def index_of(self, record_id: str) -> int:
        try:
            return self._by_id[record_id]
        except KeyError:
            raise KeyError(f"no record with id {record_id!r} in dataset {self.name!r}") from None

    def filter(self, predicate) -> "VQADataset":
        return VQADataset([r for r in self._records if predicate(r)], self.name)

    def __repr__(self) -> str:
        return f"VQADataset(name={self.name!r}, n={len(self)})"
