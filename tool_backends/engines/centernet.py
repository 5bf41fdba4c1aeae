"""``centernet``: a grounder trained on a dataset's box annotations, loaded by path.

``model=`` a folder written by ``python -m tool_backends.finetune ground --out DIR`` (see
:mod:`tool_backends.engines.centernet_model`). It knows the labels it was trained on and nothing
else, and it says so: a query is matched to those labels the way the oracle matches annotations
(:func:`~tool_backends.engines.oracle.best_matches`: the same concept, else every label holding
all of the query's words), every matched label is queried, and each box carries the label that
scored it ("lesion" -> boxes labelled "left kidney lesion", "liver lesion", ...). A query that
matches no trained label finds nothing, and the tool's text lists what the model knows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from tool_backends.base import ToolContext
from tool_backends.engines.centernet_model import STRIDE, load_grounder
from tool_backends.engines.hf_common import TorchEngine
from tool_backends.engines.oracle import best_matches, match_rank
from tool_backends.geometry import box_iou

MAX_LISTED_LABELS = 30


def image_tensor(image: Image.Image, size: int, mean: float, std: float):
    """``(1, 3, size, size)`` float tensor of ``image`` resized to a square, normalised."""
    import torch

    rgb = image.convert("RGB")
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    arr = (np.asarray(rgb, np.float32) / 255.0 - mean) / std
    return torch.from_numpy(arr.transpose(2, 0, 1).copy())[None]


def decode(heat, reg, label_ids: list[int], labels: list[str], threshold: float, max_boxes: int,
           scale: tuple[float, float], nms_iou: float = 0.5) -> list[dict[str, Any]]:
    """Boxes from one image's heatmaps ``heat`` (labels, G, G; probabilities) and regression
    ``reg`` (4, G, G): the per-cell best of the queried labels, its 3x3 local maxima at or above
    ``threshold``, highest first, overlapping boxes (IoU > ``nms_iou``) dropped. ``scale`` maps
    network pixels to image pixels (x, y)."""
    import torch
    from torch.nn import functional as F

    best, which = heat[label_ids].max(0)
    peaks = (best == F.max_pool2d(best[None, None], 3, 1, 1)[0, 0]) & (best >= threshold)
    ys, xs = torch.nonzero(peaks, as_tuple=True)
    order = best[ys, xs].argsort(descending=True)
    out: list[dict[str, Any]] = []
    for k in order.tolist():
        y, x = int(ys[k]), int(xs[k])
        dx, dy, lw, lh = (float(v) for v in reg[:, y, x])
        cx, cy = (x + dx) * STRIDE, (y + dy) * STRIDE
        w, h = float(np.exp(np.clip(lw, -4, 8))) * STRIDE, float(np.exp(np.clip(lh, -4, 8))) * STRIDE
        bbox = [(cx - w / 2) * scale[0], (cy - h / 2) * scale[1], (cx + w / 2) * scale[0], (cy + h / 2) * scale[1]]
        if any(box_iou(bbox, b["bbox"]) > nms_iou for b in out):
            continue
        out.append({"bbox": bbox, "label": labels[label_ids[int(which[y, x])]], "score": float(best[y, x])})
        if len(out) >= max_boxes:
            break
    return out


class CenterNetGrounder(TorchEngine):
    """Boxes for the trained labels a query matches (see the module docstring)."""

    def __init__(self, model: str, device: str = "cpu", nms_iou: float = 0.5) -> None:
        super().__init__(device)
        self.net, self.config = load_grounder(model, device)
        self.model_path = str(model)
        self.labels = list(self.config.labels)
        self.default_threshold = float(self.config.threshold)
        self.nms_iou = float(nms_iou)

    def match_labels(self, text: str) -> list[str]:
        """The trained labels that ``text`` asks for (empty when none)."""
        return [self.labels[i] for i in best_matches(self.labels, text)]

    def query_note(self, text: str) -> tuple[str, dict[str, Any]]:
        """A sentence for the tool's text and ``data`` fields saying how ``text`` was used."""
        matched = self.match_labels(text)
        if not matched:
            known = ", ".join(self.labels[:MAX_LISTED_LABELS]) + (", ..." if len(self.labels) > MAX_LISTED_LABELS else "")
            return (f" This model finds only the labels it was trained on ({known}); {text!r} matches none of them.",
                    {"queried_labels": []})
        if len(matched) == 1 and match_rank(matched[0], text) == 2:
            return "", {"queried_labels": matched}
        # the labels go to ``data``, not the text: listed in every observation, each organ's name would
        # appear whether or not a box was found for it, and the text should say only what was found
        return (f" The query was expanded to the {len(matched)} labels the model was trained on that contain it; "
                "each box names its label.", {"queried_labels": matched})

    def detect(self, image: Image.Image, *, text: str, context: ToolContext | None = None, image_index: int = 0,
               threshold: float | None = None, max_boxes: int = 5) -> list[dict[str, Any]]:
        import torch

        ids = best_matches(self.labels, text)
        if not ids:
            return []
        threshold = self.default_threshold if threshold is None else float(threshold)
        size = self.config.image_size
        x = image_tensor(image, size, self.config.mean, self.config.std).to(self.device)
        with self.lock, torch.no_grad():
            heat, reg = self.net(x)
        w, h = image.size
        return decode(heat[0].sigmoid().cpu(), reg[0].cpu(), ids, self.labels, threshold, int(max_boxes),
                      (w / size, h / size), self.nms_iou)
