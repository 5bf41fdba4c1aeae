"""Classical engines (numpy, scipy, scikit-image): no weights, deterministic, fast on CPU.

They are honest baselines, not medical models: a box prompt is segmented by Otsu thresholding
inside the box, a point prompt by region growing from the point, grounding finds bright or dark
blobs that stand out from their surroundings, and the high-resolution render is Lanczos
upsampling plus an unsharp mask (it adds no detail the pixels do not hold).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from PIL import Image, ImageFilter, ImageOps
from scipy import ndimage

from tool_backends.base import ToolContext

DARK_WORDS = re.compile(r"\b(dark|black|hypo\w*|lucen\w*|air|gas|cyst\w*|fluid|effusion|low[- ]density)\b", re.I)


def gray(image: Image.Image) -> np.ndarray:
    """Grayscale float32 in [0, 1]."""
    return np.asarray(image.convert("L"), dtype=np.float32) / 255.0


def _otsu(values: np.ndarray) -> float:
    from skimage.filters import threshold_otsu

    if values.size == 0 or float(values.max()) == float(values.min()):
        return float(values.mean()) if values.size else 0.5
    return float(threshold_otsu(values))


def _component_at(mask: np.ndarray, seed: tuple[int, int] | None) -> np.ndarray:
    """The 8-connected component containing ``seed`` (row, col), else the largest one."""
    labels, n = ndimage.label(mask, structure=np.ones((3, 3), bool))
    if n == 0:
        return mask
    if seed is not None and labels[seed] > 0:
        return labels == labels[seed]
    sizes = np.bincount(labels.ravel())[1:]
    return labels == (int(np.argmax(sizes)) + 1)


class ClassicalSegmenter:
    """Box prompt: Otsu inside the box, keep the class of the box's centre, the component at the
    centre, holes filled. Point prompt: flood fill from the point with a tolerance set by the local
    contrast, limited to a window of ``max_fraction`` of the image side around the point."""

    def __init__(self, smooth_sigma: float = 1.0, max_fraction: float = 0.5, min_tolerance: float = 0.04) -> None:
        self.smooth_sigma = float(smooth_sigma)
        self.max_fraction = float(max_fraction)
        self.min_tolerance = float(min_tolerance)

    def segment(self, image: Image.Image, *, box: tuple[int, int, int, int] | None = None,
                point: tuple[int, int] | None = None, label: str | None = None,
                context: ToolContext | None = None, image_index: int = 0) -> np.ndarray:
        g = ndimage.gaussian_filter(gray(image), self.smooth_sigma) if self.smooth_sigma > 0 else gray(image)
        h, w = g.shape
        out = np.zeros((h, w), bool)
        if box is not None:
            x0, y0, x1, y1 = box
            patch = g[y0:y1, x0:x1]
            t = _otsu(patch)
            cy, cx = (y1 - y0) // 2, (x1 - x0) // 2
            if point is not None:
                cx, cy = min(max(point[0] - x0, 0), x1 - x0 - 1), min(max(point[1] - y0, 0), y1 - y0 - 1)
            centre = patch[max(0, cy - 2):cy + 3, max(0, cx - 2):cx + 3].mean()
            fg = patch > t if centre > t else patch <= t
            fg = _component_at(fg, (cy, cx))
            out[y0:y1, x0:x1] = ndimage.binary_fill_holes(fg)
            return out
        if point is None:
            return out
        from skimage.segmentation import flood

        px, py = min(max(point[0], 0), w - 1), min(max(point[1], 0), h - 1)
        half = max(8, int(self.max_fraction * max(h, w) / 2))
        wy0, wy1, wx0, wx1 = max(0, py - half), min(h, py + half), max(0, px - half), min(w, px + half)
        window = g[wy0:wy1, wx0:wx1]
        local = g[max(0, py - 3):py + 4, max(0, px - 3):px + 4]
        tolerance = max(self.min_tolerance, 2.5 * float(local.std()))
        region = flood(window, (py - wy0, px - wx0), tolerance=tolerance)
        out[wy0:wy1, wx0:wx1] = ndimage.binary_fill_holes(region)
        return out


class BlobTextSegmenter:
    """Text -> masks the classical way: :class:`BlobGrounder` finds the blobs the text's polarity
    asks for, :class:`ClassicalSegmenter` segments each box. Reads no semantics (like its parts)."""

    def __init__(self, **grounder_options: Any) -> None:
        self.grounder = BlobGrounder(**grounder_options)
        self.segmenter = ClassicalSegmenter()

    def segment_text(self, image: Image.Image, *, text: str, threshold: float = 0.0, max_instances: int = 5,
                     context: ToolContext | None = None, image_index: int = 0) -> list[dict[str, Any]]:
        out, g = [], gray(image)
        dark = bool(DARK_WORDS.search(text or ""))
        for b in self.grounder.detect(image, text=text, threshold=threshold, max_boxes=max_instances):
            x0, y0, x1, y1 = (int(round(v)) for v in b["bbox"])
            if x1 - x0 < 1 or y1 - y0 < 1:
                continue
            mx, my = max(2, (x1 - x0) // 4), max(2, (y1 - y0) // 4)  # a margin, so the box holds background too
            x0, y0, x1, y1 = max(0, x0 - mx), max(0, y0 - my), min(g.shape[1], x1 + mx), min(g.shape[0], y1 + my)
            mask = self.segmenter.segment(image, box=(x0, y0, x1, y1))
            inside, ring = mask[y0:y1, x0:x1], ~mask[y0:y1, x0:x1]
            if not inside.any() or not ring.any():
                continue
            brighter = g[y0:y1, x0:x1][inside].mean() > g[y0:y1, x0:x1][ring].mean()
            if brighter != dark:  # keep what has the polarity the text asked for
                out.append({"mask": mask, "score": b["score"], "label": text})
        return out


class BlobGrounder:
    """Bright (or, when the text asks for dark/hypodense/air/cyst..., dark) blobs that differ from
    their neighbourhood: a top-hat transform, Otsu on it, connected components filtered by area,
    scored by their contrast. The text only chooses the polarity: this engine reads no semantics,
    and :meth:`query_note` says so in every answer."""

    def __init__(self, radius_fraction: float = 0.15, min_area_fraction: float = 0.0005,
                 max_area_fraction: float = 0.25, work_side: int = 256) -> None:
        self.radius_fraction = float(radius_fraction)
        self.min_area_fraction = float(min_area_fraction)
        self.max_area_fraction = float(max_area_fraction)
        self.work_side = int(work_side)

    @staticmethod
    def query_note(text: str) -> tuple[str, dict[str, Any]]:
        """The tool's sentence (and ``data``) on how the query was used: for polarity only.

        >>> BlobGrounder.query_note("spleen lesion")[1]
        {'query_used': 'polarity only', 'polarity': 'bright'}
        """
        polarity = "dark" if DARK_WORDS.search(text or "") else "bright"
        return (f" This engine ignores the query's words except bright/dark: it returned {polarity} regions that "
                f"stand out from their surroundings, whatever {text!r} names.",
                {"query_used": "polarity only", "polarity": polarity})

    def detect(self, image: Image.Image, *, text: str, context: ToolContext | None = None,
               image_index: int = 0, threshold: float = 0.0, max_boxes: int = 5) -> list[dict[str, Any]]:
        w, h = image.size
        scale = min(1.0, self.work_side / max(w, h))
        small = image if scale == 1.0 else image.resize((max(1, round(w * scale)), max(1, round(h * scale))),
                                                          Image.Resampling.BILINEAR)
        g = ndimage.gaussian_filter(gray(small), 1.0)
        dark = bool(DARK_WORDS.search(text or ""))
        if dark:
            g = 1.0 - g
        radius = max(2, int(self.radius_fraction * max(g.shape)))
        # A flat square opening: separable, so O(pixels) whatever the radius (a disk is ~100x slower).
        tophat = g - ndimage.grey_opening(g, size=(2 * radius + 1, 2 * radius + 1))
        t = max(_otsu(tophat), 0.02)
        labels, n = ndimage.label(tophat > t, structure=np.ones((3, 3), bool))
        area_total = g.size
        boxes = []
        for i, sl in enumerate(ndimage.find_objects(labels), start=1):
            if sl is None:
                continue
            comp = labels[sl] == i
            area = int(comp.sum())
            if not self.min_area_fraction * area_total <= area <= self.max_area_fraction * area_total:
                continue
            contrast = float(tophat[sl][comp].mean())
            score = contrast / (contrast + 0.1)  # monotone in contrast, never saturates
            if score < threshold:
                continue
            ys, xs = sl
            bbox = [round(xs.start / scale), round(ys.start / scale), round(xs.stop / scale), round(ys.stop / scale)]
            bbox = [min(max(v, 0), lim) for v, lim in zip(bbox, (w, h, w, h))]
            boxes.append({"bbox": bbox, "label": ("dark" if dark else "bright") + " region", "score": round(score, 4)})
        boxes.sort(key=lambda b: (-b["score"], b["bbox"]))
        return boxes[:max_boxes]


class LanczosSharpen:
    """Lanczos upsampling, an unsharp mask and a 0.5 % autocontrast: what a "high-resolution
    re-render" is without super-resolution weights. It makes small features bigger and edges
    crisper; it cannot recover detail that the source pixels do not contain."""

    def __init__(self, radius: float = 2.0, percent: int = 120, threshold: int = 2, autocontrast: float = 0.5) -> None:
        self.radius = float(radius)
        self.percent = int(percent)
        self.threshold = int(threshold)
        self.autocontrast = float(autocontrast)

    def recipe(self) -> dict[str, float]:
        """The options that fix its output: with them, a client holding the source image redraws
        exactly the same pixels (the ``upscale`` recipe of :mod:`tool_backends.wire`)."""
        return {"radius": self.radius, "percent": self.percent, "threshold": self.threshold,
                "autocontrast": self.autocontrast}

    def upscale(self, image: Image.Image, size: tuple[int, int]) -> Image.Image:
        out = image.convert("RGB").resize(size, Image.Resampling.LANCZOS)
        out = out.filter(ImageFilter.UnsharpMask(radius=self.radius, percent=self.percent, threshold=self.threshold))
        if self.autocontrast > 0:
            out = ImageOps.autocontrast(out, cutoff=self.autocontrast)
        return out
