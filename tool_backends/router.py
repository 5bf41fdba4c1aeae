"""The tool router (the seed's ``tool_router.py`` on :5800): one address for many tool servers.

It is a tool server whose backends are :class:`HTTPToolBackend` clients, one per upstream.
``/call`` bodies are forwarded unchanged to the server that owns the tool (no image re-encoding);
``/get_observation`` parses each turn and dispatches every call by tool name; ``/tools`` lists the
union of the upstreams' tools; ``/health`` asks every upstream and says ``degraded`` (503) when one
is down. Identical ``/call`` requests in flight at once (a GRPO group's) are forwarded once and
share the upstream's answer: the server's event loop joins them before its concurrency gate
(:class:`tool_backends.single_flight.AsyncSingleFlight`), keyed by :meth:`Upstream.key`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Mapping

from medvqa_env.errors import ConfigError
from tool_backends.http_client import HTTPToolBackend
from tool_backends.server import ServerSettings, create_app
from tool_backends.single_flight import request_key


log = logging.getLogger(__name__)


class UpstreamLog:
    """Says once, in the log, when an upstream stops answering and once when it answers again
    (seen by a forwarded call or by ``/health``), not on every failed call."""

    def __init__(self) -> None:
        self.down: dict[str, str] = {}
        self._lock = threading.Lock()

    def saw(self, url: str, tools, problem: str | None) -> None:
        with self._lock:
            was_down = url in self.down
            if problem is not None and not was_down:
                self.down[url] = problem
                log.warning("upstream %s (tools %s) is down: %s", url, sorted(tools), problem)
            elif problem is None and was_down:
                del self.down[url]
                log.warning("upstream %s (tools %s) is back", url, sorted(tools))


class Upstream:
    """One upstream server as the router's ``/call`` sees it: :meth:`forward` sends a body
    unchanged and returns (status, body, media type); :meth:`key` names a request for sharing --
    the whole request (path, accepted formats, body: tool, arguments, image refs or bytes,
    context) and the upstream, so only identical requests to one server share an answer."""

    def __init__(self, client: HTTPToolBackend, tools=(), states: UpstreamLog | None = None) -> None:
        self.client, self.tools, self.states = client, tuple(tools), states

    def key(self, path: str, body: bytes, accept: str | None) -> bytes:
        return request_key(body, path, str(accept), self.client.url)

    def forward(self, path: str, body: bytes, accept: str | None = None) -> tuple[int, bytes, str]:
        status, content, media_type = self.client.forward(path, body, accept)
        if self.states is not None:
            unreachable = status in (502, 504) and content.startswith(b"{\"detail\": \"Upstream ")  # our client: none came
            self.states.saw(self.client.url, self.tools, f"HTTP {status} forwarding a call" if unreachable else None)
        return status, content, media_type


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
        if name.strip() in out:
            raise ConfigError(f"--upstream names tool {name.strip()!r} twice ({out[name.strip()]} and {url.strip()}): "
                              "the router sends each tool to one server; name each tool once")
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
    states = UpstreamLog()
    upstreams_of = {url: Upstream(backends[tools[0]], tools, states) for url, tools in by_url.items()}
    app = create_app(backends, settings, proxy={t: upstreams_of[url] for url, tools in by_url.items() for t in tools})
    app.state.upstream_log = states
    _replace_health(app, by_url, token_env, states)
    return app


def upstream_health(by_url: Mapping[str, list[str]], timeout_s: float = 2.0,
                    token_env: str | None = None) -> dict[str, Any]:
    """Ask every upstream's ``/health`` (concurrently); ``status`` is ``ok`` only when all answer ok."""
    import concurrent.futures
    import os

    import httpx

    headers = {}
    token = os.environ.get(token_env) if token_env else None
    if token:
        headers["Authorization"] = f"Bearer {token}"

    def probe(url: str) -> dict[str, Any]:
        try:
            r = httpx.get(url.rstrip("/") + "/health", timeout=timeout_s, headers=headers)
            ok = r.status_code == 200 and r.json().get("status") == "ok"
            return {"url": url, "tools": by_url[url], "status": "ok" if ok else f"unhealthy (HTTP {r.status_code})"}
        except (httpx.HTTPError, ValueError) as e:
            return {"url": url, "tools": by_url[url], "status": f"unreachable ({type(e).__name__})"}

    with concurrent.futures.ThreadPoolExecutor(max(1, len(by_url))) as pool:
        upstreams = list(pool.map(probe, by_url))
    down = [u for u in upstreams if u["status"] != "ok"]
    return {"status": "ok" if not down else "degraded", "upstreams": upstreams,
            "unavailable_tools": sorted(t for u in down for t in u["tools"])}


def _replace_health(app, by_url: Mapping[str, list[str]], token_env: str | None,
                    states: UpstreamLog | None = None) -> None:
    """The router's ``/health`` reports its upstreams: 200 ``ok`` when every one answers, else 503
    ``degraded`` naming the dead ones (a load balancer then stops sending it work)."""
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/health"]
    service, forwarding = app.state.service, app.state.forwarding

    @app.get("/health")
    async def health():
        report = await run_in_threadpool(upstream_health, by_url, 2.0, token_env)
        for upstream in report["upstreams"]:
            if states is not None:
                states.saw(upstream["url"], upstream["tools"], None if upstream["status"] == "ok" else upstream["status"])
        body = {**report, "tools": sorted(service.backends), "calls": service.calls,
                "forwarded": forwarding.computed,
                "joined_in_flight": forwarding.joined,
                "waited_for_upload": sum(waits.waited for waits, _ in app.state.forwarded.values())}
        return JSONResponse(body, status_code=200 if report["status"] == "ok" else 503)
