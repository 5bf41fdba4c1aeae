"""``medvqa-tools``: serve tools, run a router, list tools, build trained tools.

Examples::

    medvqa-tools list
    medvqa-tools build ground --out runs/tools/ground    # then tools={"ground": {"engine": "trained", "path": ...}}
    medvqa-tools serve                                   # every tool, default engines, on :7660
    medvqa-tools serve --tools segment,ground --port 7660 --engine segment=classical,ground=oracle
    medvqa-tools serve --tools segment --engine sam --tool-opt segment.model=/models/medsam
    medvqa-tools router --port 5800 --upstream segment=http://127.0.0.1:7660,ground=http://127.0.0.1:7688
    medvqa-tools mcp --tools segment,ground --engine classical              # MCP on stdio (--transport http: :7670/mcp)

A server bound to anything but loopback needs ``--token-env NAME`` (the variable holding the token).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from medvqa_env.errors import ConfigError


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def tool_options(tools: Sequence[str], engine: str | None, options: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--engine`` (one name for every tool that has it, or ``tool=name,...``) and
    ``--tool-opt tool.key=value`` -> per-tool keyword options.

    >>> tool_options(["segment", "image_zoom_in"], "oracle", ["segment.max_side=1024"])
    {'segment': {'engine': 'oracle', 'max_side': 1024}, 'image_zoom_in': {}}
    """
    from tool_backends.engines import ENGINES, TOOL_ENGINE_KIND as kinds

    out: dict[str, dict[str, Any]] = {t: {} for t in tools}
    if engine:
        if "=" in engine:
            for part in engine.split(","):
                tool, _, name = part.partition("=")
                if tool.strip() not in out:
                    raise ConfigError(f"--engine names tool {tool.strip()!r}, which is not in --tools {list(tools)}")
                out[tool.strip()]["engine"] = name.strip()
        else:
            takers = [t for t in tools if engine in ENGINES.get(kinds.get(t, ""), {})]
            if not takers:
                raise ConfigError(f"no tool in {list(tools)} has an engine {engine!r}")
            for t in takers:
                out[t]["engine"] = engine
    for opt in options:
        key, sep, value = opt.partition("=")
        tool, dot, name = key.partition(".")
        if not sep or not dot or tool not in out:
            raise ConfigError(f"expected --tool-opt tool.key=value for a served tool, got {opt!r}")
        out[tool][name] = _parse_value(value)
    return out


def _settings(args) -> "Any":
    from tool_backends.server import ServerSettings

    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise ConfigError(f"--token-env {args.token_env!r}: that environment variable is empty")
    return ServerSettings(host=args.host, token=token, max_concurrency=args.max_concurrency,
                          max_body_bytes=args.max_body_mb * 1024 * 1024, image_roots=tuple(args.image_root),
                          cache_size=args.cache_size, max_pixels=args.max_pixels,
                          max_queue=args.max_queue, result_dir=args.result_dir,
                          image_store_mb=args.image_store_mb, done_if_invalid=args.done_if_invalid,
                          max_batch_calls=args.max_batch_calls, max_request_pixels=args.max_request_pixels,
                          max_result_pixels=args.max_result_pixels, max_action_chars=args.max_action_chars,
                          result_dir_mb=args.result_dir_mb, read_timeout_s=args.read_timeout_s,
                          max_connections=args.max_connections)


@dataclass
class ServerArgs:
    """What every server (a tool server, the router) takes."""

    host: str = "127.0.0.1"
    """bind address (non-loopback needs --token-env)"""
    port: int = 7660
    """port to listen on"""
    token_env: str | None = None
    """environment variable holding the bearer token"""
    max_concurrency: int = 4
    """tool runs at once"""
    max_queue: int = 64
    """requests waiting for a run slot; more get 503"""
    max_body_mb: int = 64
    """largest request body"""
    image_root: list[str] = field(default_factory=list, metadata={"cli": {"action": "append", "nargs": None}})
    """directory the server may read client-named files from (repeatable)"""
    cache_size: int = 1024
    """tool results kept in memory"""
    done_if_invalid: bool = False
    """verl-tool: a turn without a tool call ends the trajectory"""
    image_store_mb: int = 512
    """decoded images kept so clients can refer to them by digest (0 disables)"""
    result_dir: str | None = None
    """directory for result images sent by path to co-located clients (image_format=path)"""
    max_pixels: int = 64_000_000
    """largest image (width x height) a request may carry; bigger ones get 400"""
    max_request_pixels: int | None = None
    """decoded image pixels one request may cost in all; more get 400 (default: 2 x --max-pixels)"""
    max_result_pixels: int | None = None
    """result-image pixels one response may carry; calls past it get an error result (default: --max-pixels)"""
    max_batch_calls: int = 64
    """tool calls one request may make (/call_batch: more get 413; /get_observation: error results)"""
    max_action_chars: int = 65_536
    """longest model turn /get_observation parses; longer ones observe an error"""
    result_dir_mb: int = 1024
    """bound on the files kept under --result-dir (oldest deleted first)"""
    read_timeout_s: float = 30.0
    """seconds a connection may take to send a request's headers, or the next part of its body"""
    max_connections: int = 256
    """connections (and requests in flight) at once; more get 503"""
    log_level: str = "warning"
    """uvicorn's log level"""


