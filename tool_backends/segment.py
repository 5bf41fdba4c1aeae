"""``segment``: promptable segmentation (the seed's MedSAM2 / MedSAM3 servers).

A box or a point prompt goes to the engine (``classical``, ``oracle``, ``sam`` via transformers,
``segment_anything``); the tool measures the mask and draws it. The text gives what a model can
reason with: area in pixels and as a share of the image, the bounding box, the number of
connected components.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from PIL import Image

from medvqa_env.errors import ToolError
from tool_backends.base import Tool, ToolContext, ToolResult, ToolSpec, source_image
from tool_backends.engines import build_engine
from tool_backends.geometry import BBOX_SCHEMA, COORDINATES_SCHEMA, resolve_bbox
from tool_backends.masks import count_components, mask_bbox, mask_to_rle, overlay_mask

IMAGE_INDEX_SCHEMA = {"type": "integer", "default": 0,
                      "description": "which image of the conversation (0 = the original)"}
POINT_SCHEMA = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
                "description": "[x, y] of a point inside the structure"}


def resolve_point(point: Sequence[float], size: tuple[int, int], coordinates: str) -> tuple[int, int]:
    """A model-written point -> integer pixels inside the image, or a ToolError.

    >>> resolve_point([0.5, 0.25], (200, 100), "normalized")
    (100, 25)
    """
    w, h = size
    x, y = float(point[0]), float(point[1])
    if coordinates == "normalized":
        x, y = x * w, y * h
    elif coordinates == "norm1000":
        x, y = x * w / 1000, y * h / 1000
    if not (0 <= x <= w and 0 <= y <= h):
        raise ToolError(f"point {list(point)} lies outside the image ({w}x{h} pixels, {coordinates} coordinates).")
    return min(int(x), w - 1), min(int(y), h - 1)


class SegmentTool(Tool):
    """Segment the structure under a box or point prompt on image ``image_index``."""

    def __init__(self, engine: str = "classical", max_side: int = 4096, **engine_options: Any) -> None:
        self.engine_name = engine
        self.engine = build_engine("segment", engine, **engine_options)
        self.max_side = int(max_side)
        self.spec = ToolSpec(
            name="segment",
            description=(
                "Segment the structure or lesion inside a box (or at a point) of an image. Returns its area "
                "(pixels and % of the image), bounding box and number of parts, and the mask drawn on the image."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "bbox": {**BBOX_SCHEMA, "description": "[x0, y0, x1, y1] box around the structure"},
                    "point": POINT_SCHEMA,
                    "image_index": IMAGE_INDEX_SCHEMA,
                    "coordinates": COORDINATES_SCHEMA,
                    "label": {"type": "string", "maxLength": 200, "description": "what you want segmented (optional)"},
                },
                "required": [],
                "additionalProperties": False,
            },
        )

    def run(self, images: Sequence[Image.Image], arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        image, source = source_image(images, arguments["image_index"])
        if "bbox" not in arguments and "point" not in arguments:
            raise ToolError("segment needs a prompt: give 'bbox' [x0, y0, x1, y1] or 'point' [x, y].")
        if max(image.size) > self.max_side:
            raise ToolError(f"image {source} is {image.size[0]}x{image.size[1]}; segment takes at most "
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
        prompt = f"box {list(box)}" if box is not None else f"point {list(point)}"
        area = int(mask.sum())
        data: dict[str, Any] = {"image_index": source, "engine": self.engine_name, "prompt_box": list(box) if box else None,
                                "prompt_point": list(point) if point else None, "area_px": area,
                                "area_fraction": area / mask.size, "mask_rle": mask_to_rle(mask)}
        if area == 0:
            data.update(region=list(box) if box else None, bbox=None, n_components=0)
            return ToolResult(text=f"No structure found at the {prompt} of image {source}.", data=data)
        bbox = mask_bbox(mask)
        n = count_components(mask)
        data.update(region=bbox, bbox=bbox, n_components=n, image_recipe="mask_overlay")
        text = (f"Segmented the {prompt} of image {source}: area {area} px ({100 * area / mask.size:.2f}% of the "
                f"image), bounding box {bbox}, {n} connected component{'s' if n != 1 else ''}. "
                "The mask is drawn in red on the new image.")
        return ToolResult(text=text, images=[overlay_mask(image, mask)], data=data)

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close:
            close()
