"""Binary masks as run-length encodings: how masks travel in ``ToolResult.data``, JSON logs and HTTP.

Row-major runs, starting with a run of zeros (COCO's uncompressed RLE, but row-major).

>>> import numpy as np
>>> m = np.array([[0, 1, 1], [0, 0, 1]], dtype=bool)
>>> rle = mask_to_rle(m)
>>> rle
{'size': [2, 3], 'counts': [1, 2, 2, 1]}
>>> bool((rle_to_mask(rle) == m).all())
True
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np


def mask_to_rle(mask: np.ndarray) -> dict[str, Any]:
    flat = np.asarray(mask, dtype=bool).ravel()
    if flat.size == 0:
        return {"size": list(np.shape(mask)), "counts": []}
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0]:
        counts = [0] + counts
    return {"size": [int(s) for s in np.shape(mask)], "counts": [int(c) for c in counts]}


def rle_to_mask(rle: Mapping[str, Any]) -> np.ndarray:
    h, w = (int(v) for v in rle["size"])
    counts = np.asarray(rle["counts"], dtype=np.int64)
    if counts.sum() != h * w or (counts < 0).any():
        raise ValueError(f"expected RLE counts summing to {h * w}, got {int(counts.sum())}")
    values = np.zeros(len(counts), dtype=bool)
    values[1::2] = True
    return np.repeat(values, counts).reshape(h, w)
