"""Registers the tools that ship with MedVQA-Gym (imported lazily by the registry), under our names
and under the names seed 000's tool servers (and verl's zoom tool) go by.

An alias builds the same tool under the other name, so its schema in the system prompt, the
calls a model makes and the tool's own messages all use that name: a checkpoint trained against
the seed's servers calls ``medsam2`` or ``biomedclip`` and gets an answer.

>>> from tool_backends.registry import build_tool
>>> build_tool("agent4k_resolution").spec.name
'agent4k_resolution'
>>> sorted(seed000_tools())
['agent4k_resolution', 'biomedclip', 'biomedparse', 'groundingdino-med', 'image_zoom_in', 'medsam2', 'medsam3']
"""

from __future__ import annotations

from functools import partial
from typing import Any

from tool_backends.classify import ClassifyTool
from tool_backends.ground import GroundTool
from tool_backends.hires import HiresRenderTool
from tool_backends.registry import TOOLS, register_tool
from tool_backends.segment import SegmentTool
from tool_backends.segment_text import SegmentTextTool
from tool_backends.zoom import ZoomTool

TOOL_CLASSES = {
    "image_zoom_in": ZoomTool,
    "segment": SegmentTool,
    "segment_text": SegmentTextTool,
    "ground": GroundTool,
    "classify": ClassifyTool,
    "hires_render": HiresRenderTool,
}

TOOL_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    # seed 000's servers: name -> (our tool, options that differ from its defaults)
    "biomedclip": ("classify", {}),
    "biomedparse": ("segment_text", {}),
    "medsam2": ("segment", {}),
    "medsam3": ("segment", {}),
    "groundingdino-med": ("ground", {}),
    "agent4k_resolution": ("hires_render", {}),
    # verl's image_zoom_in_tool (DeepEyes and verl's multi-turn examples)
    "image_zoom_in_tool": ("image_zoom_in", {}),
}
"""Other names for our tools. The engine stays the tool's default (offline, no weights) unless
configured; docs/tools.md lists the engine and checkpoint that match each seed server."""

SEED_000_TOOLS = ("biomedclip", "biomedparse", "medsam2", "medsam3", "groundingdino-med", "image_zoom_in",
                  "agent4k_resolution")

for _name, _cls in TOOL_CLASSES.items():
    register_tool(_name)(_cls)
for _alias, (_target, _options) in TOOL_ALIASES.items():
    if _alias not in TOOLS:  # this module may be imported twice (doctest); partials never compare equal
        register_tool(_alias)(partial(TOOL_CLASSES[_target], **{**_options, "name": _alias}))

DEFAULT_TOOLS = ("image_zoom_in",)


def seed000_tools(box_convention: str = "qwen3_grid", **engines: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A tool config with seed 000's seven tools under its names, in-process, boxes in the
    convention of its policy (Qwen3-VL: ``qwen3_grid``). ``engines`` overrides one tool's options,
    e.g. ``seed000_tools(medsam2={"engine": "sam2", "model": "/models/medsam2-hf"})``."""
    config: dict[str, dict[str, Any]] = {}
    for name in SEED_000_TOOLS:
        config[name] = {"backend": "local", "box_convention": box_convention, **engines.get(name.replace("-", "_"), {})}
    return config
