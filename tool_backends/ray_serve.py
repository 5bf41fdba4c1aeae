"""Tools as Ray Serve deployments: replicas, per-replica resources, dynamic batching, a cluster.

``medvqa-tools serve`` is one process. For a GRPO step's bursts of tool calls, and for many
rollout workers on a cluster, the same tools run as Ray Serve deployments:

* **one deployment per tool** (named by the tool), with ``replicas`` and per-replica resources
  (``num_cpus``, ``num_gpus``: fractions allowed), placed by Ray on any node of the cluster;
* **the same wire, limits and auth by construction**: each replica runs the plain server's own app
  (:func:`tool_backends.server.create_app` on that one tool, with its :class:`ServerSettings`), so
  ``/call``, ``/call_batch``, ``/get_observation``, ``/tools`` and ``/health``, the token check, the
  body and pixel limits, the single-flight of identical calls and the result cache are the plain
  server's code, not a copy. Over HTTP, one address serves every tool: a front deployment is the
  project's router app (:func:`create_app` with ``proxy=``) whose upstreams are the tool
  deployments, reached by handle (``/call`` bodies forwarded unchanged);
* **dynamic batching** (``max_batch_size`` > 1): concurrent calls' model forwards are gathered by
  Ray Serve's ``@serve.batch`` and run as one ``segment_batch`` (one image-encoder forward for a
  batch of distinct images, :meth:`~tool_backends.engines.hf_sam.SamSegmenter.segment_batch`);
  an engine without a batch method runs its calls one by one;
* **handle access without HTTP** for callers inside the Ray cluster (env copies on Ray workers):
  the tool config ``{"segment": {"backend": "ray_serve"}}`` builds a :class:`RayServeToolBackend`,
  the plain HTTP client's request building, retries, refs and result decoding, over a deployment
  handle instead of a socket (:class:`HandleTransport`); the replica answers through the same app.

A config change moves every tool: the same tool entries plus a ``ray`` block each
(:func:`load_serve_config`, :func:`deploy`; ``medvqa-tools serve --ray``). See ``docs/serving.md``.
Nothing here is imported unless Ray Serve is used (``pip install 'medvqa-gym[rayserve]'``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from medvqa_env.errors import ConfigError, unknown_name_message

log = logging.getLogger(__name__)

from tool_backends.ray_serve_client import DEFAULT_APP  # the Serve app deploy() makes and the client looks for


# ---- configuration ------------------------------------------------------------------------------
@dataclass
class ReplicaOptions:
    """How one tool runs on Ray Serve (a tool entry's ``ray`` block)."""

    replicas: int = 1
    """Replicas of the tool's deployment; Serve's router balances calls over them."""
    num_cpus: float = 1.0
    """CPUs Ray reserves for each replica (a fraction packs several on one core)."""
    num_gpus: float = 0.0
    """GPUs Ray reserves for each replica (a fraction shares one GPU)."""
    max_batch_size: int = 1
    """Model forwards gathered into one batch across concurrent calls (``@serve.batch``); 1: none."""
    batch_wait_timeout_s: float = 0.01
    """How long a batch waits to fill once its first call arrived."""
    max_ongoing_requests: int = 256
    """Requests Serve sends one replica at once (the replica's own limits then apply)."""
    torch_threads: int | None = None
    """``torch.set_num_threads`` in each replica (Ray sets OMP threads from ``num_cpus``); None: as Ray leaves it."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each replica needs (places it: ``{"gpu_node": 0.01}``, a node's label)."""


@dataclass
class ServeConfig:
    """Everything :func:`deploy` needs: the tools (their usual config entries, each with an
    optional ``ray`` block of :class:`ReplicaOptions`), the server settings every replica enforces,
    and where HTTP listens."""

    tools: dict[str, dict[str, Any]]
    ray: dict[str, ReplicaOptions] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    """:class:`tool_backends.server.ServerSettings` fields (``token`` is never given here: ``token_env``)."""
    token_env: str | None = None
    """Environment variable holding the bearer token; read in each replica's process."""
    app: str = DEFAULT_APP
    host: str = "127.0.0.1"
    port: int = 8000
    front_replicas: int = 1
    """Replicas of the HTTP front (the router app); in-cluster callers skip it."""
    proxy_location: str = "HeadOnly"
    """Where Serve runs HTTP proxies: ``HeadOnly`` (one address) or ``EveryNode`` (one per node, each on ``port``)."""


def load_serve_config(config: Mapping[str, Any] | str | Path) -> ServeConfig:
    """A :class:`ServeConfig` from a mapping, JSON text or a JSON/YAML file::

        {"tools": {"segment": {"engine": "trained", "ray": {"replicas": 2, "max_batch_size": 16}},
                   "ground": "classical"},
         "settings": {"max_body_mb": 64}, "port": 8000}

    A ``tools`` value is any form :func:`tool_backends.config.load_tool_config` reads (a local
    backend: a replica builds the tool in its own process).

    >>> c = load_serve_config({"tools": {"segment": {"engine": "classical", "ray": {"replicas": 2}}}})
    >>> c.tools, c.ray["segment"].replicas
    ({'segment': {'engine': 'classical'}}, 2)
    >>> load_serve_config({"tools": {"segment": {"ray": {"replica": 2}}}})
    Traceback (most recent call last):
    ...
    medvqa_env.errors.ConfigError: tool 'segment': Unknown ray option 'replica'. Available: ['batch_wait_timeout_s', 'max_batch_size', 'max_ongoing_requests', 'num_cpus', 'num_gpus', 'replicas', 'resources', 'torch_threads']. Did you mean 'replicas'?
    """
    from tool_backends.config import load_tool_config

    if isinstance(config, Path) or (isinstance(config, str) and not config.lstrip().startswith("{")):
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"Ray Serve config file {str(path)!r} does not exist")
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            config = yaml.safe_load(text)
        else:
            config = json.loads(text)
    elif isinstance(config, str):
        config = json.loads(config)
    if not isinstance(config, Mapping) or "tools" not in config:
        raise ConfigError(f"expected a Ray Serve config with 'tools', got {str(config)[:80]!r}")
    known = {f.name for f in fields(ServeConfig)} - {"ray"}
    extra = sorted(set(config) - known)
    if extra:
        raise ConfigError(unknown_name_message("Ray Serve config key", extra[0], sorted(known)))
    raw_tools = config["tools"]
    blocks: dict[str, Any] = {}
    if isinstance(raw_tools, Mapping):  # lift each tool's ray block before the tool config sees it
        stripped = {}
        for name, entry in raw_tools.items():
            if isinstance(entry, Mapping) and "ray" in entry:
                blocks[str(name)] = entry["ray"]
                entry = {k: v for k, v in entry.items() if k != "ray"}
            stripped[name] = entry
        raw_tools = stripped
    tools = {}
    for name, entry in load_tool_config(raw_tools).items():
        if entry["backend"] != "local":
            raise ConfigError(f"tool {name!r}: a Ray Serve replica builds its tool itself (a local backend), "
                              f"got backend {entry['backend']!r}")
        tools[name] = {k: v for k, v in entry.items() if k != "backend"}
    ray = {name: replica_options(name, blocks.get(name) or {}) for name in tools}
    out = ServeConfig(tools=tools, ray=ray, **{k: v for k, v in config.items() if k != "tools"})
    server_settings(out)  # unknown settings fail now, not in a replica
    return out


