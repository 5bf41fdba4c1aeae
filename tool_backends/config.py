"""Tool configuration: which backend runs each tool. Swapping a backend changes no code.

Accepted forms (a dict, or a path to a JSON or YAML file holding one)::

    {"image_zoom_in": "local",
     "segment": "http://127.0.0.1:7660",
     "ground": {"backend": "local", "engine": "owlvit", "model": "google/owlvit-base-patch32"},
     "classify": {"backend": "http", "url": "http://10.0.0.5:7657", "timeout_s": 20, "token_env": "TOOLS_TOKEN"}}

A list of names means "all local with default options".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from medvqa_env.errors import ConfigError

BACKEND_KINDS = ("local", "http")


def load_tool_config(config: Mapping[str, Any] | list | tuple | str | Path | None) -> dict[str, dict[str, Any]]:
    """Normalise any accepted form to ``{tool: {"backend": kind, **options}}``."""
    if config is None:
        from tool_backends.builtin import DEFAULT_TOOLS

        config = list(DEFAULT_TOOLS)
    if isinstance(config, (str, Path)) and not str(config).startswith("http"):
        path = Path(config)
        if not path.exists():
            raise ConfigError(f"tool config file {str(path)!r} does not exist")
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ConfigError("reading a YAML tool config needs PyYAML (pip install pyyaml)") from None
            config = yaml.safe_load(text)
        else:
            config = json.loads(text)
        if isinstance(config, dict) and "tools" in config:
            config = config["tools"]
    if isinstance(config, (list, tuple)):
        config = {name: "local" for name in config}
    if not isinstance(config, Mapping):
        raise ConfigError(f"expected a mapping of tool name -> backend, got {type(config).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for name, entry in config.items():
        if isinstance(entry, str):
            entry = {"backend": "http", "url": entry} if entry.startswith(("http://", "https://")) else {"backend": entry}
        if not isinstance(entry, Mapping):
            raise ConfigError(f"tool {name!r}: expected a backend name, URL or mapping, got {entry!r}")
        entry = dict(entry)
        entry.setdefault("backend", "http" if "url" in entry else "local")
        if entry["backend"] not in BACKEND_KINDS:
            raise ConfigError(f"tool {name!r}: backend must be one of {list(BACKEND_KINDS)}, got {entry['backend']!r}")
        if entry["backend"] == "http" and not entry.get("url"):
            raise ConfigError(f"tool {name!r}: an http backend needs a 'url'")
        out[str(name)] = entry
    return out


def make_backends(spec: Mapping[str, Mapping[str, Any]]):
    """Build one backend per local tool set and one client per distinct server URL."""
    from tool_backends.registry import build_tool
    from tool_backends.toolbox import LocalBackend

    backends: dict[str, Any] = {}
    local_tools = []
    by_url: dict[tuple, list[str]] = {}
    for name, entry in spec.items():
        options = {k: v for k, v in entry.items() if k != "backend"}
        if entry["backend"] == "local":
            local_tools.append(build_tool(name, **options))
        else:
            key = tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in options.items()))
            by_url.setdefault(key, []).append(name)
    if local_tools:
        local = LocalBackend(local_tools)
        backends.update({t.name: local for t in local_tools})
    for key, names in by_url.items():
        from tool_backends.http_client import HTTPToolBackend

        options = {k: json.loads(v) for k, v in key}
        client = HTTPToolBackend(tools=names, **options)
        backends.update({n: client for n in names})
    return backends