@dataclass
class ServeArgs(ServerArgs):
    """Serve tools over HTTP."""

    tools: str | None = None
    """comma-separated tool names; none given: every tool"""
    engine: str | None = None
    """engine for every tool that has it, or tool=engine,..."""
    tool_opt: list[str] = field(default_factory=list, metadata={"cli": {"alias": ["--option"]}})
    """tool option ``tool.key=value`` (JSON values parsed; repeatable), as ``--tool-opt`` everywhere
    (``--option`` is the old name)"""
    torch_threads: str | None = None
    """torch/BLAS threads of the tools' engines: a number, or none = the process's CPU share
    (MEDVQA_TORCH_THREADS); printed at start and reported by /health"""


@dataclass
class ServeCommandArgs(ServeArgs):
    """Serve tools over HTTP (or, with --ray, as Ray Serve deployments)."""

    ray: bool = False
    """serve on Ray Serve: one deployment per tool, replicas and batching by --ray-opt (docs/serving.md)"""
    ray_opt: list[str] = field(default_factory=list)
    """with --ray: ``tool.key=value`` of a tool's ray block (replicas, num_cpus, max_batch_size, ...; repeatable)"""
    ray_config: str | None = None
    """with --ray: a JSON/YAML Ray Serve config (tools with their ray blocks, settings) instead of --tools"""


@dataclass
class RouterArgs(ServerArgs):
    """Route tool calls by name to several servers."""

    upstream: str = ""
    """tool=http://host:port,... (required)"""
    port: int = 5800
    """port to listen on"""
    timeout_s: float = 30.0
    """seconds per upstream request"""
    upstream_token_env: str | None = None
    """environment variable holding the token the router sends upstream"""
    wait_s: float = 60.0
    """how long to wait for upstreams at start"""


@dataclass
class McpArgs(ServeArgs):
    """Serve tools over the Model Context Protocol (stdio or streamable HTTP)."""

    transport: str = "stdio"
    """stdio (the client starts this process) or http (streamable HTTP on --host:--port at --path)"""
    port: int = 7670
    """port to listen on (--transport http)"""
    path: str = "/mcp"
    """the streamable-HTTP endpoint's path"""


@dataclass
class ListArgs:
    """List tools and engines (or a running server's tools with --url)."""

    url: str | None = None
    """a running tool server"""


COMMANDS = {"serve": ServeCommandArgs, "router": RouterArgs, "mcp": McpArgs, "list": ListArgs}


