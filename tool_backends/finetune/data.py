"""What the tool trainers learn from: each distinct image of a dataset split with its annotations.

Any loader's records work (``medvqa_env.datasets``): a record's ``annotations`` hold boxes and
masks (each naming its ``image_index``) and image-level ``labels``. The same image asked about
by several questions is one training image. A mask whose label has no box also gives a box (its
extent), as the oracle does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from medvqa_env.errors import DatasetError

Bbox = tuple[float, float, float, float]


@dataclass(frozen=True)
class AnnotatedImage:
    """One image and what is annotated on it."""

    path: str
    boxes: tuple[tuple[str, Bbox], ...] = ()
    """(label, [x0, y0, x1, y1] in pixels)"""
    masks: tuple[tuple[str, str], ...] = ()
    """(label, mask file)"""
    labels: tuple[str, ...] = ()
    """image-level labels (e.g. modality, "lesion" / "no lesion")"""


def annotated_images(dataset: str, split: str, options: Mapping[str, Any] | None = None,
                     limit: int | None = None) -> list[AnnotatedImage]:
    """The distinct annotated images of ``dataset``'s ``split`` (loader ``options`` as for the env),
    in first-seen order, at most ``limit``. Raises :class:`DatasetError` when none is annotated."""
    from medvqa_env.datasets import load_dataset

    records = load_dataset(dataset, split=split, **dict(options or {}))
    seen: dict[str, AnnotatedImage] = {}
    for record in records:
        ann = record.annotations
        if ann.empty:
            continue
        for i, path in enumerate(record.image_paths):
            if path in seen:
                continue
            boxes = tuple((b.label, tuple(float(v) for v in b.bbox)) for b in ann.boxes if b.image_index == i)
            masks = tuple((m.label, m.path) for m in ann.masks if m.image_index == i)
            labels = tuple(ann.labels) if len(record.image_paths) == 1 else ()  # whose labels, in a multi-image record?
            if boxes or masks or labels:
                seen[path] = AnnotatedImage(path, boxes, masks, labels)
        if limit is not None and len(seen) >= limit:
            break
    images = list(seen.values())[:limit]
    if not images:
        raise DatasetError(f"{dataset!r} split {split!r} has no annotated images (boxes, masks or image labels) "
                           "to train a tool on")
    return images


def with_mask_boxes(image: AnnotatedImage, size: tuple[int, int]) -> list[tuple[str, Bbox]]:
    """The image's boxes, plus the extent of every mask whose label has no box (unreadable masks
    are skipped)."""
    from tool_backends.masks import load_mask, mask_bbox

    boxes = list(image.boxes)
    boxed = {label for label, _ in boxes}
    for label, path in image.masks:
        if label in boxed:
            continue
        try:
            bbox = mask_bbox(load_mask(path, size))
        except OSError:
            continue
        if bbox:
            boxes.append((label, tuple(float(v) for v in bbox)))
    return boxes


def label_counts(items: Sequence[Sequence[str]]) -> dict[str, int]:
    """How many times each label occurs, most frequent first (ties by name).

    >>> label_counts([["liver", "liver lesion"], ["liver"]])
    {'liver': 2, 'liver lesion': 1}
    """
    counts = Counter(label for labels in items for label in labels)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def read_rgb(path: str, size: int | None = None) -> tuple[np.ndarray, tuple[int, int]]:
    """The image at ``path`` as uint8 RGB (H, W, 3), resized to ``size`` square when given, read
    the way the env reads record images (any supported format); and its original (w, h)."""
    from PIL import Image

    from medvqa_env.images import load_image

    image = load_image(path).convert("RGB")
    original = image.size
    if size is not None and image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(image, np.uint8), original
