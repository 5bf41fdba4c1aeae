"""One coordinate frame: the image the agent sees is the image the tools measure.

An image larger than the env's ``max_image_side`` is downscaled once, when the episode starts;
from then on the episode holds only the shown copy, so a box the agent reads off its image is a
box of the image every tool crops, segments and measures, and every box a tool reports is one the
agent can find on its image. The record's annotations (boxes in the file's pixels) are scaled
into the same frame for the oracle engines and the grounding rewards.

>>> from PIL import Image
>>> shown, scale = fit_image(Image.new("RGB", (8000, 2000)), 4096)
>>> shown.size, scale
((4096, 1024), (0.512, 0.512))
>>> fit_image(Image.new("RGB", (28, 28)), 4096)[1]
(1.0, 1.0)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from PIL import Image

from medvqa_env.records import Annotations


def fit_image(image: Image.Image, max_side: int) -> tuple[Image.Image, tuple[float, float]]:
    """``image`` scaled down (never up) so its longer side is at most ``max_side``, and the
    (x, y) factors from the file's pixels to the shown image's pixels."""
    w, h = image.size
    if max(w, h) <= max_side:
        return image, (1.0, 1.0)
    ratio = max_side / max(w, h)
    size = (max(1, round(w * ratio)), max(1, round(h * ratio)))
    shown = image.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    return shown, (size[0] / w, size[1] / h)


def scale_annotations(annotations: Annotations, scales: Sequence[tuple[float, float]]) -> Annotations:
    """Annotation boxes moved from file pixels to shown pixels (``scales[i]`` for image ``i``).
    Masks are files read at the shown size by their users, so they need nothing.

    >>> from medvqa_env.records import Box
    >>> scale_annotations(Annotations(boxes=(Box("x", (100, 40, 200, 80)),)), [(0.5, 0.25)]).boxes[0].bbox
    (50.0, 10.0, 100.0, 20.0)
    """
    if all(s == (1.0, 1.0) for s in scales) or not annotations.boxes:
        return annotations
    boxes = []
    for box in annotations.boxes:
        sx, sy = scales[box.image_index] if 0 <= box.image_index < len(scales) else (1.0, 1.0)
        x0, y0, x1, y1 = box.bbox
        boxes.append(replace(box, bbox=(x0 * sx, y0 * sy, x1 * sx, y1 * sy)))
    return replace(annotations, boxes=tuple(boxes))


def frame_note(original_sizes: Sequence[tuple[int, int]], shown: Sequence[Image.Image]) -> str:
    """The line the agent reads when an image was downscaled for display ("" when none was)."""
    changed = [(i, o, s.size) for i, (o, s) in enumerate(zip(original_sizes, shown)) if tuple(o) != s.size]
    if not changed:
        return ""
    parts = "; ".join(f"image {i} ({o[0]}x{o[1]} pixels) is shown downscaled to {s[0]}x{s[1]}"
                      for i, o, s in changed)
    return (f"Note: {parts}. Tools measure the image as shown: pixel coordinates refer to the shown size "
            "(normalized coordinates work too).")
