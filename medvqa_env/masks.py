"""Binary masks as run-length encodings: how masks travel in ``ToolResult.data``, JSON logs and HTTP.

COCO's uncompressed RLE (``{"size": [h, w], "counts": [...]}``, column-major, the first count is
background), so ``pycocotools.mask.frPyObjects`` reads it too. Tools encode with it and the renderer
decodes with it: one format for the whole project.

>>> import numpy as np
>>> m = np.zeros((3, 4), bool); m[1, 1:3] = True
>>> rle = mask_to_rle(m); rle
{'size': [3, 4], 'counts': [4, 1, 2, 1, 4]}
>>> bool((rle_to_mask(rle) == m).all())
True
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np


def mask_to_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO uncompressed RLE of a 2-D boolean mask (see the module doctest)."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"expected a 2-D mask, got shape {mask.shape}")
    flat = mask.astype(bool).ravel(order="F")
    if flat.size == 0:
        return {"size": list(mask.shape), "counts": []}
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0]:
        counts = [0] + counts
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": [int(c) for c in counts]}


def rle_to_mask(rle: Mapping[str, Any]) -> np.ndarray:
    """Inverse of :func:`mask_to_rle`; a malformed RLE raises ``ValueError``."""
    try:
        h, w = (int(v) for v in rle["size"])
        counts = [int(c) for c in rle["counts"]]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"expected an RLE {{'size': [h, w], 'counts': [...]}}, got {rle!r}") from None
    if sum(counts) != h * w or any(c < 0 for c in counts):
        raise ValueError(f"expected RLE counts summing to {h * w}, got {sum(counts)}")
    values = np.zeros(len(counts), bool)
    values[1::2] = True
    return np.repeat(values, counts).reshape((h, w), order="F")
