"""Registers the tools that ship with MedVQA-Gym (imported lazily by the registry)."""

from __future__ import annotations

from tool_backends.classify import ClassifyTool
from tool_backends.ground import GroundTool
from tool_backends.hires import HiresRenderTool
from tool_backends.registry import register_tool
from tool_backends.segment import SegmentTool
from tool_backends.zoom import ZoomTool

register_tool("image_zoom_in")(ZoomTool)
register_tool("segment")(SegmentTool)
register_tool("ground")(GroundTool)
register_tool("classify")(ClassifyTool)
register_tool("hires_render")(HiresRenderTool)

DEFAULT_TOOLS = ("image_zoom_in",)
