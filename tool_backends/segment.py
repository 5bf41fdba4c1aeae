"""``segment``: promptable segmentation (the seed's MedSAM2 / MedSAM3 servers).

A box or a point prompt goes to the engine (``classical``, ``oracle``, ``sam`` / ``sam2`` /
``medsam3`` via transformers, ``segment_anything``); the tool measures the mask and draws it. The
text gives what a model can reason with: area in pixels and as a share of the image, the bounding
box, the number of connected components. :func:`describe_mask` is shared with ``segment_text``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from PIL import Image

from medvqa_env.errors import ToolError
from medvqa_env.images import LazyImage
from tool_backends.base import Tool, ToolContext, ToolResult, ToolSpec, random_weights_note, source_image
from tool_backends.engines import build_engine
from tool_backends.geometry import (BBOX_SCHEMA, coordinates_schema, resolve_bbox, resolve_point, show_box,
                                    show_point, unit)
from tool_backends.masks import count_components, mask_bbox, mask_to_rle, overlay_mask

__all__ = ["IMAGE_INDEX_SCHEMA", "POINT_SCHEMA", "SegmentTool", "describe_mask", "resolve_point"]

IMAGE_INDEX_SCHEMA = {"type": "integer", "default": 0,
                      "description": "which image of the conversation (0 = the original)"}
POINT_SCHEMA = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
                "description": "[x, y] of a point inside the structure (point_2d is accepted too)"}


def describe_mask(image: Image.Image, mask: np.ndarray, coords: str) -> tuple[dict[str, Any], str]:
    """Measurements of a non-empty mask (data keys and the sentence the model reads)."""
    area = int(mask.sum())
    bbox = mask_bbox(mask)
    n = count_components(mask)
    data = {"area_px": area, "area_fraction": area / mask.size, "mask_rle": mask_to_rle(mask), "region": bbox,
            "bbox": bbox, "n_components": n, "image_recipe": "mask_overlay"}
    text = (f"area {area} px ({100 * area / mask.size:.2f}% of the image), bounding box "
            f"{show_box(bbox, image.size, coords)} ({unit(coords)}), {n} connected component{'s' if n != 1 else ''}")
    return data, text


class SegmentTool(Tool):
    """Segment the structure under a box or point prompt on image ``image_index``."""

    def __init__(self, engine: str = "classical", max_side: int = 4096, box_convention: str = "pixels",
                 name: str = "segment", **engine_options: Any) -> None:
        self.engine_name = engine
        self.engine = build_engine("segment", engine, **engine_options)
        self.max_side = int(max_side)
        self.spec = ToolSpec(
            name=name,
            description=(
                "Segment the structure or lesion inside a box (or at a point) of an image. Returns its area "
                "(pixels and % of the image), bounding box and number of parts, and the mask drawn on the image."
                + getattr(self.engine, "description_note", "")  # what model draws the mask, when it is a real one
            ),
            parameters={
                "type": "object",
                "properties": {
                    "bbox": {**BBOX_SCHEMA, "description": "[x0, y0, x1, y1] box around the structure "
                                                           "(bbox_2d is accepted too)"},
                    "point": POINT_SCHEMA,
                    "image_index": IMAGE_INDEX_SCHEMA,
                    "coordinates": coordinates_schema(box_convention),
                    "label": {"type": "string", "maxLength": 200, "description": "what you want segmented (optional)"},
                },
                "required": [],
                "additionalProperties": False,
            },
        )

    def run(self, images: Sequence[Image.Image], arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        image, source = source_image(images, arguments["image_index"])
        if "bbox" not in arguments and "point" not in arguments:
            raise ToolError(f"{self.name} needs a prompt: give 'bbox' [x0, y0, x1, y1] or 'point' [x, y].")
        if max(image.size) > self.max_side:
            raise ToolError(f"image {source} is {image.size[0]}x{image.size[1]}; {self.name} takes at most "
                            f"{self.max_side} pixels a side. Zoom in first.")
        coords = arguments["coordinates"]
        box = resolve_bbox(arguments["bbox"], image.size, coords) if "bbox" in arguments else None
        point = resolve_point(arguments["point"], image.size, coords) if "point" in arguments else None
        mask = self.engine.segment(image, box=box, point=point, label=arguments.get("label"),
                                   context=context, image_index=source)
        mask = np.asarray(mask, bool)
        if mask.shape != (image.size[1], image.size[0]):
            raise ToolError(f"the segmentation engine returned a {mask.shape} mask for a "
                            f"{image.size[0]}x{image.size[1]} image.")
        prompt = (f"box {show_box(box, image.size, coords)}" if box is not None
                  else f"point {show_point(point, image.size, coords)}")
        note = random_weights_note(self.engine, self.engine_name)
        data: dict[str, Any] = {"image_index": source, "engine": self.engine_name, "prompt_box": list(box) if box else None,
                                "prompt_point": list(point) if point else None, "random_weights": bool(note)}
        if not mask.any():
            data.update(area_px=0, area_fraction=0.0, mask_rle=mask_to_rle(mask), region=list(box) if box else None,
                        bbox=None, n_components=0)
            return ToolResult(text=f"No structure found at the {prompt} of image {source}.{note}", data=data)
        measured, sentence = describe_mask(image, mask, coords)
        data.update(measured)
        text = (f"Segmented the {prompt} of image {source}: {sentence}. The mask is drawn in red on the new "
                f"image.{note}")
        overlay = LazyImage(lambda: overlay_mask(image, mask), image.size)  # drawn only if someone reads it
        return ToolResult(text=text, images=[overlay], data=data)

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close:
            close()
