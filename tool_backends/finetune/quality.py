"""How good a tool's output is against annotations: the scores the trainers choose thresholds by
and ``benchmarks/bench_tool_quality.py`` reports.

Match rule for boxes: a predicted box is a true positive when its IoU with a not yet matched
gold box is at least ``MATCH_IOU``; predictions are taken highest score first (greedy, as in the
PASCAL VOC / COCO evaluations).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tool_backends.geometry import box_iou as iou

MATCH_IOU = 0.3
Box = Sequence[float]


def match_boxes(predicted: Sequence[Box], gold: Sequence[Box], min_iou: float = MATCH_IOU) -> tuple[int, int, int]:
    """``(true positives, false positives, false negatives)`` of ``predicted`` (highest score
    first) against ``gold``.

    >>> match_boxes([[0, 0, 10, 10], [50, 50, 60, 60]], [[1, 1, 10, 10], [20, 20, 30, 30]])
    (1, 1, 1)
    """
    used: set[int] = set()
    tp = 0
    for p in predicted:
        best, best_iou = None, min_iou
        for j, g in enumerate(gold):
            if j not in used:
                v = iou(p, g)
                if v >= best_iou:
                    best, best_iou = j, v
        if best is not None:
            used.add(best)
            tp += 1
    return tp, len(predicted) - tp, len(gold) - tp


def prf(tp: int, fp: int, fn: int) -> dict[str, float | None]:
    """Precision, recall and F1 (``None`` where undefined: nothing predicted / nothing to find).

    >>> prf(3, 1, 2)
    {'precision': 0.75, 'recall': 0.6, 'f1': 0.6667}
    """
    p = tp / (tp + fp) if tp + fp else None
    r = tp / (tp + fn) if tp + fn else None
    f = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
    return {"precision": _r(p), "recall": _r(r), "f1": _r(f)}


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Dice overlap of two boolean masks (1.0 when both are empty).

    >>> m = np.zeros((4, 4), bool); m[:2] = True
    >>> dice(m, m), dice(m, ~m)
    (1.0, 0.0)
    """
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    total = int(a.sum()) + int(b.sum())
    return 1.0 if total == 0 else 2.0 * float((a & b).sum()) / total


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 4)
