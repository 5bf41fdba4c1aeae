"""The Ray Serve deployments of :mod:`tool_backends.ray_serve`, and :func:`deploy`.

* :class:`ToolReplica` -- one tool: builds it in the replica's process, runs the plain server's app
  on it (:func:`tool_backends.server.create_app`), answers handle calls through that app
  (:func:`call_asgi`), and with ``max_batch_size`` > 1 gathers concurrent calls' model forwards with
  ``@serve.batch`` into one ``segment_batch`` (:class:`BatchingSegmenter`).
* :class:`ToolFront` -- the HTTP ingress: the router app (``create_app(..., proxy=...)``) with the
  tool deployments as upstreams, reached by handle (:class:`~tool_backends.ray_serve_client.RayServeToolBackend`).

Importing this module imports Ray Serve.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

from ray import serve

from tool_backends.ray_serve import ServeConfig, config_from_state, config_state, server_settings

log = logging.getLogger(__name__)


# ---- one ASGI request, from a handle call -------------------------------------------------------
async def call_asgi(app, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict, bytes]:
    """Run one HTTP request through the ASGI ``app`` in this process (every middleware included:
    the body limit, the ``/call`` fast path); ``(status, headers, body)``."""
    path, _, query = path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method.upper(), "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": query.encode(), "root_path": "", "client": ("127.0.0.1", 0), "server": ("ray-serve", 0),
             "headers": [(str(k).lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in headers.items()]
             + [(b"content-length", str(len(body)).encode())]}
    done = asyncio.Event()
    delivered = False
    status, out_headers, chunks = 500, {}, []

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status = message["status"]
            out_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    try:
        await app(scope, receive, send)
    finally:
        done.set()
    return status, out_headers, b"".join(chunks)


# ---- dynamic batching ---------------------------------------------------------------------------
class BatchingSegmenter:
    """A segment engine whose ``segment`` calls (from the server's worker threads) go through
    ``submit`` into a batch; everything else is the wrapped engine's (``random_weights``, ``close``)."""

    def __init__(self, engine: Any, submit) -> None:
        self._engine, self._submit = engine, submit

    def segment(self, image, *, box=None, point=None, label=None, context=None, image_index: int = 0):
        return self._submit({"image": image, "box": box, "point": point, "label": label, "context": context,
                             "image_index": image_index})

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


def forward_batch(engine: Any, calls: Sequence[Mapping[str, Any]]) -> list[tuple[bool, Any]]:
    """``(ok, mask or exception)`` per call: one ``segment_batch``, or, if the batch raises (one bad
    call), each call on its own so that only the bad one fails."""
    try:
        return [(True, m) for m in engine.segment_batch(calls)]
    except Exception:
        log.exception("a batch of %d calls failed; running them one by one", len(calls))
    out = []
    for c in calls:
        try:
            out.append((True, engine.segment(c["image"], box=c.get("box"), point=c.get("point"),
                                             label=c.get("label"), context=c.get("context"),
                                             image_index=c.get("image_index", 0))))
        except Exception as e:
            out.append((False, e))
    return out


# ---- the deployments ----------------------------------------------------------------------------
@serve.deployment
class ToolReplica:
    """One replica of one tool (see the module docstring)."""

    async def __init__(self, tool: str, state: Mapping[str, Any]) -> None:
        from tool_backends.registry import build_tool
        from tool_backends.server import create_app
        from tool_backends.toolbox import LocalBackend

        config = config_from_state(state)
        options = config.ray[tool]
        if options.torch_threads:
            import torch

            torch.set_num_threads(int(options.torch_threads))
        self.name = tool
        self.loop = asyncio.get_running_loop()
        self.batches = self.batched = self.largest_batch = 0
        self.tool = await self.loop.run_in_executor(None, lambda: build_tool(tool, **config.tools[tool]))
        engine = getattr(self.tool, "engine", None)
        self.engine = None
        if options.max_batch_size > 1 and callable(getattr(engine, "segment_batch", None)):
            self._forward.set_max_batch_size(options.max_batch_size)
            self._forward.set_batch_wait_timeout_s(options.batch_wait_timeout_s)
            self.engine = engine
            self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"{tool}-batch")  # one forward at a time
            self.tool.engine = BatchingSegmenter(engine, self._submit)
        elif options.max_batch_size > 1:
            log.warning("tool %r: engine %s has no segment_batch; its calls run one by one", tool,
                        type(engine).__name__)
        self.app = create_app({tool: LocalBackend([self.tool])}, server_settings(config, tool))

    def _submit(self, call: Mapping[str, Any]):
        """From a worker thread: this call's mask, computed in the next batch."""
        ok, value = asyncio.run_coroutine_threadsafe(self._forward(call), self.loop).result()
        if not ok:
            raise value
        return value

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _forward(self, calls: list) -> list:
        self.batches += 1
        self.batched += len(calls)
        self.largest_batch = max(self.largest_batch, len(calls))
        return await self.loop.run_in_executor(self.executor, forward_batch, self.engine, calls)

    async def asgi(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict, bytes]:
        """One request to this replica's tool server (what a handle caller sends)."""
        return await call_asgi(self.app, method, path, headers, body)

    def stats(self) -> dict[str, Any]:
        """This replica: process, node, batches run and calls in them, the service's counters."""
        import ray

        service = self.app.state.service
        return {"tool": self.name, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "batches": self.batches, "batched_calls": self.batched, "largest_batch": self.largest_batch,
                "calls": service.calls, "computed": service.computed,
                "cache_hits": service.cache.hits if service.cache else 0}


