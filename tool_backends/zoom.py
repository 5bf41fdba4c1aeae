"""``image_zoom_in``: crop a box of an episode image and enlarge it (the seed's in-process tool)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from PIL import Image

from medvqa_env.images import LazyImage
from tool_backends.base import Tool, ToolContext, ToolResult, ToolSpec, source_image
from tool_backends.geometry import BBOX_SCHEMA, coordinates_schema, expand_to_min_size, resolve_bbox, show_box, unit
from tool_backends.observation_image import ObservationImage, attach, encoded_once


def zoomed_size(box: tuple[int, int, int, int], target_short_side: int, max_side: int) -> tuple[int, int]:
    """The enlarged crop's size: short side ``target_short_side``, never past ``max_side``.

    >>> zoomed_size((0, 0, 100, 50), 336, 1024)
    (672, 336)
    """
    w, h = box[2] - box[0], box[3] - box[1]
    scale = min(max(1.0, target_short_side / min(w, h)), max_side / max(w, h))
    return (w, h) if scale == 1.0 else (max(1, round(w * scale)), max(1, round(h * scale)))


CROP_STYLES = ("zoom", "verl_tool")
"""``zoom``: this project's (the box, grown to ``min_size``, enlarged to ``target_short_side``);
``verl_tool``: verl-tool's ``pixel_reasoner`` crop, for a checkpoint trained against it."""


def verl_tool_box(box: tuple[int, int, int, int], size: tuple[int, int], padding: float = 0.1) -> tuple[int, int, int, int]:
    """verl-tool's crop region: ``box`` grown by ``padding`` of the image's width/height on each side
    (at most 600 px), clipped to the image, ends truncated to whole pixels.

    >>> verl_tool_box((64, 64, 181, 181), (256, 256))
    (38, 38, 206, 206)
    """
    w, h = size
    px, py = min(padding, 600.0 / w), min(padding, 600.0 / h)
    x0, y0 = min(max(0.0, box[0] / w - px), 1.0), min(max(0.0, box[1] / h - py), 1.0)
    x1, y1 = min(max(0.0, box[2] / w + px), 1.0), min(max(0.0, box[3] / h + py), 1.0)
    return int(x0 * w), int(y0 * h), int(x1 * w), int(y1 * h)


def qwen_vl_size(width: int, height: int, factor: int = 28, min_pixels: int = 4 * 28 * 28,
                 max_pixels: int = 5120 * 28 * 28) -> tuple[int, int]:
    """The size a Qwen-VL image processor (and verl-tool's crop) resizes to: each side the nearest
    multiple of ``factor`` (at least one), then scaled into ``[min_pixels, max_pixels]``. This is
    verl-tool's ``smart_resize`` (qwen_vl_utils' copy), which floors the first rounding at one
    ``factor``; transformers' own agrees wherever both sides are over ``factor / 2`` (tests compare
    them) and not below. Written here: importing transformers' takes seconds and torch, which a
    classical tool server otherwise never loads.

    >>> qwen_vl_size(168, 168), qwen_vl_size(150, 100), qwen_vl_size(20, 10)
    ((168, 168), (140, 112), (84, 56))
    """
    h_bar, w_bar = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar, w_bar = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def crop_and_resize(image: Image.Image, box: tuple[int, int, int, int], target_short_side: int,
                    max_side: int) -> Image.Image:
    """The bare operation the tool wraps (the baseline in ``benchmarks/bench_env.py``)."""
    return crop_to_size(image, box, zoomed_size(box, target_short_side, max_side))


def crop_to_size(image: Image.Image, box: tuple[int, int, int, int], size: tuple[int, int]) -> Image.Image:
    """``box`` of ``image`` at ``size`` (bicubic when it differs): the zoom's pixels from its result
    data alone, which is how a remote zoom's crop travels (the ``crop`` recipe of
    :mod:`tool_backends.wire`, redrawn on the client from the image it sent)."""
    crop = image.crop(box)
    return crop if crop.size == tuple(size) else crop.resize(tuple(size), Image.Resampling.BICUBIC)


