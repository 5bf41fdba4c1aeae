"""``medvqa-tools``: serve tools, run a router, list tools.

Examples::

    medvqa-tools list
    medvqa-tools serve --tools segment,ground --port 7660 --engine segment=classical,ground=oracle
    medvqa-tools serve --tools segment --engine sam --option segment.model=/models/medsam
    medvqa-tools router --port 5800 --upstream segment=http://127.0.0.1:7660,ground=http://127.0.0.1:7688

A server bound to anything but loopback needs ``--token-env NAME`` (the variable holding the token).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Sequence

from medvqa_env.errors import ConfigError


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def tool_options(tools: Sequence[str], engine: str | None, options: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--engine`` (one name for every tool that has it, or ``tool=name,...``) and
    ``--option tool.key=value`` -> per-tool keyword options.

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
            raise ConfigError(f"expected --option tool.key=value for a served tool, got {opt!r}")
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
                          image_store_mb=args.image_store_mb, done_if_invalid=args.done_if_invalid)


def _common(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (non-loopback needs --token-env)")
    p.add_argument("--port", type=int, default=port)
    p.add_argument("--token-env", default=None, help="environment variable holding the bearer token")
    p.add_argument("--max-concurrency", type=int, default=4, help="tool runs at once")
    p.add_argument("--max-queue", type=int, default=64, help="requests waiting for a run slot; more get 503")
    p.add_argument("--max-body-mb", type=int, default=64)
    p.add_argument("--image-root", action="append", default=[],
                   help="directory the server may read client-named files from (repeatable)")
    p.add_argument("--cache-size", type=int, default=1024)
    p.add_argument("--done-if-invalid", action="store_true",
                   help="verl-tool: a turn without a tool call ends the trajectory")
    p.add_argument("--image-store-mb", type=int, default=512,
                   help="decoded images kept so clients can refer to them by digest (0 disables)")
    p.add_argument("--result-dir", default=None,
                   help="directory for result images sent by path to co-located clients (image_format=path)")
    p.add_argument("--max-pixels", type=int, default=64_000_000,
                   help="largest image (width x height) a request may carry; bigger ones get 400")
    p.add_argument("--log-level", default="warning")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="medvqa-tools", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve tools over HTTP")
    s.add_argument("--tools", required=True, help="comma-separated tool names")
    s.add_argument("--engine", default=None, help="engine for every tool that has it, or tool=engine,...")
    s.add_argument("--option", action="append", default=[], help="tool.key=value (JSON values parsed)")
    _common(s, 7660)
    r = sub.add_parser("router", help="route tool calls by name to several servers")
    r.add_argument("--upstream", required=True, help="tool=http://host:port,...")
    r.add_argument("--timeout-s", type=float, default=30.0)
    r.add_argument("--upstream-token-env", default=None)
    r.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for upstreams at start")
    _common(r, 5800)
    ls = sub.add_parser("list", help="list tools and engines (or a server's tools with --url)")
    ls.add_argument("--url", default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(getattr(args, "log_level", "warning")).upper(), logging.WARNING))
    try:
        if args.command == "list":
            return _list(args)
        if args.command == "serve":
            from tool_backends.registry import build_tool
            from tool_backends.server import create_app, serve
            from tool_backends.toolbox import LocalBackend

            names = [t.strip() for t in args.tools.split(",") if t.strip()]
            options = tool_options(names, args.engine, args.option)
            backend = LocalBackend([build_tool(n, **options[n]) for n in names])
            app = create_app({n: backend for n in names}, _settings(args))
            print(f"medvqa-tools: serving {names} on http://{args.host}:{args.port}", flush=True)
            serve(app, args.host, args.port, args.log_level)
            return 0
        if args.command == "router":
            from tool_backends.router import create_router_app, parse_upstreams
            from tool_backends.server import serve

            from tool_backends.server import check_settings

            upstreams = parse_upstreams(args.upstream)
            settings = _settings(args)
            check_settings(settings)  # refuse an open bind before waiting on any upstream
            app = create_router_app(upstreams, settings, timeout_s=args.timeout_s,
                                    token_env=args.upstream_token_env, wait_s=args.wait_s)
            print(f"medvqa-tools: routing {sorted(upstreams)} on http://{args.host}:{args.port}", flush=True)
            serve(app, args.host, args.port, args.log_level)
            return 0
    except ConfigError as e:
        print(f"medvqa-tools: error: {e}", file=sys.stderr)
        return 2
    return 1


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
        if name != "classify":  # building classify's default engine loads torch; its schema is in the docs
            print(f"    {build_tool(name).spec.description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
