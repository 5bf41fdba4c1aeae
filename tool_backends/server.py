"""A FastAPI tool server: serves any set of tools (or, as a router, other servers' tools).

Endpoints (all JSON):

* ``GET /health`` -- ``{"status": "ok", "tools": [...], "calls", "cache_hits", "computed", ...}``
  (no token needed; ``computed`` counts tool runs: identical calls in flight at once run once).
* ``GET /tools`` -- ``{"tools": [OpenAI function schemas]}``.
* ``POST /call`` -- ``{"tool", "arguments", "images": [entry | null], "context"}`` ->
  ``{"result": {"text", "error", "data", "images"}}``. A tool's refusal is a 200 with
  ``result.error`` set (it is data for the model); a malformed request is a 4xx with ``detail``.
* ``POST /call_batch`` -- ``{"calls": [call, ...]}`` -> ``{"results": [result, ...]}``.
* ``POST /get_observation`` -- the verl-tool shape: ``trajectory_ids``, ``actions`` (the model's
  raw turn text), optional ``finish``, ``is_last_step``, ``extra_fields`` (per trajectory:
  ``images`` as data URLs, paths or entries, ``context``) -> ``observations``, ``dones``,
  ``valids``. An observation is a string, or ``{"obs": text, "image": [data URLs]}`` when tools
  returned images. See :mod:`tool_backends.trajectories`.

Safety: binds 127.0.0.1 unless told otherwise and then demands a bearer token; bodies over
``max_body_bytes`` get 413; at most ``max_concurrency`` tool runs at once and ``max_queue``
waiting (then 503), on every endpoint that runs tools or forwards calls; image and annotation
paths are read only from under ``image_roots`` and only when they are regular files. Per request:
at most ``max_batch_calls`` tool calls, ``max_request_pixels`` decoded image pixels (only the
image a call targets is decoded) and ``max_result_pixels`` of result images
(:class:`tool_backends.limits.RequestBudget`); per connection: ``read_timeout_s`` to send a
request, and at most ``max_connections`` at once. See ``docs/security.md``.
"""


# No `from __future__ import annotations` here: FastAPI reads the endpoint annotations at runtime.
import asyncio
import base64
import hashlib
import hmac
import json
import ipaddress
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from medvqa_env.errors import ConfigError, ToolError, unknown_name_message
from medvqa_env.images import DEFAULT_MAX_PIXELS
from medvqa_env.parser import MAX_ACTION_CHARS
from tool_backends.base import ToolContext, ToolResult, canonical_arguments
from tool_backends.limits import (MAX_CONTAINERS, RequestBudget, ResultDir, parse_request_json, read_timeout_protocol,
                                  read_under_roots)
from tool_backends.masks import confined_mask_reads
from tool_backends.single_flight import (AsyncSingleFlight, ForwardedImages, ImageArrivals, SingleFlight, refs_in,
                                         request_key)
from tool_backends.toolbox import ToolBackend, ToolCache, cache_key
from tool_backends import threads
from tool_backends.observation_share import ObservationShare
from tool_backends.trajectories import TrajectoryObserver
from tool_backends.wire import (FRAMES, ImageStore, UnknownImage, WireError, decode_image_entry, entry_kind,
                                pack_frames,
                                result_to_wire, target_index)

log = logging.getLogger(__name__)
MAX_ANNOTATIONS = 1024
"""Boxes, masks and labels a call's ``context`` may carry, each (more: 400)."""


