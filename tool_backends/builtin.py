"""Registers the tools that ship with MedVQA-Gym (imported lazily by the registry)."""

from __future__ import annotations

from tool_backends.registry import register_tool
from tool_backends.zoom import ZoomTool

register_tool("image_zoom_in")(ZoomTool)

DEFAULT_TOOLS = ("image_zoom_in",)
