"""The one record schema every dataset loader produces.

A :class:`VQARecord` is one question about one or more images. Loaders for VQA-RAD, SLAKE,
PathVQA, PMC-VQA, MedBridgeRL JSONL and the embedded default all map their fields onto it, so
the env, the tools, the rewards and the evaluation never look at a dataset's own layout.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from medvqa_env.errors import DatasetError


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

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "bbox": list(self.bbox), "image_index": self.image_index}


@dataclass(frozen=True)
class Mask:
    """An annotated binary mask stored as an image file (non-zero = inside)."""

    label: str
    path: str
    image_index: int = 0

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
        if not data:
            return cls()
        boxes = tuple(
            Box(str(b["label"]), tuple(float(v) for v in b["bbox"]), int(b.get("image_index", 0)))
            for b in data.get("boxes", ())
        )
        masks = tuple(
            Mask(str(m["label"]), str(m["path"]), int(m.get("image_index", 0)))
            for m in data.get("masks", ())
        )
        return cls(boxes=boxes, masks=masks, labels=tuple(data.get("labels", ())))


@dataclass(frozen=True)
class VQARecord:
    """One medical VQA question.

    ``image_paths`` are absolute paths (loaders resolve them); ``options`` maps MCQ letters to
    option text (empty for CLOSED/OPEN); ``answer`` is the ground truth text (for MCQ: the letter).
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
        if not self.id:
            raise DatasetError("a record needs a non-empty id")
        if not self.image_paths:
            raise DatasetError(f"record {self.id!r} has no image paths")
        if not isinstance(self.answer_type, AnswerType):
            object.__setattr__(self, "answer_type", AnswerType.parse(self.answer_type))
        if self.answer_type is AnswerType.MCQ and not self.options:
            raise DatasetError(f"record {self.id!r} is MCQ but has no options")

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
            image_paths=tuple(data["image_paths"]),
            question=str(data["question"]),
            answer=str(data["answer"]),
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
        ids = [r.id for r in self._records]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise DatasetError(f"dataset {name!r} has duplicate record id {dup!r}")
        self._by_id = {r.id: i for i, r in enumerate(self._records)}

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
