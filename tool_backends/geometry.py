"""Boxes the model writes -> safe pixel boxes. Shared by every box-taking tool.

Models write boxes in three conventions: pixels (Qwen2.5-VL), 0-1 fractions, and 0-1000
(Qwen3-VL). All are accepted; anything unusable becomes a :class:`ToolError` the model can read.
"""

from __future__ import annotations

import math
from typing import Sequence

from medvqa_env.errors import ToolError

COORDINATE_SYSTEMS = ("pixel", "normalized", "norm1000")

BBOX_SCHEMA = {
    "type": "array",
    "items": {"type": "number"},
    "minItems": 4,
    "maxItems": 4,
    "description": "[x0, y0, x1, y1] with x0 < x1 and y0 < y1",
}
COORDINATES_SCHEMA = {
    "type": "string",
    "enum": list(COORDINATE_SYSTEMS),
    "default": "pixel",
    "description": "pixel (default), normalized (0-1) or norm1000 (0-1000)",
}


def resolve_bbox(bbox: Sequence[float], size: tuple[int, int], coordinates: str = "pixel") -> tuple[int, int, int, int]:
    """Convert ``bbox`` to integer pixel coordinates clipped to ``size`` = (width, height).

    >>> resolve_bbox([0.25, 0.25, 0.75, 0.75], (200, 100), "normalized")
    (50, 25, 150, 75)
    >>> resolve_bbox([-10, 0, 50, 500], (100, 100))
    (0, 0, 50, 100)
    """
    if len(bbox) != 4:
        raise ToolError(f"bbox must have 4 numbers [x0, y0, x1, y1], got {len(bbox)}.")
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) for v in bbox):
        raise ToolError(f"bbox must hold 4 finite numbers, got {list(bbox)!r}.")
    if coordinates not in COORDINATE_SYSTEMS:
        raise ToolError(f"coordinates must be one of {list(COORDINATE_SYSTEMS)}, got {coordinates!r}.")
    w, h = size
    x0, y0, x1, y1 = (float(v) for v in bbox)
    if coordinates == "normalized":
        x0, x1, y0, y1 = x0 * w, x1 * w, y0 * h, y1 * h
    elif coordinates == "norm1000":
        x0, x1, y0, y1 = x0 * w / 1000, x1 * w / 1000, y0 * h / 1000, y1 * h / 1000
    if x1 <= x0 or y1 <= y0:
        raise ToolError(f"bbox {list(bbox)} is empty or inverted: need x0 < x1 and y0 < y1.")
    cx0, cy0 = max(0.0, x0), max(0.0, y0)
    cx1, cy1 = min(float(w), x1), min(float(h), y1)
    if cx1 - cx0 < 1 or cy1 - cy0 < 1:
        raise ToolError(
            f"bbox {list(bbox)} lies outside the image ({w}x{h} pixels, {coordinates} coordinates)."
        )
    return int(math.floor(cx0)), int(math.floor(cy0)), int(math.ceil(cx1)), int(math.ceil(cy1))


def expand_to_min_size(box: tuple[int, int, int, int], size: tuple[int, int], min_size: int) -> tuple[int, int, int, int]:
    """Grow ``box`` around its centre to at least ``min_size`` per side, staying inside the image."""
    w, h = size
    x0, y0, x1, y1 = box

    def grow(a: int, b: int, limit: int) -> tuple[int, int]:
        need = min(min_size, limit) - (b - a)
        if need <= 0:
            return a, b
        a -= need // 2
        b += need - need // 2
        if a < 0:
            b, a = b - a, 0
        if b > limit:
            a, b = max(0, a - (b - limit)), limit
        return a, b

    x0, x1 = grow(x0, x1, w)
    y0, y1 = grow(y0, y1, h)
    return x0, y0, x1, y1


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two [x0, y0, x1, y1] boxes.

    >>> box_iou([0, 0, 10, 10], [5, 0, 15, 10])
    0.3333333333333333
    """
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0
