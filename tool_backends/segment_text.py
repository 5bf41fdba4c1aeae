"""``segment_text``: text-prompted segmentation (the seed's BiomedParse server: a phrase -> mask,
area, box).

Engines: ``classical`` (blobs of the polarity the text asks for, each segmented),
``oracle`` (annotated masks whose label matches), ``sam3`` / ``medsam3`` (SAM 3's concept model
via transformers) and ``biomedparse`` (the original package, in its own venv). The instances an
engine finds above ``threshold`` are merged into one mask, measured like ``segment``'s, and each
instance's box and score is listed.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from PIL import Image

from medvqa_env.errors import ToolError
from medvqa_env.images import LazyImage
from tool_backends.base import Tool, ToolContext, ToolResult, ToolSpec, random_weights_note, source_image
from tool_backends.engines import build_engine
from tool_backends.geometry import coordinates_schema, show_box
from tool_backends.masks import mask_bbox, mask_to_rle, overlay_mask
from tool_backends.segment import IMAGE_INDEX_SCHEMA, describe_mask


class SegmentTextTool(Tool):
    """Segment what a short text names (an organ, a lesion, a structure) on image ``image_index``."""

    def __init__(self, engine: str = "classical", default_threshold: float = 0.3, max_instances: int = 5,
                 max_side: int = 4096, box_convention: str = "pixels", name: str = "segment_text",
                 **engine_options: Any) -> None:
        self.engine_name = engine
        self.engine = build_engine("segment_text", engine, **engine_options)
        self.max_side = int(max_side)
        self.spec = ToolSpec(
            name=name,
            description=("Segment what a short text names (e.g. 'liver', 'left kidney', 'tumor') in an image. Returns "
                         "the area (pixels and % of the image), bounding box and number of parts of what it found, "
                         "each instance's box and score, and the mask drawn on a new image."),
            parameters={
                "type": "object",
                "properties": {
                    "text": {"type": "string", "maxLength": 200, "description": "what to segment"},
                    "image_index": IMAGE_INDEX_SCHEMA,
                    "threshold": {"type": "number", "minimum": 0, "maximum": 1, "default": float(default_threshold),
                                  "description": "minimum score of an instance"},
                    "max_instances": {"type": "integer", "minimum": 1, "maximum": 20, "default": int(max_instances)},
                    "coordinates": coordinates_schema(box_convention),
                },
                "required": ["text"],
                "additionalProperties": False,
            },
        )

    def run(self, images: Sequence[Image.Image], arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        image, source = source_image(images, arguments["image_index"])
        text = arguments["text"].strip()
        if not text:
            raise ToolError(f"{self.name} needs a non-empty 'text' saying what to segment.")
        if max(image.size) > self.max_side:
            raise ToolError(f"image {source} is {image.size[0]}x{image.size[1]}; {self.name} takes at most "
                            f"{self.max_side} pixels a side. Zoom in first.")
        found = self.engine.segment_text(image, text=text, threshold=arguments["threshold"],
                                         max_instances=arguments["max_instances"], context=context,
                                         image_index=source)
        shape = (image.size[1], image.size[0])
        instances = []
        for inst in found:
            mask = np.asarray(inst["mask"], bool)
            if mask.shape != shape:
                raise ToolError(f"the engine returned a {mask.shape} mask for a {image.size[0]}x{image.size[1]} image.")
            if mask.any() and float(inst.get("score", 0.0)) >= arguments["threshold"]:
                instances.append((mask, float(inst.get("score", 0.0)), str(inst.get("label") or text)))
        instances = sorted(instances, key=lambda t: -t[1])[: arguments["max_instances"]]
        note = random_weights_note(self.engine, self.engine_name)
        coords = arguments["coordinates"]
        data: dict[str, Any] = {"image_index": source, "engine": self.engine_name, "query": text,
                                "random_weights": bool(note)}
        if not instances:
            empty = np.zeros(shape, bool)
            data.update(area_px=0, area_fraction=0.0, mask_rle=mask_to_rle(empty), region=None, bbox=None,
                        n_components=0, boxes=[])
            return ToolResult(text=f"Found nothing matching {text!r} to segment in image {source}.{note}", data=data)
        union = np.logical_or.reduce([m for m, _, _ in instances])
        measured, sentence = describe_mask(image, union, coords)
        boxes = [{"bbox": mask_bbox(m), "label": lab, "score": round(score, 4)} for m, score, lab in instances]
        data.update(measured, boxes=boxes)
        listing = "; ".join(f"{i + 1}: {show_box(b['bbox'], image.size, coords)} ({b['label']}, score {b['score']:.2f})"
                            for i, b in enumerate(boxes))
        plural = "s" if len(boxes) != 1 else ""
        text_out = (f"Segmented {text!r} in image {source}: {sentence}; {len(boxes)} instance{plural}: {listing}. "
                    f"The mask is drawn in red on the new image.{note}")
        overlay = LazyImage(lambda: overlay_mask(image, union), image.size)  # drawn only if someone reads it
        return ToolResult(text=text_out, images=[overlay], data=data)

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close:
            close()