@dataclass
class ServerSettings:
    """How a tool server protects itself. See the module docstring."""

    host: str = "127.0.0.1"
    token: str | None = None
    """Bearer token clients must send; required when ``host`` is not loopback."""
    max_body_bytes: int = 64 * 1024 * 1024
    max_concurrency: int = 4
    max_queue: int = 64
    image_roots: Sequence[str] = field(default_factory=tuple)
    """Directories the server may read client-named files from (``path`` images, annotation masks)."""
    cache_size: int = 1024
    """Results cached by (tool, arguments, image, record) so a GRPO group pays once; 0 disables."""
    max_images: int = 64
    image_store_mb: int = 512
    """Recently uploaded images kept decoded, so clients can send ``{"ref": digest}`` instead."""
    done_if_invalid: bool = False
    """verl-tool: whether a turn without a tool call ends the trajectory."""
    result_dir: str | None = None
    """Where result images go for clients asking ``image_format: path`` (co-located clients)."""
    max_pixels: int = DEFAULT_MAX_PIXELS
    """Largest decoded image (width x height) a request may carry; bigger ones (and decompression
    bombs) get 400 before their pixels are allocated."""
    max_batch_calls: int = 64
    """Tool calls one request may make (``/call_batch`` entries, ``/get_observation`` calls in all)."""
    max_request_pixels: int | None = None
    """Decoded image pixels one request may cost in all (only the image a call targets is decoded);
    ``None``: twice ``max_pixels``."""
    max_result_pixels: int | None = None
    """Result-image pixels one response may carry past its first result image; a call past it gets
    an error result. ``None``: ``max_pixels``."""
    max_action_chars: int = MAX_ACTION_CHARS
    """Longest model turn ``/get_observation`` parses (longer ones observe an error)."""
    result_dir_mb: int = 1024
    """Bound on the files kept under ``result_dir`` (oldest deleted first)."""
    read_timeout_s: float = 30.0
    """A connection must send a request's headers within this of opening (or of its last response),
    and each part of a body within this of the previous one (else 408)."""
    max_connections: int = 256
    """Open connections (and requests in flight) at once; more get 503 from uvicorn."""
    body_timeout_s: float = 60.0
    """A request's whole body must be in within this of its head (else 408), however it trickles."""
    upload_wait_s: float = 2.0
    """How long a request referring to an image another request is about to upload (a GRPO group's
    shared image, optimistic refs) waits for it before getting its own 409, in all (however many
    refs it names); 0 disables. A request whose client disconnects stops waiting."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only.

    >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_settings(settings: ServerSettings) -> None:
    if not is_loopback(settings.host) and not settings.token:
        raise ConfigError(f"refusing to serve on {settings.host!r} without a token: set --token-env "
                          "(or bind 127.0.0.1)")
    if settings.max_concurrency < 1 or settings.max_body_bytes < 1024:
        raise ConfigError(f"expected max_concurrency >= 1 and max_body_bytes >= 1024, got {settings!r}")
    limits = {k: getattr(settings, k) for k in ("max_batch_calls", "max_request_pixels", "max_result_pixels",
                                                "max_action_chars", "max_connections", "read_timeout_s", "body_timeout_s")}
    if any(v is not None and v <= 0 for v in limits.values()):
        raise ConfigError(f"expected every limit to be > 0, got {limits}")


LOOPBACK_NAMES = ("localhost",)


def _host_name(value: str) -> str:
    """The host part of a ``Host`` header or an origin's authority (no port, no brackets).

    >>> _host_name("127.0.0.1:7660"), _host_name("[::1]:80"), _host_name("localhost")
    ('127.0.0.1', '::1', 'localhost')
    """
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.rpartition(":")[0] if value.count(":") == 1 else value


def refuse_head(scope, headers, settings: "ServerSettings") -> tuple[int, str] | None:
    """Why a request is refused from its head alone (status, sentence), or ``None``: run before a
    byte of its body is read, on every endpoint. ``/health`` is open. With a token, everything else
    needs it. Without one (a loopback server: any local process may call it), a request must
    name a loopback ``Host`` and ``Origin`` (if any), and a ``POST`` must say ``application/json``:
    a web page can send neither without the browser first asking the server's permission, which
    it never gives (no CORS), so it can neither fire requests blind nor read answers through DNS
    rebinding."""
    if scope["path"] == "/health" and scope["method"] in ("GET", "HEAD"):
        return None
    if settings.token:
        got = headers.get("authorization", "")
        if not hmac.compare_digest(got.encode("latin-1", "replace"), f"Bearer {settings.token}".encode()):
            return 401, "missing or wrong bearer token"
        return None
    host = headers.get("host")
    if host is not None and not is_loopback(_host_name(host)):
        return 403, (f"Host {host[:80]!r} is not a loopback name: a server without a token answers only "
                     "requests addressed to this machine (set --token-env to serve other names)")
    origin = headers.get("origin")
    if origin is not None:
        scheme, _, authority = origin.partition("://")
        if scheme not in ("http", "https") or not is_loopback(_host_name(authority)):
            return 403, (f"Origin {origin[:80]!r} is not this machine: a server without a token answers "
                         "no web page but its own")
    return None


def refuse_media(scope, headers, settings: "ServerSettings") -> tuple[int, str] | None:
    """Without a token, a body must say it is ``application/json`` (415 otherwise; see
    :func:`refuse_head`). Checked after the body's declared size, before its first byte."""
    if settings.token or scope["method"] in ("GET", "HEAD", "OPTIONS"):
        return None
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        return 415, f"expected content-type application/json, got {media[:60] or 'none'!r}"
    return None


