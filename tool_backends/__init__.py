"""Tool backends: the tools an agent can call, run in-process or behind HTTP, chosen by config."""

from tool_backends.base import Tool, ToolContext, ToolResult, ToolSpec
from tool_backends.registry import available_tools, build_tool, register_tool
from tool_backends.toolbox import LocalBackend, ToolCache, ToolCallRecord, Toolbox

__all__ = ["Tool", "ToolContext", "ToolResult", "ToolSpec", "Toolbox", "ToolCache", "ToolCallRecord",
           "LocalBackend", "available_tools", "build_tool", "register_tool"]
