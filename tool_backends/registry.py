"""Named tool factories: ``build_tool("segment", engine="classical")`` -> a :class:`Tool`.

Modules register their tools with :func:`register_tool`; heavy engines import their model code
lazily inside the factory so that listing tools never loads torch.
"""

from __future__ import annotations

from typing import Any, Callable

from medvqa_env.registry import Registry
from tool_backends.base import Tool

ToolFactory = Callable[..., Tool]
TOOLS: Registry[Tool] = Registry("tool")


def register_tool(name: str) -> Callable[[ToolFactory], ToolFactory]:
    """Decorator: register ``factory(**options) -> Tool`` under ``name``."""
    return TOOLS.register(name)


def _ensure_builtin_tools() -> None:
    # Importing the modules runs their @register_tool decorators.
    import tool_backends.builtin  # noqa: F401


def available_tools() -> list[str]:
    _ensure_builtin_tools()
    return TOOLS.names()


def build_tool(name: str, /, **options: Any) -> Tool:
    """Build the registered tool ``name`` with ``options`` (e.g. ``engine``, ``model``)."""
    _ensure_builtin_tools()
    return TOOLS.build(name, **options)
