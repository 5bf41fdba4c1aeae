"""Boxes the model writes -> safe pixel boxes, and pixel boxes -> the numbers the model reads.
Shared by every tool that takes or reports a box.

Models write boxes in three conventions: pixels of the image they were shown (Qwen2.5-VL),
0-1 fractions, and a 0-1000 grid (Qwen3-VL). A tool's ``box_convention`` option sets the default
of its ``coordinates`` argument (so the schema in the system prompt says which), a call may still
name another, and the tool reports boxes back in the call's convention. Anything unusable becomes
a :class:`ToolError` the model can read.

>>> resolve_bbox([250, 250, 750, 750], (200, 100), "norm1000")
(50, 25, 150, 75)
>>> show_box([50, 25, 150, 75], (200, 100), "norm1000")
[250, 250, 750, 750]
"""

from __future__ import annotations

import math
from typing import Sequence

from medvqa_env.errors import ConfigError, ToolError

COORDINATE_SYSTEMS = ("pixel", "normalized", "norm1000")

BOX_CONVENTIONS = {"pixels": "pixel", "pixel": "pixel", "normalized": "normalized",
                   "qwen3_grid": "norm1000", "norm1000": "norm1000"}
"""A policy family's convention (a tool's ``box_convention=`` option) -> its coordinate system:
``pixels`` (Qwen2.5-VL, most VLMs), ``qwen3_grid`` (Qwen3-VL's 0-1000 grid), ``normalized`` (0-1)."""

_MEANING = {"pixel": "pixels of the image as shown to you", "normalized": "fractions 0-1 of the image's width "
            "and height", "norm1000": "a 0-1000 grid over the image's width and height"}

BBOX_SCHEMA = {
    "type": "array",
    "items": {"type": "number"},
    "minItems": 4,
    "maxItems": 4,
    "description": "[x0, y0, x1, y1] with x0 < x1 and y0 < y1 (bbox_2d is accepted too)",
}


def coordinate_system(convention: str) -> str:
    """The coordinate system of a ``box_convention`` (see :data:`BOX_CONVENTIONS`).

    >>> coordinate_system("qwen3_grid")
    'norm1000'
    """
    try:
        return BOX_CONVENTIONS[convention]
    except (KeyError, TypeError):
        raise ConfigError(f"expected box_convention in {sorted(BOX_CONVENTIONS)}, got {convention!r}") from None


def coordinates_schema(convention: str = "pixels") -> dict:
    """The ``coordinates`` argument's schema, defaulting to the tool's convention."""
    default = coordinate_system(convention)
    return {"type": "string", "enum": list(COORDINATE_SYSTEMS), "default": default,
            "description": (f"how box/point numbers are read and reported: {default} (default: {_MEANING[default]}), "
                            + ", ".join(f"{c} ({_MEANING[c]})" for c in COORDINATE_SYSTEMS if c != default))}


COORDINATES_SCHEMA = coordinates_schema("pixels")


def show_box(box, size: tuple[int, int], coordinates: str = "pixel") -> list:
    """A pixel box as the model writes it in ``coordinates`` (the inverse of :func:`resolve_bbox`).

    >>> show_box([10, 20, 30.5, 40], (100, 50), "normalized")
    [0.1, 0.4, 0.305, 0.8]
    >>> resolve_bbox(show_box([36, 46, 65, 75], (160, 120), "norm1000"), (160, 120), "norm1000")
    (36, 46, 65, 75)
    """
    w, h = size
    x0, y0, x1, y1 = (float(v) for v in box)
    if coordinates == "normalized":
        return [round(x0 / w, 4), round(y0 / h, 4), round(x1 / w, 4), round(y1 / h, 4)]
    if coordinates == "norm1000":
        return [round(x0 * 1000 / w), round(y0 * 1000 / h), round(x1 * 1000 / w), round(y1 * 1000 / h)]
    return [int(v) if float(v).is_integer() else round(float(v), 1) for v in box]


def unit(coordinates: str) -> str:
    """How a box in ``coordinates`` is labelled in tool text ("pixels", "normalized", "0-1000 grid")."""
    return {"pixel": "pixels", "normalized": "normalized 0-1", "norm1000": "0-1000 grid"}.get(coordinates, coordinates)


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
    if coordinates in ("normalized", "norm1000"):  # relative numbers name the nearest pixel edge
        unit_ = 1.0 if coordinates == "normalized" else 1000.0
        x0, x1 = (float(round(v * w / unit_)) for v in (x0, x1))
        y0, y1 = (float(round(v * h / unit_)) for v in (y0, y1))
    if x1 <= x0 or y1 <= y0:
        raise ToolError(f"bbox {list(bbox)} is empty or inverted: need x0 < x1 and y0 < y1.")
    cx0, cy0 = max(0.0, x0), max(0.0, y0)
    cx1, cy1 = min(float(w), x1), min(float(h), y1)
    if cx1 - cx0 < 1 or cy1 - cy0 < 1:
        raise ToolError(
            f"bbox {list(bbox)} lies outside the image ({w}x{h} pixels, {coordinates} coordinates)."
        )
    return int(math.floor(cx0)), int(math.floor(cy0)), int(math.ceil(cx1)), int(math.ceil(cy1))


def resolve_point(point: Sequence[float], size: tuple[int, int], coordinates: str = "pixel") -> tuple[int, int]:
    """A model-written point -> integer pixels inside the image, or a ToolError.

    >>> resolve_point([0.5, 0.25], (200, 100), "normalized")
    (100, 25)
    """
    if len(point) != 2 or any(not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
                              for v in point):
        raise ToolError(f"point must be 2 finite numbers [x, y], got {list(point)!r}.")
    w, h = size
    x, y = float(point[0]), float(point[1])
    if coordinates == "normalized":
        x, y = x * w, y * h
    elif coordinates == "norm1000":
        x, y = x * w / 1000, y * h / 1000
    if not (0 <= x <= w and 0 <= y <= h):
        raise ToolError(f"point {list(point)} lies outside the image ({w}x{h} pixels, {coordinates} coordinates).")
    return min(int(x), w - 1), min(int(y), h - 1)


def show_point(point, size: tuple[int, int], coordinates: str = "pixel") -> list:
    """A pixel point as the model writes it in ``coordinates``.

    >>> show_point((100, 25), (200, 100), "norm1000")
    [500, 250]
    """
    return show_box([point[0], point[1], point[0], point[1]], size, coordinates)[:2]


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
