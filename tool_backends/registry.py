"""Named tool factories: ``build_tool("segment", engine="classical")`` -> a :class:`Tool`.

Modules register their tools with :func:`register_tool`; heavy engines import their model code
lazily inside the factory so that listing tools never loads torch.
"""

from __future__ import annotations

from typing import Any, Callable

from medvqa_env.errors import ConfigError, unknown_name_message
from tool_backends.base import Tool

ToolFactory = Callable[..., Tool]
_FACTORIES: dict[str, ToolFactory] = {}


def register_tool(name: str) -> Callable[[ToolFactory], ToolFactory]:
    """Decorator: register ``factory(**options) -> Tool`` under ``name``."""

    def wrap(factory: ToolFactory) -> ToolFactory:
        if name in _FACTORIES and _FACTORIES[name] is not factory:
            raise ConfigError(f"tool {name!r} is already registered")
        _FACTORIES[name] = factory
        return factory

    return wrap


def _ensure_builtin_tools() -> None:
    # Importing the modules runs their @register_tool decorators.
    import tool_backends.builtin  # noqa: F401


def available_tools() -> list[str]:
    _ensure_builtin_tools()
    return sorted(_FACTORIES)


def build_tool(name: str, **options: Any) -> Tool:
    """Build the registered tool ``name`` with ``options`` (e.g. ``engine``, ``model``)."""
    _ensure_builtin_tools()
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ConfigError(unknown_name_message("tool", name, _FACTORIES)) from None
    try:
        return factory(**options)
    except TypeError as e:
        raise ConfigError(f"bad options for tool {name!r}: {e}") from None