class RequestGate:
    """ASGI middleware in front of every endpoint: one request path with one set of checks.

    1. :func:`refuse_head` (token; without one ``Host`` and ``Origin``), the declared length and
       :func:`refuse_media` (without a token, ``application/json``) before any body byte is read:
       an unauthenticated ``Expect: 100-continue`` gets its refusal, never ``100 Continue``, and a
       refused request's connection is closed with its body unread;
    2. the body: over ``max_body_bytes`` (by ``Content-Length`` or while streaming) 413; a part
       later than ``read_timeout_s`` after the previous one, or the whole body not in within
       ``body_timeout_s``, 408;
    3. the request runs with its whole body in hand, every endpoint ``POST /call`` included
       through ``app`` (FastAPI's routing, request, response and exception handler): one request
       path. (``/call`` once skipped FastAPI; ``benchmarks/results/call_route.md`` measured what
       that saved beside a real tool call and it went.);
    4. a client that disconnects while its request waits (for an upload, a slot, a shared
       computation) ends it: nothing runs for nobody. A computation other requests share goes on.
    """

    def __init__(self, app, settings: "ServerSettings", answer=None) -> None:
        self.app, self.settings = app, settings  # ``answer``: unused (/call is routed by ``app``)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from starlette.datastructures import Headers

        headers = Headers(scope=scope)
        refusal = refuse_head(scope, headers, self.settings)
        if refusal is not None:
            return await _plain(send, *refusal, close=True)
        if scope["method"] in ("GET", "HEAD"):  # no body is read
            return await self.app(scope, receive, send)
        raw = await self._body(scope, headers, receive, send)
        if raw is None:  # refused (answered) or the client went away
            return
        gone = asyncio.Event()
        finished = False
        me = asyncio.current_task()
        cancelled_by_us = False

        async def watch():  # the real receive now says only one thing: the client has gone
            nonlocal cancelled_by_us
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            if not finished:
                cancelled_by_us = True
                me.cancel()

        async def sent(message):
            nonlocal finished
            if message["type"] == "http.response.body" and not message.get("more_body"):
                finished = True
            await send(message)

        given = False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        watcher = asyncio.ensure_future(watch())
        try:
            await self.app(scope, replay, sent)
        except asyncio.CancelledError:
            if not cancelled_by_us:
                raise
            if hasattr(me, "uncancel"):
                me.uncancel()
        finally:
            finished = True
            watcher.cancel()

    async def _body(self, scope, headers, receive, send) -> bytes | None:
        """The whole body within the limits of the class docstring, or ``None`` once refused."""
        s = self.settings
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return await _plain(send, 400, f"malformed content-length {length[:20]!r}", close=True)
            if int(length) > s.max_body_bytes:
                return await _plain(send, 413, f"request body of {int(length)} bytes is over the limit of "
                                               f"{s.max_body_bytes}", close=True)
        refusal = refuse_media(scope, headers, s)
        if refusal is not None:
            return await _plain(send, *refusal, close=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.body_timeout_s
        chunks, seen = [], 0
        while True:
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                message = await _within(receive(), min(s.read_timeout_s, left))
            except asyncio.TimeoutError:
                detail = (f"the request body was not in within {s.body_timeout_s:g} s" if deadline - loop.time() <= 0
                          else f"the request body stalled for over {s.read_timeout_s:g} s")
                return await _plain(send, 408, detail, close=True)
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > s.max_body_bytes:
                return await _plain(send, 413, f"request body is over the limit of {s.max_body_bytes} bytes",
                                    close=True)
            chunks.append(chunk)
            if not message.get("more_body"):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _plain(send, status: int, detail: str, close: bool = False) -> None:
    """A ``{"detail": ...}`` answer; ``close``: the connection closes after it (a body left unread)."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _within(awaitable, timeout_s: float | None):
    """``await awaitable`` within ``timeout_s`` (``asyncio.TimeoutError`` past it), without the task
    per call ``asyncio.wait_for`` makes before Python 3.12 (``asyncio.timeout``, from 3.11)."""
    if timeout_s is None:
        return await awaitable
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(timeout_s):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout_s)


class ToolService:
    """The framework-free core: decode a call, run it on its backend, cache, encode the result."""

    def __init__(self, backends: Mapping[str, ToolBackend], settings: ServerSettings) -> None:
        self.backends = dict(backends)
        self.settings = settings
        self.specs = {}
        for backend in dict.fromkeys(self.backends.values()):
            for spec in backend.specs():
                if spec.name in self.backends:
                    self.specs[spec.name] = spec
        self.cache = ToolCache(settings.cache_size) if settings.cache_size > 0 else None
        self.store = ImageStore(settings.image_store_mb * 1024 * 1024)
        self.result_dir = ResultDir(settings.result_dir, settings.result_dir_mb << 20) if settings.result_dir else None
        self.started = time.time()
        self.calls = 0
        self.computed = 0
        self.uploads = 0  # image entries that came as bytes, not as a ``{"ref": digest}``
        """Tool runs (calls that neither hit the cache nor joined an identical call in flight)."""
        self.flights = SingleFlight()
        self._count_lock = threading.Lock()

    def context(self, raw: Any) -> ToolContext:
        if raw is not None and not isinstance(raw, Mapping):
            raise WireError(f"expected 'context' to be an object, got {type(raw).__name__}")
        annotations = raw.get("annotations") if raw is not None else None
        if isinstance(annotations, Mapping):  # before any of them is looked at: a path is a file system call
            for kind in ("boxes", "masks", "labels"):
                entries = annotations.get(kind)
                if isinstance(entries, list) and len(entries) > MAX_ANNOTATIONS:
                    raise WireError(f"'context' has {len(entries)} annotation {kind}; the limit is {MAX_ANNOTATIONS}")
        try:
            ctx = ToolContext.from_dict(raw)
        except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as e:  # OverflowError: a 400-digit box
            raise WireError(f"malformed 'context': {e}") from None
        ann = ctx.annotations
        if not all(math.isfinite(v) for box in ann.boxes for v in box.bbox):
            raise WireError("malformed 'context': annotation boxes need finite coordinates")
        # annotation mask paths are not looked at here: a name checked now could be a symlink, a
        # FIFO or a device by the time a tool opens it. The tool reads them through read_mask
        # (_compute), which checks the open descriptor.
        return ctx

    def read_mask(self, file: str) -> bytes:
        """A client-named annotation mask file's bytes, as an image ``path`` is read
        (:func:`~tool_backends.limits.read_under_roots`: under the image roots, opened without
        following a symlink, a regular file within the size cap, checked on the descriptor)."""
        return read_under_roots(file, self.settings.image_roots, 4 * self.settings.max_pixels + (1 << 20))

    def budget(self) -> RequestBudget:
        """A fresh :class:`RequestBudget` for one request."""
        s = self.settings
        return RequestBudget(s.max_batch_calls, s.max_request_pixels or 2 * s.max_pixels,
                             s.max_result_pixels or s.max_pixels)

    def target(self, name: str, arguments: Any, n_images: int) -> int | None:
        """The image a call reads (aliases such as ``img_idx`` resolved), or ``None``."""
        if not isinstance(arguments, Mapping):
            return None
        spec = self.specs.get(name)
        try:
            arguments = canonical_arguments(spec, arguments) if spec is not None else arguments
        except Exception:  # the tool reports conflicting aliases itself
            pass
        return target_index(arguments, n_images)

    def decode_call(self, call: Any, budget: RequestBudget | None = None):
        """``(name, arguments, images, context)``; of the images only the one the call targets is
        decoded (the others are ``None``: every tool reads one image)."""
        if not isinstance(call, Mapping):
            raise WireError(f"expected a call object, got {type(call).__name__}")
        name = call.get("tool")
        if not isinstance(name, str):
            raise WireError("expected 'tool' to be a string")
        if name not in self.backends:
            raise LookupError(unknown_name_message("tool", name, self.backends))
        arguments = call.get("arguments", {})
        raw_images = call.get("images") or []
        if not isinstance(raw_images, list) or len(raw_images) > self.settings.max_images:
            raise WireError(f"expected 'images' to be a list of at most {self.settings.max_images} entries")
        images: list = [None] * len(raw_images)
        index = self.target(name, arguments, len(raw_images))
        if index is not None and raw_images[index] is not None:
            images[index] = self.decode(raw_images[index], budget)
        return name, arguments, images, self.context(call.get("context"))

    def decode(self, entry: Any, budget: RequestBudget | None = None):
        image = decode_image_entry(entry, self.settings.image_roots, self.settings.max_pixels, store=self.store)
        if not (isinstance(entry, Mapping) and "ref" in entry):  # a ref decodes nothing
            self.uploads += 1
            if budget is not None:
                budget.take_input(image)
        return image

    def encode(self, result: ToolResult, image_format: Any, derived_ok: Any = False,
               parts: list[bytes] | None = None) -> dict[str, Any]:
        fmt = image_format if isinstance(image_format, str) else "png"
        written: list[str] = []
        wire = result_to_wire(result, fmt, self.settings.result_dir, derived_ok=derived_ok is True, parts=parts,
                              written=written)
        if self.result_dir is not None:
            for entry in wire["images"]:
                if "path" in entry and entry["path"] not in written:
                    self.result_dir.used(entry["path"])
            for path in written:  # only what this server created is ever deleted
                self.result_dir.wrote(path)
        return wire

    def run(self, name: str, arguments: Any, images: list, context: ToolContext) -> ToolResult:
        """Run a decoded call; never raises (same guarantees as :meth:`Toolbox.call`). Identical
        calls in flight at once (a GRPO group's) share one computation (:mod:`.single_flight`)."""
        self.calls += 1
        key = self.result_key(name, arguments, images, context)
        if key is not None and self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                return hit
        index = self.target(name, arguments, len(images))
        if index is not None and images[index] is None:
            return ToolResult.failure(f"image {index} was not sent with the call.")
        return self.flights.run(key, lambda: self._compute(key, name, arguments, images, context))

    def result_key(self, name: str, arguments: Any, images: list, context: ToolContext) -> str | None:
        """The key a decoded call's result is cached and shared under (``None``: never shared)."""
        if not isinstance(arguments, Mapping):
            return None
        index = arguments.get("image_index", 0)
        if not (isinstance(index, int) and -len(images) <= index < len(images) and images[index] is not None):
            return None
        key = cache_key(name, arguments, images, context)
        if key is None:
            return None
        blob = json.dumps(context.to_dict(), sort_keys=True, default=str).encode()  # clients need not send record ids
        return key + "|" + hashlib.blake2b(blob, digest_size=12).hexdigest()

    def cached(self, name: str, arguments: Any, images: list, context: ToolContext) -> ToolResult | None:
        """A decoded call's cached result, or ``None``; counts nothing (:meth:`answered_cached`
        counts a result that answered a call; otherwise :meth:`run` looks again and counts)."""
        key = self.result_key(name, arguments, images, context) if self.cache is not None else None
        return self.cache.get(key, count=False) if key is not None else None

    def answered_cached(self) -> None:
        """Count a call answered from :meth:`cached`'s result: a call and a cache hit."""
        self.calls += 1
        self.cache.count_hit()

    def _compute(self, key: str | None, name: str, arguments: Any, images: list, context: ToolContext) -> ToolResult:
        with self._count_lock:
            self.computed += 1
        try:
            with confined_mask_reads(self.read_mask):  # never open(name) a client's mask path
                result = self.backends[name].call(name, images, arguments, context)
        except ToolError as e:
            result = ToolResult.failure(str(e))
        except Exception as e:  # a tool bug is the model's observation, not a 500
            log.exception("tool %r crashed", name)
            result = ToolResult.failure(f"Tool {name!r} crashed: {type(e).__name__}: {e}")
        if key is not None and self.cache is not None and result.ok:
            self.cache.put(key, result)
        return result


class ResponseMemo:
    """The last responses' bytes, keyed by the result object they serialise (and the format asked
    for). Holding the result keeps its ``id`` from being reused while its entry lives; bounded by
    ``max_bytes``. Thread-safe: worker threads look up and add."""

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        from collections import OrderedDict

        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict = OrderedDict()  # (id(result), key) -> (result, (body, media type))
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, result: ToolResult, key: tuple) -> tuple[bytes, str] | None:
        with self._lock:
            entry = self._entries.get((id(result), key))
            if entry is None or entry[0] is not result:
                return None
            self._entries.move_to_end((id(result), key))
            self.hits += 1
            return entry[1]

    def put(self, result: ToolResult, key: tuple, response: tuple[bytes, str]) -> None:
        size = len(response[0])
        if size > self.max_bytes // 4:  # one big image response would evict everything else
            return
        with self._lock:
            old = self._entries.pop((id(result), key), None)
            self._bytes -= len(old[1][0]) if old else 0
            self._entries[(id(result), key)] = (result, response)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, (body, _)) = self._entries.popitem(last=False)
                self._bytes -= len(body)