def build_parser() -> argparse.ArgumentParser:
    from medvqa_env.cli import add_dataclass, make_parser

    parser = make_parser("medvqa-tools", __doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, cls in COMMANDS.items():
        p = sub.add_parser(name, help=cls.__doc__.splitlines()[0], description=cls.__doc__,
                           formatter_class=parser.formatter_class,
                           add_option_string_dash_variants=parser.add_option_string_dash_variants,
                           add_config_path_arg=False)
        add_dataclass(p, cls, "args")
    from tool_backends.finetune.__main__ import add_kind_parsers

    p = sub.add_parser("build", help="Build a trained tool folder (progress bar, held-out quality, content hash).",
                       description="Train a tool's model on a dataset's annotations into a folder that "
                                   "tools={KIND: {'engine': 'trained', 'path': DIR}} loads (the same as "
                                   "python -m tool_backends.finetune KIND).",
                       formatter_class=parser.formatter_class,
                       add_option_string_dash_variants=parser.add_option_string_dash_variants,
                       add_config_path_arg=False)
    add_kind_parsers(p)
    return parser


def parse(argv: Sequence[str] | None = None):
    """The command's name and its arguments (a :data:`COMMANDS` dataclass)."""
    from medvqa_env.cli import to_instance

    ns = build_parser().parse_args(argv)
    if ns.command == "build":
        from tool_backends.finetune.common import FinetuneArgs

        return "build", (ns.kind, to_instance(FinetuneArgs, ns.args))
    return ns.command, to_instance(COMMANDS[ns.command], ns.args)


def main(argv: Sequence[str] | None = None) -> int:
    from medvqa_env.cli import run_cli

    command, args = parse(argv)
    if command == "build":
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    else:
        logging.basicConfig(level=getattr(logging, str(getattr(args, "log_level", "warning")).upper(), logging.WARNING))
    return run_cli("medvqa-tools", lambda: _run(command, args))


def _run(command: str, args) -> int:
    """Run the chosen command; its exit code."""
    if command == "build":
        from tool_backends.finetune.__main__ import build

        build(*args, prog="medvqa-tools build")
        return 0
    if command == "list":
        return _list(args)
    if command == "serve":
        from tool_backends.registry import available_tools, build_tool
        from tool_backends.server import create_app, serve
        from tool_backends.toolbox import LocalBackend

        names = [t.strip() for t in args.tools.split(",") if t.strip()] if args.tools else available_tools()
        if args.ray or args.ray_config:
            from tool_backends.ray_serve import serve_from_cli

            return serve_from_cli(args, names)
        from tool_backends.threads import apply_threads

        print(f"medvqa-tools: {apply_threads(args.torch_threads).line()}", flush=True)
        options = tool_options(names, args.engine, args.tool_opt)
        backend = LocalBackend([build_tool(n, **options[n]) for n in names])
        app = create_app({name: backend for name in backend.tools}, _settings(args))  # as named (a name= option)
        names = list(backend.tools)
        print(f"medvqa-tools: serving {names} on http://{args.host}:{args.port}", flush=True)
        serve(app, args.host, args.port, args.log_level)
        return 0
    if command == "mcp":
        return _mcp(args)
    if command == "router":
        if not args.upstream:
            raise ConfigError("expected --upstream tool=http://host:port,...")
        from tool_backends.router import create_router_app, parse_upstreams
        from tool_backends.server import check_settings, serve

        upstreams = parse_upstreams(args.upstream)
        settings = _settings(args)
        check_settings(settings)  # refuse an open bind before waiting on any upstream
        app = create_router_app(upstreams, settings, timeout_s=args.timeout_s,
                                token_env=args.upstream_token_env, wait_s=args.wait_s)
        print(f"medvqa-tools: routing {sorted(upstreams)} on http://{args.host}:{args.port}", flush=True)
        serve(app, args.host, args.port, args.log_level)
        return 0
    return 1


def _mcp(args) -> int:
    """``medvqa-tools mcp``: the tools as an MCP server (:mod:`tool_backends.mcp_server`)."""
    if args.transport not in ("stdio", "http"):
        raise ConfigError(f"expected --transport stdio or http, got {args.transport!r}")
    from tool_backends.mcp_server import MCPTools, run_stdio, serve_http
    from tool_backends.registry import available_tools, build_tool
    from tool_backends.toolbox import LocalBackend

    names = [t.strip() for t in args.tools.split(",") if t.strip()] if args.tools else available_tools()
    options = tool_options(names, args.engine, args.tool_opt)
    backend = LocalBackend([build_tool(n, **options[n]) for n in names])
    names = list(backend.tools)  # as the tools name themselves (a name= option renames one)
    tools = MCPTools({n: backend for n in names}, _settings(args))
    if args.transport == "stdio":  # stdout is the protocol's: say nothing there
        run_stdio(tools)
        return 0
    print(f"medvqa-tools: MCP tools {names} on http://{args.host}:{args.port}{args.path}", flush=True)
    serve_http(tools, args.port, args.path, args.log_level)
    return 0


def _list(args) -> int:
    if args.url:
        from tool_backends.http_client import HTTPToolBackend

        for spec in HTTPToolBackend(url=args.url).specs():
            print(f"{spec.name}: {spec.description}")
        return 0
    from tool_backends.engines import ENGINES, TOOL_ENGINE_KIND as kinds
    from tool_backends.registry import available_tools, build_tool

    for name in available_tools():
        engines = sorted(ENGINES.get(kinds.get(name, ""), {}))
        print(f"{name}" + (f"  engines: {', '.join(engines)}" if engines else ""))
        # the description does not depend on the engine: build the tool on a cheap one (no torch,
        # no model, no warning about random weights)
        cheap = next((e for e in ("oracle", "classical") if e in engines), None)
        print(f"    {build_tool(name, **({'engine': cheap} if cheap else {})).spec.description}")
    from tool_backends.engines.medsam_lite import checkpoint_line

    print(checkpoint_line())  # the real weights installed here, by hash
    return 0


if __name__ == "__main__":
    sys.exit(main())
