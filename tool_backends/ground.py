"""``ground``: open-vocabulary detection from a text prompt (the seed's GroundingDINO-med server).

Engines: ``classical`` (bright/dark blobs), ``oracle`` (annotated boxes), ``owlvit`` and
``grounding_dino`` via transformers, ``groundingdino`` (the original package, in its own venv),
``centernet`` (a grounder trained by ``python -m tool_backends.finetune ground``) and ``trained``
(the same, trained on first use and cached).

An engine may say how it used the query (``query_note(text) -> (sentence, data)``: the classical
engine reads only bright/dark, a trained one the labels it knows) and may recommend a default
score threshold (``default_threshold``, e.g. one chosen on validation data); the tool passes both on.
"""

from __future__ import annotations

from typing import Any, Sequence

from PIL import Image

from medvqa_env.errors import ToolError
from medvqa_env.images import LazyImage
from tool_backends.base import Tool, ToolContext, ToolResult, ToolSpec, random_weights_note, source_image
from tool_backends.engines import build_engine
from tool_backends.geometry import coordinates_schema, show_box, unit
from tool_backends.masks import draw_boxes
from tool_backends.segment import IMAGE_INDEX_SCHEMA


def clean_boxes(boxes: Sequence[dict[str, Any]], size: tuple[int, int]) -> list[dict[str, Any]]:
    """Clip engine boxes to the image, round them, drop empty ones.

    >>> clean_boxes([{"bbox": [-3, 2.26, 50, 9], "label": "x", "score": 0.91234}], (40, 40))
    [{'bbox': [0.0, 2.3, 40.0, 9.0], 'label': 'x', 'score': 0.9123}]
    """
    w, h = float(size[0]), float(size[1])
    out = []
    for b in boxes:
        x0, y0, x1, y1 = (float(v) for v in b["bbox"])
        x0, x1 = min(max(x0, 0.0), w), min(max(x1, 0.0), w)
        y0, y1 = min(max(y0, 0.0), h), min(max(y1, 0.0), h)
        if x1 - x0 < 1 or y1 - y0 < 1:
            continue
        out.append({"bbox": [round(x0, 1), round(y0, 1), round(x1, 1), round(y1, 1)],
                    "label": str(b.get("label", "")), "score": round(float(b.get("score", 0.0)), 4)})
    return out


DEFAULT_THRESHOLD = 0.1


class GroundTool(Tool):
    """Find regions of image ``image_index`` matching a text prompt; boxes with scores."""

    def __init__(self, engine: str = "classical", default_threshold: float | None = None, max_boxes: int = 5,
                 max_side: int = 4096, box_convention: str = "pixels", name: str = "ground",
                 **engine_options: Any) -> None:
        self.engine_name = engine
        self.engine = build_engine("ground", engine, **engine_options)
        if default_threshold is None:  # the engine's own (chosen on validation data), else 0.1
            default_threshold = getattr(self.engine, "default_threshold", None)
            default_threshold = DEFAULT_THRESHOLD if default_threshold is None else default_threshold
        self.max_boxes = int(max_boxes)
        self.max_side = int(max_side)
        self.spec = ToolSpec(
            name=name,
            description=("Locate what a short text describes (e.g. 'nodule', 'left kidney', 'bright lesion') in an "
                         "image. Returns boxes [x0, y0, x1, y1] (in the 'coordinates' convention) with confidence "
                         "scores, drawn on a new image."),
            parameters={
                "type": "object",
                "properties": {
                    "text": {"type": "string", "maxLength": 200, "description": "what to find"},
                    "image_index": IMAGE_INDEX_SCHEMA,
                    "threshold": {"type": "number", "minimum": 0, "maximum": 1, "default": float(default_threshold),
                                  "description": "minimum score of a box"},
                    "max_boxes": {"type": "integer", "minimum": 1, "maximum": 20, "default": self.max_boxes},
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
            raise ToolError(f"{self.name} needs a non-empty 'text' saying what to find.")
        if max(image.size) > self.max_side:
            raise ToolError(f"image {source} is too large for {self.name} ({image.size[0]}x{image.size[1]}).")
        raw = self.engine.detect(image, text=text, context=context, image_index=source,
                                 threshold=arguments["threshold"], max_boxes=arguments["max_boxes"])
        boxes = clean_boxes(raw, image.size)
        boxes = [b for b in boxes if b["score"] >= arguments["threshold"]][: arguments["max_boxes"]]
        note = random_weights_note(self.engine, self.engine_name)
        query_note = getattr(self.engine, "query_note", None)
        how, how_data = query_note(text) if query_note else ("", {})
        data = {"image_index": source, "engine": self.engine_name, "query": text, **how_data, "boxes": boxes,
                "random_weights": bool(note)}
        note = how + note
        if not boxes:
            return ToolResult(text=f"Found nothing matching {text!r} in image {source}.{note}", data=data)
        data["image_recipe"] = "boxes"
        coords = arguments["coordinates"]
        listing = "; ".join(f"{i + 1}: {show_box(b['bbox'], image.size, coords)} ({b['label'] or text}, "
                            f"score {b['score']:.2f})" for i, b in enumerate(boxes))
        units = "" if coords == "pixel" else f" ({unit(coords)})"
        return ToolResult(text=f"Found {len(boxes)} region{'s' if len(boxes) != 1 else ''} matching {text!r} in image "
                               f"{source}{units}: {listing}. The boxes are drawn, numbered, on the new image.{note}",
                          images=[LazyImage(lambda: draw_boxes(image, boxes), image.size)], data=data)

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close:
            close()
