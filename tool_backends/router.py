"""The tool router (the seed's ``tool_router.py`` on :5800): one address for many tool servers.

It is a tool server whose backends are :class:`HTTPToolBackend` clients, one per upstream.
``/call`` bodies are forwarded unchanged to the server that owns the tool (no image re-encoding);
``/get_observation`` parses each turn and dispatches every call by tool name; ``/tools`` lists the
union of the upstreams' tools.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from medvqa_env.errors import ConfigError
from tool_backends.http_client import HTTPToolBackend
from tool_backends.server import ServerSettings, create_app


def parse_upstreams(spec: str | Mapping[str, str]) -> dict[str, str]:
    """``"segment=http://a:1,ground=http://b:2"`` -> ``{tool: url}``.

    >>> parse_upstreams("segment=http://127.0.0.1:7660, ground=http://127.0.0.1:7688")
    {'segment': 'http://127.0.0.1:7660', 'ground': 'http://127.0.0.1:7688'}
    """
    if isinstance(spec, Mapping):
        return {str(k): str(v) for k, v in spec.items()}
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, url = part.partition("=")
        if not sep or not name.strip() or not url.strip().startswith(("http://", "https://")):
            raise ConfigError(f"expected 'tool=http://host:port', got {part!r}")
        out[name.strip()] = url.strip()
    if not out:
        raise ConfigError(f"expected at least one 'tool=url' upstream, got {spec!r}")
    return out


def wait_for_server(url: str, timeout_s: float = 30.0, token_env: str | None = None) -> dict[str, Any]:
    """Poll ``url``/health until it answers 200 (or raise ConfigError after ``timeout_s``)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url.rstrip("/") + "/health", timeout=1.0)
            if r.status_code == 200:
                return r.json()
            last = f"status {r.status_code}"
        except httpx.HTTPError as e:
            last = type(e).__name__
        time.sleep(0.05)
    raise ConfigError(f"tool server {url} did not become healthy within {timeout_s:g} s ({last})")


def create_router_app(upstreams: Mapping[str, str], settings: ServerSettings | None = None,
                      timeout_s: float = 30.0, retries: int = 2, token_env: str | None = None,
                      wait_s: float = 0.0):
    """Build the router app; ``token_env`` is the token the router sends upstream."""
    by_url: dict[str, list[str]] = {}
    for tool, url in upstreams.items():
        by_url.setdefault(url, []).append(tool)
    backends = {}
    for url, tools in by_url.items():
        if wait_s > 0:
            wait_for_server(url, wait_s)
        client = HTTPToolBackend(tools=tools, url=url, timeout_s=timeout_s, retries=retries, token_env=token_env,
                                 transport="raw", result_format="png")
        client.specs()  # fail now, with the URL in the message, if an upstream is missing a tool
        backends.update({t: client for t in tools})
    return create_app(backends, settings, proxy=backends)