def create_app(backends: Mapping[str, ToolBackend], settings: ServerSettings | None = None,
               proxy: Mapping[str, Any] | None = None):
    """The FastAPI app. ``proxy`` (router mode) maps tool names to upstream HTTP clients whose
    ``/call`` bodies are forwarded unchanged."""
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.concurrency import run_in_threadpool

    settings = settings or ServerSettings()
    check_settings(settings)
    service = ToolService(backends, settings)
    observer = TrajectoryObserver(service, done_if_invalid=settings.done_if_invalid,
                                  max_action_chars=settings.max_action_chars)
    shared = ObservationShare(observer)  # a group's identical /get_observation turns step once
    app = FastAPI(title="MedVQA-Gym tool server", docs_url=None, redoc_url=None)
    gate = asyncio.Semaphore(settings.max_concurrency)
    arrivals = ImageArrivals(settings.upload_wait_s)
    forwarded: dict[str, tuple[ImageArrivals, ForwardedImages]] = {}  # router mode, per tool: its upstream's images
    app.state.forwarded = forwarded
    forwarding = app.state.forwarding = AsyncSingleFlight()  # router mode: identical /call bodies in flight
    waiting = {"n": 0}
    app.state.service = service
    app.state.arrivals = arrivals
    # The token (or Host/Origin/content type), body size and body deadlines: RequestGate, added
    # below, in front of every endpoint, before any body byte is read.

    async def parsed(raw: bytes, count: bool = True) -> Any:
        """A body's JSON (:func:`~tool_backends.limits.parse_request_json`); a big one is parsed off
        the loop. ``count=False``: no count of objects and arrays (``/get_observation``: model turns
        are text, and a policy's turn may hold thousands of braces)."""
        limit = MAX_CONTAINERS if count else None
        try:
            if len(raw) > 1 << 20:
                return await run_in_threadpool(parse_request_json, raw, limit)
            return parse_request_json(raw, limit)
        except WireError as e:
            raise HTTPException(400, str(e)) from None

    async def body(request: Request, count: bool = True) -> Any:
        return await parsed(await request.body(), count)

    async def guarded(fn, *args):
        """Run ``fn`` in a worker thread under the concurrency gate; map wire errors to 4xx."""
        if waiting["n"] >= settings.max_queue:
            raise HTTPException(503, f"server busy: {waiting['n']} requests waiting")
        waiting["n"] += 1
        try:
            await gate.acquire()
        finally:
            waiting["n"] -= 1
        try:
            return refusing(await run_in_threadpool(refused, fn, *args))
        finally:
            gate.release()

    def refused(fn, *args):
        """``fn(*args)``, or the ``HTTPException`` a wire error maps to (returned, not raised: see ``refusing``)."""
        try:
            return fn(*args)
        except (WireError, TypeError) as e:
            return HTTPException(400, str(e))
        except PermissionError as e:
            return HTTPException(403, str(e))
        except UnknownImage as e:
            return HTTPException(409, str(e))
        except LookupError as e:
            return HTTPException(404, str(e.args[0] if e.args else e))

    def refusing(value):
        if isinstance(value, HTTPException):  # raised here, on the event loop, with no worker frames attached
            raise value
        return value

    def render(content: dict, parts: list[bytes] | None = None) -> tuple[bytes, str]:
        """Results are plain JSON already (the tool contract): serialise them once, without FastAPI's
        per-value ``jsonable_encoder`` walk (~0.25 ms for a mask's run lengths). Result images
        left in ``parts`` follow the JSON as bytes (:data:`FRAMES`)."""
        try:
            raw = json.dumps(content, allow_nan=False, separators=(",", ":")).encode()
        except (TypeError, ValueError):  # a tool put numpy or NaN into ``data``: the slow, lenient path
            from fastapi.encoders import jsonable_encoder

            raw = json.dumps(jsonable_encoder(content), default=str, separators=(",", ":")).encode()
        if parts:
            return pack_frames(raw, parts), FRAMES
        return raw, "application/json"

    def json_response(content: dict, parts: list[bytes] | None = None) -> Response:
        raw, media_type = render(content, parts)
        return Response(content=raw, media_type=media_type)

    def frames_accepted(request: Request) -> list[bytes] | None:
        """A list to collect raw result images in, when the client accepts :data:`FRAMES`."""
        return [] if FRAMES in request.headers.get("accept", "") else None

    @app.get("/health")
    async def health():
        cache = service.cache
        return {"status": "ok", "tools": sorted(service.backends), "calls": service.calls,
                "cache_hits": cache.hits if cache else 0, "computed": service.computed,
                "joined_in_flight": service.flights.joined + in_flight.joined, "calls_received": service.calls + in_flight.joined,
                "waited_for_upload": arrivals.waited, "uploads": service.uploads, "responses_reused": responses.hits, "observations_shared": shared.shared,
                "threads": threads.current(), "uptime_s": round(time.time() - service.started, 1)}

    @app.get("/tools")
    async def tools(request: Request):
        return {"tools": [s.openai_schema() for s in service.specs.values()]}

    def run_one(call: Any, budget: RequestBudget, stored=None) -> ToolResult:
        """One call's result, in a worker thread; ``stored()`` runs once its images are decoded (and stored)."""
        spent = budget.take_call()
        if spent is not None:
            return ToolResult.failure(spent)
        name, arguments, images, context = service.decode_call(call, budget)
        if stored is not None:
            stored()
        return budget.take_result(service.run(name, arguments, images, context))

    def one_call(call: Any, parts: list[bytes] | None = None, budget: RequestBudget | None = None) -> dict[str, Any]:
        result = run_one(call, budget or service.budget())
        return service.encode(result, call.get("image_format", "png"), call.get("derived_ok", False), parts)

    responses = ResponseMemo()

    def call_response(call: Any, frames: bool, stored) -> tuple[bytes, str]:
        """A ``/call``'s body and media type. A GRPO group's identical calls get one result object
        (the flight's, then the cache's): its response is serialised once and its bytes reused."""
        result = run_one(call, service.budget(), stored)
        key = (call.get("image_format", "png"), call.get("derived_ok", False) is True, frames)
        if service.result_dir is None:  # with one, each response writes its own image files
            hit = responses.get(result, key)
            if hit is not None:
                return hit
        parts = [] if frames else None
        body = render({"result": service.encode(result, key[0], key[1], parts)}, parts)
        if service.result_dir is None and result.ok:
            responses.put(result, key, body)
        return body

    in_flight = AsyncSingleFlight()  # identical /call bodies that send their images by reference

    def answered_from_cache(call: Any, frames: bool) -> tuple[bytes, str] | None:
        """On the event loop, for a call whose images all go by reference (nothing to decode): its
        response when its result is cached and that response's bytes are kept (tens of us, no slot,
        no thread hop: the rest of a GRPO group, and a reference the server lacks, which raises
        ``UnknownImage`` here for its 409); ``None`` to take the worker-thread path."""
        if service.result_dir is not None:  # each response writes its own image files
            return None
        budget = service.budget()
        budget.take_call()  # one call: within any limit
        result = service.cached(*service.decode_call(call, budget))
        if result is None:
            return None
        hit = responses.get(result, (call.get("image_format", "png"), call.get("derived_ok", False) is True, frames))
        if hit is None:  # serialising it can take milliseconds: not on the loop
            return None
        budget.take_result(result)  # a response's first images always fit
        service.answered_cached()
        return hit

    def shared_key(payload: dict, frames: bool) -> bytes | None:
        """The key under which identical calls share one answer: the call (tool, arguments, context,
        formats) with each image named by its digest, as canonical JSON. An upload that names its
        image's digest and the group's requests referring to that digest are the same call: they
        join the upload's computation on the event loop (holding no slot and no thread, as in the
        router). ``None`` (never shared) for an image entry that names no digest."""
        images = payload.get("images")
        if not isinstance(images, list):
            return None
        named = []
        for entry in images:  # each already checked to be exactly one kind (check_images)
            if entry is None or (isinstance(entry, dict) and set(entry) == {"ref"}):
                named.append(entry)
            elif isinstance(entry, dict) and isinstance(entry.get("digest"), str) and ("raw" in entry or "png" in entry):
                # the upload is decoded as the image of this digest (checked against its pixels, or
                # the stored image of that digest): shared under it. The base64 is not serialised again.
                named.append({"ref": entry["digest"]})
            else:
                return None
        try:
            blob = json.dumps({**payload, "images": named}, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):
            return None
        return request_key(blob.encode(), "frames" if frames else "json")

    def check_images(payload: Any) -> None:
        """400 unless ``payload["images"]`` is a list of at most ``max_images`` entries, each
        ``None``, a verl-tool string or exactly one kind of entry (:func:`~tool_backends.wire.entry_kind`):
        before any wait, any sharing and any forwarding."""
        images = payload.get("images") if isinstance(payload, dict) else None
        if images is None:
            return
        if not isinstance(images, list) or len(images) > settings.max_images:
            raise HTTPException(400, f"expected 'images' to be a list of at most {settings.max_images} entries")
        try:
            for entry in images:
                if entry is not None and not isinstance(entry, str):
                    entry_kind(entry)
        except WireError as e:
            raise HTTPException(400, str(e)) from None

    def uploads(payload: dict) -> bool:
        """Whether a call carries image bytes (not only references)."""
        return any(isinstance(e, dict) and "ref" not in e for e in payload.get("images") or ())

    async def answer_call(headers, raw: bytes) -> tuple[int, bytes, str]:
        """``POST /call``: (status, body, media type) for a request's ``headers`` (Starlette
        ``Headers``) and whole ``raw`` body; refusals raise ``HTTPException``."""
        payload = await parsed(raw)  # the token and the body's limits: RequestGate, before the body was read
        check_images(payload)
        if proxy:
            name = payload.get("tool") if isinstance(payload, dict) else None
            if isinstance(name, str) and name in proxy:  # forwarded under the same concurrency and queue limits
                refs, accept = refs_in(payload), headers.get("accept")
                waits, sent = forwarded.setdefault(name, (ImageArrivals(settings.upload_wait_s), ForwardedImages()))
                if refs and settings.upload_wait_s > 0:  # outside the gate: the upload must get a slot
                    await waits.wait(refs, sent)
                if sent.add(payload):  # an upload: its group's refs go on now (upstream, they meet it)
                    waits.settle(sent)
                return await forwarding.run(  # joining one in flight holds no slot
                    proxy[name].key("/call", raw, accept), lambda: guarded(proxy[name].forward, "/call", raw, accept))
        if not isinstance(payload, dict):
            raise HTTPException(400, "expected a JSON object")
        frames = FRAMES in headers.get("accept", "")
        refs = refs_in(payload)
        if refs and settings.upload_wait_s > 0:  # a group's other clients wait for the one uploading the image
            await arrivals.wait(refs, service.store)
        loop = asyncio.get_running_loop()

        def stored() -> None:  # an upload wakes the group's waiters now, not when its own call ends
            loop.call_soon_threadsafe(arrivals.settle, service.store)

        try:
            key = shared_key(payload, frames)
            if key is None:  # an image that names no digest: its own decode, its own slot
                content, media_type = await guarded(call_response, payload, frames, stored)
                return 200, content, media_type
            joining = key in in_flight
            if not joining and not uploads(payload):  # a lookup on the loop: nothing to decode
                hit = refusing(refused(answered_from_cache, payload, frames))
                if hit is not None:
                    return 200, *hit
            # a group's identical calls join the one in flight (the upload's, or one by reference) before the gate
            try:
                content, media_type = await in_flight.run(key, lambda: guarded(call_response, payload, frames,
                                                                               stored))
            except HTTPException:
                if not joining:
                    raise
                # another request's refusal (its upload did not match its digest, say) is not this
                # one's answer: this call goes its own way
                content, media_type = await guarded(call_response, payload, frames, stored)
            return 200, content, media_type
        finally:
            arrivals.settle(service.store)

    @app.post("/call")
    async def call(request: Request):  # its checks: RequestGate (before the body), then answer_call
        status, content, media_type = await answer_call(request.headers, await request.body())
        if not isinstance(content, bytes):  # the router's upstream client hands its buffer on as is
            content = bytes(content)
        return Response(content=content, status_code=status, media_type=media_type)

    app.add_middleware(RequestGate, settings=settings)

    @app.post("/call_batch")
    async def call_batch(request: Request):
        payload = await body(request)
        calls = payload.get("calls") if isinstance(payload, dict) else None
        if not isinstance(calls, list):
            raise HTTPException(400, "expected {'calls': [...]}")
        if len(calls) > settings.max_batch_calls:
            raise HTTPException(413, f"{len(calls)} calls in one batch; the limit is {settings.max_batch_calls}")
        parts = frames_accepted(request)
        budget = service.budget()
        return json_response({"results": await guarded(lambda: [one_call(c, parts, budget) for c in calls])}, parts)

    @app.post("/get_observation")
    async def get_observation(request: Request):
        payload = await body(request, count=False)
        if not isinstance(payload, dict) or not isinstance(payload.get("actions"), list):
            raise HTTPException(400, "expected {'trajectory_ids': [...], 'actions': [...], ...}")
        actions = payload["actions"]
        n = len(actions)
        ids = payload.get("trajectory_ids") or list(range(n))
        finish = payload.get("finish") or [False] * n
        extras = payload.get("extra_fields") or [{}] * n
        if not all(isinstance(v, list) and len(v) == n for v in (ids, finish, extras)):
            raise HTTPException(400, f"expected trajectory_ids, finish and extra_fields to have {n} entries")

        return json_response(await shared.answer(ids, actions, finish, extras, service.budget,
                                                 lambda *a: guarded(shared.batch, *a)))

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):  # keep {"detail": ...} and never echo the token
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    return app