@serve.deployment
@serve.ingress()
class ToolFront:
    """The HTTP front: the router app over the tool deployments (``/call`` bodies forwarded
    unchanged by handle; ``/call_batch`` and ``/get_observation`` dispatched call by call)."""

    async def __init__(self, handles: Mapping[str, Any], state: Mapping[str, Any]) -> None:
        from anyio import to_thread

        from tool_backends.ray_serve_client import RayServeToolBackend
        from tool_backends.router import Upstream
        from tool_backends.server import create_app

        config = config_from_state(state)
        backends = {tool: RayServeToolBackend(tools=[tool], app=config.app, token_env=config.token_env,
                                              transport="raw", result_format="png", handle=handle)
                    for tool, handle in handles.items()}
        for backend in backends.values():  # /tools by handle (blocking: not on the event loop)
            await asyncio.get_running_loop().run_in_executor(None, backend.specs)
        settings = server_settings(config)
        to_thread.current_default_thread_limiter().total_tokens = max(40, settings.max_concurrency)
        self.router_app = create_app(backends, settings, proxy={t: Upstream(b) for t, b in backends.items()})

    def __serve_build_asgi_app__(self):
        return self.router_app


# ---- deploying ----------------------------------------------------------------------------------
def build_application(config: ServeConfig):
    """The bound Serve application: one :class:`ToolReplica` deployment per tool (named by the tool,
    with its replicas and resources) under one :class:`ToolFront`."""
    state = config_state(config)
    handles = {}
    for tool, options in config.ray.items():
        handles[tool] = ToolReplica.options(
            name=tool, num_replicas=options.replicas, max_ongoing_requests=options.max_ongoing_requests,
            ray_actor_options={"num_cpus": options.num_cpus, "num_gpus": options.num_gpus,
                               **({"resources": dict(options.resources)} if options.resources else {})},
            graceful_shutdown_timeout_s=5).bind(tool, state)
    return ToolFront.options(name="front", num_replicas=config.front_replicas, max_ongoing_requests=4096,
                             ray_actor_options={"num_cpus": 0}, graceful_shutdown_timeout_s=5).bind(handles, state)


def deploy(config: ServeConfig, blocking: bool = False):
    """Start Serve's HTTP proxy on ``config.host:port`` (in the Ray cluster this process is
    connected to, or a local one) and run the application; the front's handle. ``blocking``
    serves until interrupted."""
    import ray

    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False)
    serve.start(proxy_location=config.proxy_location, http_options={"host": config.host, "port": config.port})
    return serve.run(build_application(config), name=config.app, route_prefix="/", blocking=blocking)


def replica_stats(tool: str, app: str, calls: int = 16) -> list[dict[str, Any]]:
    """Each live replica's :meth:`ToolReplica.stats`, as far as ``calls`` round-robin asks find them
    (Serve routes each ask to some replica; deduplicated by process)."""
    handle = serve.get_deployment_handle(tool, app_name=app)
    seen = {}
    for _ in range(calls):
        s = handle.stats.remote().result(timeout_s=30)
        seen[s["pid"]] = s
    return list(seen.values())


__all__ = ["ToolReplica", "ToolFront", "BatchingSegmenter", "build_application", "deploy", "call_asgi",
           "forward_batch", "replica_stats"]