class ZoomTool(Tool):
    """Crop ``bbox`` from image ``image_index`` and upscale it so small findings become visible.

    Boxes smaller than ``min_size`` pixels are grown around their centre (a 3-pixel crop tells the
    model nothing); the crop is enlarged until its short side is ``target_short_side``, never past
    ``max_side``. ``box_convention`` (``pixels``, ``qwen3_grid``, ``normalized``) is how the
    policy writes boxes by default; ``name`` renames the tool (the seed's and verl's names).

    ``crop_style="verl_tool"`` crops as verl-tool's ``pixel_reasoner`` does (so a policy trained
    against its server sees the pixels it was trained on): the box grown by 10 % of the image a side
    (:func:`verl_tool_box`), resized only to the nearest multiples of 28 (:func:`qwen_vl_size`),
    ``min_size`` and ``target_short_side`` not applied. Serve it under verl-tool's name with
    ``name="crop_image"``; its ``target_image`` argument is read as ``image_index`` + 1.

    ``observation_image`` (:mod:`tool_backends.observation_image`: ``max_side``, ``format``,
    ``quality``) is what the policy gets: the crop is drawn at most ``max_side`` a side in one
    resample, and in a lossy format its pixels are the decoded JPEG/WebP, whose bytes
    ``/get_observation`` sends as they are. Such a crop travels over ``/call`` as pixels, not as a
    recipe (a client's redraw would skip the codec). ``None``: today's crop, lossless.
    """

    def __init__(self, min_size: int = 28, target_short_side: int = 336, max_side: int = 1024,
                 box_convention: str = "pixels", name: str = "image_zoom_in",
                 observation_image: ObservationImage | dict | str | None = None, crop_style: str = "zoom") -> None:
        if crop_style not in CROP_STYLES:
            from medvqa_env.errors import ConfigError, unknown_name_message

            raise ConfigError(unknown_name_message("image_zoom_in crop_style", str(crop_style), list(CROP_STYLES)))
        self.crop_style = crop_style
        self.min_size = int(min_size)
        self.target_short_side = int(target_short_side)
        self.observation_image = None if observation_image is None else ObservationImage.parse(observation_image)
        self.max_side = int(max_side) if self.observation_image is None else self.observation_image.cap(max_side)
        self.spec = ToolSpec(
            name=name,
            description=(
                "Zoom into a rectangular region of an image to see small details. Returns the enlarged crop "
                "as a new image."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "bbox": BBOX_SCHEMA,
                    "image_index": {"type": "integer", "default": 0,
                                    "description": "which image of the conversation (0 = the original)"},
                    "coordinates": coordinates_schema(box_convention),
                    "label": {"type": "string", "maxLength": 200, "description": "what you expect to see (optional)"},
                },
                "required": ["bbox"],
                "additionalProperties": False,
            },
        )

    def run(self, images: Sequence[Image.Image], arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        image, source = source_image(images, arguments["image_index"])
        coords = arguments["coordinates"]
        box = resolve_bbox(arguments["bbox"], image.size, coords)
        if self.crop_style == "verl_tool":
            box = verl_tool_box(box, image.size)
            size = qwen_vl_size(box[2] - box[0], box[3] - box[1])
            if self.observation_image is not None:
                size = self.observation_image.fit(size)  # a max_side, when given, still caps it
        else:
            box = expand_to_min_size(box, image.size, self.min_size)
            size = zoomed_size(box, self.target_short_side, self.max_side)
        data = {"region": list(box), "image_index": source, "size": list(size), "image_recipe": "crop"}
        setting = self.observation_image
        # Drawn when first read: a server that sends the crop as a recipe never draws it.
        if setting is None or setting.lossless:
            crop = LazyImage(lambda: crop_to_size(image, box, size), size, image.mode)
            if setting is not None:
                attach(crop, setting)
        else:  # the policy sees the decoded JPEG/WebP; its bytes go with it (made without decoding them)
            produce, decoded = encoded_once(lambda: crop_to_size(image, box, size), setting)
            crop = LazyImage(lambda _source=image: decoded(), size, "RGB")  # named: ToolCache.retained_by counts it
            attach(crop, setting, produce=produce)
            del data["image_recipe"]
        return ToolResult(
            text=(f"Zoomed into region {show_box(box, image.size, coords)} ({unit(coords)}) of image {source}; "
                  f"enlarged to {size[0]}x{size[1]}."),
            images=[crop],
            data=data,
        )