def serve(app, host: str = "127.0.0.1", port: int = 7660, log_level: str = "warning") -> None:
    """Run ``app`` with uvicorn in this process (blocking), with the connection limits of its
    settings (``max_connections``, ``read_timeout_s``)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, **connection_limits(app))


def connection_limits(app) -> dict[str, Any]:
    """uvicorn options enforcing ``app``'s connection limits (for ``uvicorn.run`` / ``uvicorn.Config``)."""
    service = getattr(getattr(app, "state", None), "service", None)
    settings = service.settings if service is not None else ServerSettings()
    return {"limit_concurrency": settings.max_connections,
            "http": read_timeout_protocol(settings.read_timeout_s, settings.max_connections),
            "timeout_keep_alive": max(1, min(5, int(settings.read_timeout_s)))}


def data_url_to_bytes(url: str) -> bytes:
    """The bytes inside a ``data:...;base64,`` URL.

    >>> data_url_to_bytes("data:image/png;base64,aGk=")
    b'hi'
    """
    return base64.b64decode(url.split(",", 1)[1])


__all__ = ["ServerSettings", "ToolService", "create_app", "serve", "connection_limits", "is_loopback", "RequestGate",
           "refuse_head", "refuse_media",
           "check_settings", "data_url_to_bytes"]
