"""Oracle engines: answer from the dataset's annotations (``ToolContext.annotations``).

They are the upper bound for "how much do better tools help": a perfect segmenter, detector and
classifier for whatever the dataset annotated. Outside annotated records they find nothing
(segment, ground) or spread probability evenly (classify).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np
from PIL import Image

from medvqa_env.records import Annotations
from tool_backends.base import ToolContext
from tool_backends.masks import load_mask, mask_bbox

_WORD = re.compile(r"[a-z0-9]+")
_STOP = {"the", "a", "an", "of", "in", "on", "and", "or", "any", "all", "is", "are", "there", "find", "show",
         "locate", "image", "this", "visible", "region", "regions", "area"}
_NEGATION = {"no", "not", "without", "absent"}
_SYNONYMS = {"tumor": "lesion", "tumour": "lesion", "mass": "lesion", "abnormality": "lesion"}


def _concept(text: str) -> tuple[frozenset[str], bool]:
    """Content words (singular, synonyms folded) and whether the phrase is negated.

    >>> sorted(_concept("the Left Kidneys")[0]), _concept("no lesion")
    (['kidney', 'left'], (frozenset({'lesion'}), True))
    """
    words, negated = set(), False
    for w in _WORD.findall(text.lower()):
        if w in _NEGATION:
            negated = True
        elif w not in _STOP and len(w) > 1:
            w = w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
            words.add(_SYNONYMS.get(w, w))
    return frozenset(words), negated


def match_rank(label: str, text: str) -> int:
    """How well annotation ``label`` answers the query ``text``: 2 the same concept, 1 the query's
    every content word is in the label ("kidney" -> "left kidney", "lesion" -> "liver lesion"),
    0 otherwise. Negation must agree ("lesion" never matches "no lesion"), and a label never
    answers a query that asks for more ("liver lesion" does not match the organ "liver").

    >>> match_rank("left kidney", "the left kidney"), match_rank("right kidney", "left kidney")
    (2, 0)
    >>> match_rank("liver lesion", "lesions"), match_rank("liver", "liver lesion"), match_rank("no lesion", "lesion")
    (1, 0, 0)
    """
    (lw, ln), (qw, qn) = _concept(label), _concept(text)
    if not lw or not qw or ln != qn:
        return 0
    if lw == qw:
        return 2
    return 1 if qw <= lw else 0


def label_matches(label: str, text: str) -> bool:
    """Whether annotation ``label`` answers the query ``text`` (see :func:`match_rank`).

    >>> label_matches("left kidney", "kidneys"), label_matches("liver", "find the tumour")
    (True, False)
    """
    return match_rank(label, text) > 0


def best_matches(labels, text: str) -> list[int]:
    """Indices of ``labels`` with the best nonzero :func:`match_rank` against ``text``."""
    ranks = [match_rank(lab, text) for lab in labels]
    top = max(ranks, default=0)
    return [i for i, r in enumerate(ranks) if r == top and top > 0]


def _masks(ann: Annotations, image_index: int, size: tuple[int, int]) -> list[tuple[str, np.ndarray]]:
    out = []
    for m in ann.masks:
        if m.image_index != image_index:
            continue
        try:
            out.append((m.label, load_mask(m.path, size)))
        except OSError:
            continue  # an unreadable annotation is no annotation (the server may have dropped its path)
    return out


class OracleSegmenter:
    """The annotated mask under the prompt: the one holding the point, or overlapping the box most
    (ties broken by the prompt's ``label``). A box annotation whose label has no mask gives its
    rectangle."""

    def segment(self, image: Image.Image, *, box=None, point=None, label: str | None = None,
                context: ToolContext | None = None, image_index: int = 0) -> np.ndarray:
        ann = (context or ToolContext()).annotations
        w, h = image.size
        candidates = _masks(ann, image_index, (w, h))
        with_mask = {lab for lab, _ in candidates}
        for b in ann.boxes:
            if b.image_index == image_index and b.label not in with_mask:
                m = np.zeros((h, w), bool)
                x0, y0, x1, y1 = (int(round(v)) for v in b.bbox)
                m[max(0, y0):max(0, y1), max(0, x0):max(0, x1)] = True
                candidates.append((b.label, m))
        best, best_key = np.zeros((h, w), bool), (0.0, False)
        for lab, m in candidates:
            if point is not None and box is None:
                overlap = float(m[min(point[1], h - 1), min(point[0], w - 1)])
            else:
                x0, y0, x1, y1 = box
                inside = float(m[y0:y1, x0:x1].sum())
                overlap = inside / max(1.0, float(m.sum()) + (x1 - x0) * (y1 - y0) - inside)
            key = (overlap, bool(label) and label_matches(lab, label))
            if overlap > 0 and key > best_key:
                best, best_key = m, key
        return best


class OracleTextSegmenter:
    """The annotated masks (or, for box-only labels, their rectangles) whose label best matches the
    text (:func:`best_matches`), score 1: a perfect text-prompted segmenter on annotated records."""

    def segment_text(self, image: Image.Image, *, text: str, threshold: float = 0.0, max_instances: int = 5,
                     context: ToolContext | None = None, image_index: int = 0) -> list[dict[str, Any]]:
        ann = (context or ToolContext()).annotations
        w, h = image.size
        candidates = _masks(ann, image_index, (w, h))
        with_mask = {lab for lab, _ in candidates}
        for b in ann.boxes:
            if b.image_index == image_index and b.label not in with_mask:
                m = np.zeros((h, w), bool)
                x0, y0, x1, y1 = (int(round(v)) for v in b.bbox)
                m[max(0, y0):max(0, y1), max(0, x0):max(0, x1)] = True
                candidates.append((b.label, m))
        keep = best_matches([lab for lab, _ in candidates], text)
        return [{"mask": candidates[i][1], "score": 1.0, "label": candidates[i][0]}
                for i in keep if candidates[i][1].any()][:max_instances]


class OracleGrounder:
    """Annotated boxes (and boxes of annotated masks) whose label matches the text, score 1."""

    def detect(self, image: Image.Image, *, text: str, context: ToolContext | None = None,
               image_index: int = 0, threshold: float = 0.0, max_boxes: int = 5) -> list[dict[str, Any]]:
        ann = (context or ToolContext()).annotations
        candidates = [(b.label, [round(float(v), 1) for v in b.bbox]) for b in ann.boxes if b.image_index == image_index]
        boxed = {lab for lab, _ in candidates}
        for lab, m in _masks(ann, image_index, image.size):
            bbox = mask_bbox(m)
            if bbox and lab not in boxed:
                candidates.append((lab, bbox))
        keep = best_matches([lab for lab, _ in candidates], text)
        return [{"bbox": candidates[i][1], "label": candidates[i][0], "score": 1.0} for i in keep][:max_boxes]


class OracleClassifier:
    """Puts ``1 - epsilon`` of the mass evenly on the candidates that match an annotated label
    (image labels, box and mask labels); uniform when none match."""

    def __init__(self, epsilon: float = 0.02) -> None:
        if not 0 <= epsilon < 1:
            raise ValueError(f"expected 0 <= epsilon < 1, got {epsilon!r}")
        self.epsilon = float(epsilon)

    def classify(self, image: Image.Image, labels: Sequence[str], *, context: ToolContext | None = None,
                 image_index: int = 0) -> dict[str, float]:
        ann = (context or ToolContext()).annotations
        truth = list(ann.labels) + [b.label for b in ann.boxes] + [m.label for m in ann.masks]
        ranks = [max((match_rank(t, lab) for t in truth), default=0) for lab in labels]
        top = max(ranks, default=0)
        hits = [lab for lab, r in zip(labels, ranks) if r == top and top > 0]
        if not hits or len(hits) == len(labels):
            return {lab: 1.0 / len(labels) for lab in labels}
        on, off = (1 - self.epsilon) / len(hits), self.epsilon / (len(labels) - len(hits))
        return {lab: on if lab in hits else off for lab in labels}