def replica_options(tool: str, block: Mapping[str, Any]) -> ReplicaOptions:
    names = [f.name for f in fields(ReplicaOptions)]
    for key in block:
        if key not in names:
            raise ConfigError(f"tool {tool!r}: " + unknown_name_message("ray option", key, sorted(names)))
    options = ReplicaOptions(**block)
    if options.replicas < 1 or options.max_batch_size < 1 or options.num_cpus < 0 or options.num_gpus < 0:
        raise ConfigError(f"tool {tool!r}: expected replicas >= 1, max_batch_size >= 1 and resources >= 0, "
                          f"got {options!r}")
    return options


def server_settings(config: ServeConfig, tool: str | None = None):
    """The :class:`ServerSettings` a replica enforces (the token read from ``token_env`` in this
    process). A tool replica runs at least ``max_batch_size`` calls at once (else no batch could fill),
    and with several replicas does not wait for uploads (``upload_wait_s`` 0: the upload may have gone
    to another replica); the front runs at least as many calls as all replicas together."""
    from tool_backends.server import ServerSettings, check_settings

    names = {f.name for f in fields(ServerSettings)} - {"token"}
    values = dict(config.settings)
    if "max_body_mb" in values:  # the CLI's spelling
        values["max_body_bytes"] = int(values.pop("max_body_mb")) * 1024 * 1024
    for key in values:
        if key not in names:
            raise ConfigError(unknown_name_message("server setting", key, sorted(names)))
    if "image_roots" in values:
        values["image_roots"] = tuple(values["image_roots"])
    settings = ServerSettings(host=config.host, **{k: v for k, v in values.items() if k != "host"})
    token = None
    if config.token_env:
        token = os.environ.get(config.token_env)
        if not token:
            raise ConfigError(f"token_env {config.token_env!r} is empty in this process "
                              f"({'replica of ' + tool if tool else 'front'}): export it before `ray start` / `serve run`")
    settings.token = token
    if tool is not None:
        settings.max_concurrency = max(settings.max_concurrency, config.ray[tool].max_batch_size)
        settings.max_queue = max(settings.max_queue, config.ray[tool].max_ongoing_requests)  # Serve bounds it first
        if config.ray[tool].replicas > 1:
            # a GRPO group's reference-only requests may reach another replica than the one its upload
            # went to: waiting there for an upload that never comes cost each of them upload_wait_s
            # (2 s, benchmarks/bench_serve.py); they get their 409 at once and send the image
            settings.upload_wait_s = 0.0
    else:
        total = sum(o.replicas * max(settings.max_concurrency, o.max_batch_size) for o in config.ray.values())
        settings.max_concurrency = max(settings.max_concurrency, total)
        settings.max_queue = max(settings.max_queue, total)
    check_settings(settings)
    return settings


