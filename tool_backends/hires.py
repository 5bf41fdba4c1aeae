"""``hires_render``: re-render a region at high resolution for small features (the seed's
``agent4k_resolution`` server).

The seed's server runs a learned super-resolution model. With no such weights here the only engine
is ``classical``: Lanczos upsampling, unsharp mask and a light autocontrast. Compared with
``image_zoom_in`` (bicubic) it gives a larger output and crisper edges, and it says so in its
output text: it cannot invent detail the pixels do not hold.
"""

from __future__ import annotations

from typing import Any, Sequence

from PIL import Image

from medvqa_env.images import LazyImage
from tool_backends.base import Tool, ToolContext, ToolResult, ToolSpec, source_image
from tool_backends.engines import build_engine
from tool_backends.geometry import BBOX_SCHEMA, coordinates_schema, expand_to_min_size, resolve_bbox, show_box, unit
from tool_backends.segment import IMAGE_INDEX_SCHEMA


class HiresRenderTool(Tool):
    """Upsample ``bbox`` (default: the whole image) of image ``image_index`` by ``scale``."""

    def __init__(self, engine: str = "classical", max_side: int = 2048, min_size: int = 16,
                 box_convention: str = "pixels", name: str = "hires_render", **engine_options: Any) -> None:
        self.engine_name = engine
        self.engine = build_engine("hires", engine, **engine_options)
        self.max_side = int(max_side)
        self.min_size = int(min_size)
        self.spec = ToolSpec(
            name=name,
            description=("Re-render a region of an image at higher resolution (upsampled and sharpened) to inspect "
                         "small features. Returns the new image."),
            parameters={
                "type": "object",
                "properties": {
                    "bbox": {**BBOX_SCHEMA, "description": "optional [x0, y0, x1, y1] region; default the whole "
                                                           "image (bbox_2d is accepted too)"},
                    "image_index": IMAGE_INDEX_SCHEMA,
                    "coordinates": coordinates_schema(box_convention),
                    "scale": {"type": "number", "minimum": 1, "maximum": 8, "default": 4,
                              "description": "magnification (the output is capped at the tool's max side)"},
                },
                "required": [],
                "additionalProperties": False,
            },
        )

    def run(self, images: Sequence[Image.Image], arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        image, source = source_image(images, arguments["image_index"])
        w, h = image.size
        coords = arguments["coordinates"]
        if "bbox" in arguments:
            box = resolve_bbox(arguments["bbox"], image.size, coords)
            box = expand_to_min_size(box, image.size, self.min_size)
        else:
            box = (0, 0, w, h)
        cw, ch = box[2] - box[0], box[3] - box[1]
        scale = min(float(arguments["scale"]), self.max_side / max(cw, ch))
        scale = max(scale, 1.0) if max(cw, ch) <= self.max_side else scale
        size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
        data = {"image_index": source, "region": list(box), "scale": round(scale, 4), "engine": self.engine_name,
                "size": list(size)}
        recipe = getattr(self.engine, "recipe", None)
        if recipe is not None:  # a pure function of the source: drawn when first read, sent as a recipe
            engine = self.engine
            out = LazyImage(lambda: engine.upscale(image.crop(box), size), size)
            data.update(image_recipe="upscale", render=recipe())
        else:
            out = self.engine.upscale(image.crop(box), size)
        text = (f"Re-rendered region {show_box(box, image.size, coords)} ({unit(coords)}) of image {source} at "
                f"{scale:.2f}x ({size[0]}x{size[1]} pixels) with "
                f"the {self.engine_name} engine. Edges are sharpened; no detail beyond the source pixels is added.")
        return ToolResult(text=text, images=[out], data=data)