def config_state(config: ServeConfig) -> dict[str, Any]:
    """A plain dict of ``config`` (what travels to replicas)."""
    state = asdict(config)
    return state


def config_from_state(state: Mapping[str, Any]) -> ServeConfig:
    state = dict(state)
    state["ray"] = {k: ReplicaOptions(**v) for k, v in state.get("ray", {}).items()}
    return ServeConfig(**state)


SETTINGS_FROM_CLI = ("max_concurrency", "max_queue", "max_body_mb", "cache_size", "done_if_invalid", "image_store_mb",
                     "result_dir", "max_pixels", "max_request_pixels", "max_result_pixels", "max_batch_calls",
                     "max_action_chars", "result_dir_mb", "read_timeout_s", "max_connections")


def config_from_cli(args: Any, names: Sequence[str]) -> ServeConfig:
    """``medvqa-tools serve --ray``'s config: ``--ray-config FILE``, else ``--tools/--engine/--tool-opt``
    with ``--ray-opt tool.key=value``; the server options become every replica's settings."""
    from medvqa_env.config import parse_value
    from tool_backends.cli import tool_options

    if args.ray_config:
        config = load_serve_config(args.ray_config)
    else:
        tools: dict[str, Any] = {n: dict(o) for n, o in tool_options(names, args.engine, args.tool_opt).items()}
        for pair in args.ray_opt:
            key, sep, value = pair.partition("=")
            tool, dot, option = key.strip().partition(".")
            if not sep or not dot or tool not in tools:
                raise ConfigError(f"expected --ray-opt tool.key=value for a served tool {list(tools)}, got {pair!r}")
            tools[tool].setdefault("ray", {})[option] = parse_value(value.strip())
        settings = {k: getattr(args, k) for k in SETTINGS_FROM_CLI}
        settings["image_roots"] = tuple(args.image_root)
        config = load_serve_config({"tools": tools, "settings": settings, "token_env": args.token_env})
    config.host, config.port = args.host, args.port
    return config


def serve_from_cli(args: Any, names: Sequence[str]) -> int:
    """Run ``medvqa-tools serve --ray`` until interrupted (Ray: the cluster at ``RAY_ADDRESS``, else a local one)."""
    config = config_from_cli(args, names)
    from tool_backends.ray_serve_deploy import deploy

    deploy(config)
    layout = ", ".join(f"{t} x{o.replicas} (batch {o.max_batch_size})" for t, o in config.ray.items())
    print(f"medvqa-tools: serving {layout} on Ray Serve at http://{config.host}:{config.port} "
          f"(in-cluster: tools={{'<tool>': {{'backend': 'ray_serve', 'app': {config.app!r}}}}})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        from ray import serve

        serve.shutdown()
    return 0


__all__ = ["DEFAULT_APP", "config_from_cli", "serve_from_cli", "ReplicaOptions", "ServeConfig", "load_serve_config", "replica_options", "server_settings"]
