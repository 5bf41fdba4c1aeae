"""``HTTPToolBackend``: the client side of :mod:`tool_backends.server` (and of the router).

One pool of keep-alive connections per backend; each call has a deadline of ``timeout_s`` in total,
and retries with exponential backoff only what is safe and quick to retry (connection refused or
reset, 502/503/504) within that deadline. The connections are a minimal HTTP/1.1 client on the
standard library's sockets (:class:`Connection`, with ``TCP_NODELAY``) framed by h11, not ``httpx`` as
elsewhere in the project nor ``http.client``: a tool call is on the rollout's critical path
(``benchmarks/bench_group.py``, its per-request floor table; ``benchmarks/bench_tools.py`` measures
the remote overhead per tool). A server cannot hold a call past its ``timeout_s`` (one deadline for
connecting, sending, the head, interim answers and the body, however slowly they drip), nor make the
client read more than ``max_response_mb``; a malformed answer is never guessed at, and a connection is
reused only when nothing is left on it. A timeout, a dead or hostile server or a refusal becomes a
:class:`ToolBackendError` whose message the env shows the model; the episode goes on.

The bearer token is read from the environment variable named by ``token_env`` and is never
logged, put in an error message or pickled. Pickling drops the connection pool (Ray ships envs to
workers); the copy reconnects on first use.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections import OrderedDict
from typing import Any, Mapping, NamedTuple, Sequence
from urllib.parse import urlsplit

from PIL import Image

from medvqa_env.errors import ConfigError, ToolBackendError
from tool_backends.base import ToolContext, ToolResult, ToolSpec
from tool_backends.base import image_digest
from tool_backends.wire import (FRAMES, TRANSPORTS, WireError, encode_images_for_call, request_json, result_from_wire,
                                target_index, unpack_frames)

log = logging.getLogger(__name__)
RETRY_STATUS = (502, 503, 504)


class _Everything:
    """A set that contains every digest (optimistic references)."""

    def __contains__(self, item) -> bool:
        return True


class ServerUnavailable(ToolBackendError):
    """The server did not answer (refused, reset, timed out). ``str()`` is the model-facing
    message (the episode goes on); ``problem`` says what failed, for a person."""

    def __init__(self, message: str, problem: str) -> None:
        super().__init__(message)
        self.problem = problem


def unreachable_message(url: str, problem: str, tools: Sequence[str] | None = None) -> str:
    """What a person reads when a configured tool server cannot be reached: what failed and what
    to check.

    >>> print(unreachable_message("http://127.0.0.1:7660", "ConnectionRefusedError, 4 attempts", ["segment"]))
    cannot reach the tool server at http://127.0.0.1:7660 (configured for ['segment']): ConnectionRefusedError, 4 attempts. Check that a server is running there (`medvqa-tools serve --tools segment --port 7660`), that host and port are right, and that its health answers (`curl http://127.0.0.1:7660/health`).
    """
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    tools_flag = f" --tools {','.join(tools)}" if tools else ""
    return (f"cannot reach the tool server at {url}" + (f" (configured for {list(tools)})" if tools else "")
            + f": {problem}. Check that a server is running there (`medvqa-tools serve{tools_flag} --port {port}`), "
            f"that host and port are right, and that its health answers (`curl {url.rstrip('/')}/health`).")


class Response(NamedTuple):
    """A complete HTTP response (status, lower-cased headers, body)."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


MAX_HEADER_BYTES = 65536
"""Bytes a response's head (status line and headers) may take."""
MAX_HEADERS = 100
MAX_INTERIM = 8
"""Interim (1xx) answers a response may open with before the client gives up on it."""
MAX_RESPONSE_BYTES = 256 << 20
"""Default for the largest response body a client reads (``HTTPToolBackend(max_response_mb=...)``)."""


class ProtocolError(http.client.HTTPException):
    """A response that breaks HTTP/1.1's framing or one of the client's bounds (head size,
    header count, interim answers)."""


class ResponseTooLarge(ProtocolError):
    """A response body over the client's ``max_response_bytes`` (not retried: it would be again)."""


class Connection:
    """One keep-alive HTTP/1.1 connection; the framing is h11's (strict: a malformed or ambiguous
    answer is a :class:`ProtocolError`, never a guess). A request has **one deadline** for all of it
    -- sending, the head, any interim answers, the body -- however slowly the server drips it;
    the head is bounded by :data:`MAX_HEADER_BYTES` and :data:`MAX_HEADERS`, interim answers by
    :data:`MAX_INTERIM`, the body by ``max_response_bytes``. A connection is kept for the next
    request only when the answer ended exactly where its framing says (no bytes after it) and
    both sides may go on. Transport failures raise ``OSError`` (``TimeoutError`` past the
    deadline) or ``http.client.HTTPException`` (``RemoteDisconnected`` when a kept connection
    was closed by the server before answering)."""

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None,
                 max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        import h11

        self.host, self.port = host, port
        self.max_response_bytes = int(max_response_bytes)
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.will_close = False

    def request(self, method: str, path: str, body: bytes | None, headers: Mapping[str, str],
                timeout: float) -> Response:
        import h11

        deadline = time.monotonic() + timeout
        fields = [("host", f"{self.host}:{self.port}")]
        for k, v in headers.items():
            if any(c in str(k) + str(v) for c in "\r\n\0"):  # as http.client: no header splitting
                raise ValueError(f"invalid header {k!r}")
            fields.append((str(k), str(v)))
        if body is not None or method in ("POST", "PUT"):
            fields.append(("content-length", str(len(body or b""))))
        conn = self._h11
        try:
            out = conn.send(h11.Request(method=method, target=path, headers=fields))
            if body:
                out += conn.send(h11.Data(data=body))
            out += conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError as e:
            raise ValueError(f"cannot send this request: {e}") from None
        try:
            self._send(out, deadline)
        except (BrokenPipeError, ConnectionResetError):
            # the server answered early (a refusal) and closed: its answer may be waiting for us
            self.will_close = True
        try:
            return self._response(method, deadline)
        except h11.RemoteProtocolError as e:
            self.will_close = True
            raise ProtocolError(f"malformed response: {e}") from None

    def _send(self, data: bytes, deadline: float) -> None:
        self.sock.settimeout(self._left(deadline))
        self.sock.sendall(data)  # the timeout bounds the whole sendall

    @staticmethod
    def _left(deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        return left

    def _response(self, method: str, deadline: float) -> Response:
        import h11

        conn, received, interim = self._h11, 0, 0
        status, fields, chunks, size = None, {}, [], 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                self.sock.settimeout(self._left(deadline))
                want = 65536  # until the head is in, never more than its bound past it: h11 then refuses it
                if status is None:
                    want = max(1, min(want, MAX_HEADER_BYTES * (interim + 1) + 1 - received))
                data = self.sock.recv(want)
                if not data and not received:
                    self.will_close = True
                    raise http.client.RemoteDisconnected("Remote end closed connection without response")
                received += len(data)
                conn.receive_data(data)
            elif isinstance(event, h11.InformationalResponse):
                interim += 1
                if interim > MAX_INTERIM:
                    self.will_close = True
                    raise ProtocolError(f"more than {MAX_INTERIM} interim (1xx) answers")
            elif isinstance(event, h11.Response):
                if len(event.headers) > MAX_HEADERS:
                    self.will_close = True
                    raise ProtocolError(f"more than {MAX_HEADERS} headers")
                status = event.status_code
                for name, value in event.headers:
                    name, value = name.decode("latin-1"), value.decode("latin-1")
                    fields[name] = f"{fields[name]}, {value}" if name in fields else value
                length = fields.get("content-length", "")
                if length.isdigit() and int(length) > self.max_response_bytes:
                    self.will_close = True
                    raise ResponseTooLarge(f"a response body of {int(length)} bytes is over the client's "
                                           f"limit of {self.max_response_bytes}")
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.max_response_bytes:
                    self.will_close = True
                    raise ResponseTooLarge(f"a response body over the client's limit of {self.max_response_bytes} "
                                           "bytes")
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            else:  # ConnectionClosed before the answer was whole
                self.will_close = True
                raise http.client.IncompleteRead(b"".join(chunks))
        trailing, closed = conn.trailing_data
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE and not trailing and not closed:
            conn.start_next_cycle()
        else:  # bytes after the answer, or either side must close: never read as the next answer
            self.will_close = True
        content = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return Response(status, fields, content)

    def idle_ok(self) -> bool:
        """Whether a kept connection may carry the next request: nothing has arrived on it
        since its last answer (unsolicited bytes, or the server's close)."""
        import select

        try:
            return not select.select([self.sock], [], [], 0)[0]
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        self.sock.close()


class ConnectionPool:
    """Keep-alive :class:`Connection` s to one server, shared by threads (at most ``size`` kept
    idle). A kept connection that has anything to read before its next request (the server closed
    it, or sent bytes nobody asked for) is dropped; one the server closes just as the request goes
    out is replaced once, within the same deadline, as a fresh one would have been used."""

    def __init__(self, url: str, size: int, connect_timeout_s: float,
                 max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or (443 if self.https else 80)
        self.size, self.connect_timeout_s = int(size), float(connect_timeout_s)
        self.max_response_bytes = int(max_response_bytes)
        self._tls = ssl.create_default_context() if self.https else None
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def _new(self, timeout: float) -> Connection:
        return Connection(self.host, self.port, min(self.connect_timeout_s, timeout), self._tls,
                          self.max_response_bytes)

    def _kept(self) -> Connection | None:
        while True:
            with self._lock:
                kept = self._idle.pop() if self._idle else None
            if kept is None or kept.idle_ok():
                return kept
            kept.close()

    def request(self, method: str, path: str, body: bytes | None, headers: Mapping[str, str],
                timeout: float) -> Response:
        """One request on a kept connection (or a new one), all within ``timeout``; raises
        ``OSError`` / ``http.client.HTTPException`` for transport failures, ``TimeoutError`` on
        timeouts."""
        deadline = time.monotonic() + timeout
        kept = self._kept()
        if kept is None:
            return self._send(self._new(timeout), method, path, body, headers, timeout)
        try:
            return self._send(kept, method, path, body, headers, timeout)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            # the server closed the kept connection as the request went out: a fresh one gets it
            left = Connection._left(deadline)
            return self._send(self._new(left), method, path, body, headers, left)

    def _send(self, conn: Connection, method: str, path: str, body: bytes | None,
              headers: Mapping[str, str], timeout: float) -> Response:
        try:
            response = conn.request(method, path, body, headers, timeout)
        except BaseException:
            conn.close()
            raise
        with self._lock:
            keep = not conn.will_close and len(self._idle) < self.size
            if keep:
                self._idle.append(conn)
        if not keep:
            conn.close()
        return response

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class HTTPToolBackend:
    """Calls ``tools`` on the server at ``url``.

    Args:
        tools: names to use from this server (``None``: all it serves).
        url: ``http://host:port`` of a tool server or router.
        timeout_s: deadline for one call, retries included.
        retries: extra attempts after a connection failure or 502/503/504.
        backoff_s: first retry delay; doubles each time.
        token_env: name of the environment variable holding the bearer token.
        transport: how images travel: ``png``, ``raw`` or ``path`` (see :mod:`tool_backends.wire`).
        shared_dir: for ``path``, a directory the server can read (one of its image roots).
        pool_size: keep-alive connections kept open.
        max_response_mb: the largest answer read (a bigger one is a ``ToolBackendError``).
        result_format: ``png``, ``raw`` or ``path`` (read from ``shared_dir``, where the server's
            ``--result-dir`` points) for the images coming back.
        derived_images: let the server send a mask overlay or drawn boxes as a recipe the client
            redraws from the image it sent (identical pixels, no image transfer).
        optimistic_refs: send every image as its digest first, and the image itself only when the
            server answers 409: the n envs of a GRPO group then upload a shared image once between
            them, at the price of one small extra round trip for an image nobody sent before.
    """

    def __init__(self, tools: Sequence[str] | None = None, url: str = "http://127.0.0.1:7660", timeout_s: float = 30.0,
                 retries: int = 2, backoff_s: float = 0.05, token_env: str | None = None, transport: str = "raw",
                 shared_dir: str | None = None, pool_size: int = 8, result_format: str = "raw",
                 connect_timeout_s: float = 2.0, derived_images: bool = True, optimistic_refs: bool = True,
                 max_response_mb: float = MAX_RESPONSE_BYTES / (1 << 20)) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"expected an http(s) URL for a tool server, got {url!r}")
        if transport not in TRANSPORTS:
            raise ConfigError(f"expected transport in {list(TRANSPORTS)}, got {transport!r}")
        if transport == "path" and not shared_dir:
            raise ConfigError("the 'path' transport needs a shared_dir the server can read")
        if result_format not in TRANSPORTS:
            raise ConfigError(f"expected result_format in {list(TRANSPORTS)}, got {result_format!r}")
        if result_format == "path" and not shared_dir:
            raise ConfigError("result_format 'path' needs a shared_dir (the server's --result-dir)")
        if not max_response_mb > 0:
            raise ConfigError(f"expected max_response_mb > 0, got {max_response_mb!r}")
        if not timeout_s > 0 or retries < 0:
            raise ConfigError(f"expected timeout_s > 0 and retries >= 0, got {timeout_s!r}, {retries!r}")
        if token_env is not None and not os.environ.get(token_env):
            raise ConfigError(f"token_env names {token_env!r}, but that environment variable is empty")
        self.url = url.rstrip("/")
        self.tools = list(tools) if tools is not None else None
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.token_env = token_env
        self.transport = transport
        self.shared_dir = shared_dir
        self.pool_size = int(pool_size)
        self.result_format = result_format
        self.connect_timeout_s = float(connect_timeout_s)
        self.derived_images = bool(derived_images)
        self.optimistic_refs = bool(optimistic_refs)
        self.max_response_bytes = int(max_response_mb * (1 << 20))
        self._specs: list[ToolSpec] | None = None
        self._pool: ConnectionPool | None = None
        self._auth: dict[str, str] = {}
        self._encoded: OrderedDict = OrderedDict()
        self._sent: set[str] = set()  # digests this server has received from us: sent as refs

    # ---- plumbing -------------------------------------------------------------------------
    @property
    def pool(self) -> ConnectionPool:
        if self._pool is None:
            if self.token_env:  # read at first use, never pickled (see __getstate__)
                self._auth = {"authorization": f"Bearer {os.environ.get(self.token_env, '')}"}
            self._pool = ConnectionPool(self.url, self.pool_size, self.connect_timeout_s, self.max_response_bytes)
        return self._pool

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        state["_auth"] = {}
        state["_encoded"] = OrderedDict()
        state["_sent"] = set()
        return state

    def __repr__(self) -> str:
        return f"HTTPToolBackend(url={self.url!r}, tools={self.tools!r}, transport={self.transport!r})"

    def _request(self, method: str, path: str, what: str, content: bytes | None = None,
                 headers: Mapping[str, str] | None = None) -> Response:
        """One request with the deadline and retry policy of the module docstring."""
        deadline = time.monotonic() + self.timeout_s
        delay = self.backoff_s
        pool = self.pool
        headers = {**(headers or {}), **self._auth}
        made, problem, seen = 0, f"no time left within {self.timeout_s:g} s", "no attempt made"
        for _ in range(self.retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # a backoff that woke past the deadline: not an attempt
                break
            made += 1
            try:
                response = pool.request(method, path, content, headers, remaining)
            except ResponseTooLarge as e:  # not retried: it would be as large again
                raise ToolBackendError(f"{what} sent an answer too large to read ({e}). Try another tool or "
                                       "answer without it.") from None
            except (TimeoutError, socket.timeout):
                raise ServerUnavailable(f"{what} timed out after {self.timeout_s:g} s (server {self.url}). "
                                        "Try another tool or answer without it.",
                                        problem=f"no answer within {self.timeout_s:g} s") from None
            except (OSError, http.client.HTTPException) as e:
                problem = f"could not reach {self.url} ({type(e).__name__})"
                seen = f"{type(e).__name__} ({e})" if str(e) else type(e).__name__
            else:
                if response.status_code not in RETRY_STATUS:
                    return response
                problem = f"{self.url} answered {response.status_code}"
                seen = f"it answered HTTP {response.status_code}"
            if made <= self.retries and time.monotonic() + delay < deadline:
                time.sleep(delay)
                delay *= 2
            else:
                break
        raise ServerUnavailable(f"{what} is unavailable: {problem}. Try another tool or answer without it.",
                                problem=f"{seen}, {made} attempt{'s' if made != 1 else ''}")

    def _detail(self, response: Response) -> str:
        """The server's error detail, with our token blanked out (a proxy may echo our headers)."""
        try:
            text = str(response.json().get("detail", ""))
        except Exception:
            text = response.text
        token = os.environ.get(self.token_env) if self.token_env else None
        return (text.replace(token, "[token]") if token else text)[:300]

    # ---- ToolBackend ----------------------------------------------------------------------
    def specs(self) -> list[ToolSpec]:
        if self._specs is None:
            try:
                response = self._request("GET", "/tools", f"Tool server {self.url}")
            except ServerUnavailable as e:  # for the person who configured it, not the model's advice
                raise ConfigError(unreachable_message(self.url, e.problem, self.tools)) from None
            if response.status_code != 200:
                raise ConfigError(f"tool server {self.url} refused /tools ({response.status_code}): "
                                  f"{self._detail(response)}")
            served = {}
            try:
                for entry in response.json().get("tools", []):
                    fn = entry["function"]
                    served[fn["name"]] = ToolSpec(fn["name"], fn.get("description", ""), fn.get("parameters", {}))
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                raise ConfigError(f"tool server {self.url} sent a malformed /tools answer: {type(e).__name__}") from None
            wanted = self.tools if self.tools is not None else list(served)
            missing = [n for n in wanted if n not in served]
            if missing:
                raise ConfigError(f"tool server {self.url} does not serve {missing}; it serves {sorted(served)}")
            self._specs = [served[n] for n in wanted]
        return list(self._specs)

    def _payload(self, name: str, images: Sequence[Image.Image], arguments: Mapping[str, Any],
                 context: ToolContext, refs: bool = True) -> tuple[dict[str, Any], str | None]:
        """The request body, and the digest of the image it carries (to remember once sent)."""
        entries = encode_images_for_call(images, arguments, self.transport, self.shared_dir, self._encoded,
                                         (_Everything() if self.optimistic_refs else self._sent) if refs else None)
        while len(self._encoded) > 64:
            self._encoded.popitem(last=False)
        index = target_index(arguments, len(images))
        digest = image_digest(images[index]) if index is not None else None
        body = {"tool": name, "arguments": dict(arguments) if isinstance(arguments, Mapping) else arguments,
                "images": entries, "context": context.to_dict(), "image_format": self.result_format,
                "derived_ok": self.derived_images}
        return body, digest

    def _remember(self, digests) -> None:
        if len(self._sent) > 4096:
            self._sent.clear()
        self._sent.update(d for d in digests if d)

    @property
    def _headers(self) -> dict[str, str]:
        """Raw result images come back as bytes after the JSON (:data:`~tool_backends.wire.FRAMES`)."""
        accept = f"{FRAMES}, application/json" if self.result_format == "raw" else "application/json"
        return {"content-type": "application/json", "accept": accept}

    def _post(self, path: str, what: str, build) -> Response:
        """POST ``build(refs)``; on 409 (the server lost an image we referenced) rebuild with the
        images themselves and post once more."""
        body, digests = build(True)
        response = self._request("POST", path, what, content=request_json(body), headers=self._headers)
        if response.status_code == 409:
            self._sent.clear()
            body, digests = build(False)
            response = self._request("POST", path, what, content=request_json(body), headers=self._headers)
        if response.status_code == 200:
            self._remember(digests)
        return response

    def call(self, name: str, images: Sequence[Image.Image], arguments: Mapping[str, Any],
             context: ToolContext) -> ToolResult:
        def build(refs):
            body, digest = self._payload(name, images, arguments, context, refs)
            return body, [digest]

        return self._parse(name, self._post("/call", f"Tool {name!r}", build), "result", images)

    def call_many(self, calls: Sequence[tuple[str, Sequence[Image.Image], Mapping[str, Any], ToolContext]]) -> list[ToolResult]:
        """Several calls in one request (``/call_batch``); one result per call, in order."""
        if not calls:
            return []

        def build(refs):
            parts = [self._payload(*c, refs=refs) for c in calls]
            return {"calls": [p[0] for p in parts]}, [p[1] for p in parts]

        response = self._post("/call_batch", f"Batch of {len(calls)} tool calls", build)
        if response.status_code != 200:
            raise ToolBackendError(f"Tool server refused the batch ({response.status_code}): {self._detail(response)}")
        try:
            payload, frames = self._payload_of(response)
            return [result_from_wire(r, self._roots, c[1], frames) for r, c in zip(payload["results"], calls)]
        except (KeyError, TypeError, ValueError, WireError) as e:
            raise ToolBackendError(f"Tool server sent a malformed batch response: {e}") from None

    @property
    def _roots(self) -> tuple[str, ...]:
        return (self.shared_dir,) if self.shared_dir else ()

    def _parse(self, name: str, response: Response, key: str,
               images: Sequence[Image.Image] | None = None) -> ToolResult:
        if response.status_code != 200:
            raise ToolBackendError(f"Tool {name!r} refused the call ({response.status_code}): {self._detail(response)}")
        try:
            payload, frames = self._payload_of(response)
            return result_from_wire(payload[key], self._roots, images, frames)
        except (KeyError, TypeError, ValueError, WireError) as e:
            raise ToolBackendError(f"Tool {name!r} sent a malformed response: {e}") from None

    @staticmethod
    def _payload_of(response: Response) -> tuple[Any, memoryview | None]:
        """A response's JSON, and the raw image bytes after it when the server framed them."""
        if response.headers.get("content-type", "").startswith(FRAMES):
            return unpack_frames(response.content)
        return response.json(), None

    def forward(self, path: str, body: bytes, accept: str | None = None) -> tuple[int, bytes, str]:
        """Router fast path: POST ``body`` unchanged (with the caller's ``accept``); return (status,
        body, media type). Errors -> 502/504."""
        headers = {"content-type": "application/json"}
        if accept:
            headers["accept"] = accept
        try:
            response = self._request("POST", path, f"Upstream {self.url}", content=body, headers=headers)
        except ToolBackendError as e:
            status = 504 if "timed out" in str(e) else 502
            return status, json.dumps({"detail": str(e)}).encode(), "application/json"
        content = response.content
        token = os.environ.get(self.token_env) if self.token_env else None
        if token and response.status_code != 200 and token.encode() in content:  # an upstream echoing our headers
            content = content.replace(token.encode(), b"[token]")
        media_type = response.headers.get("content-type", "application/json").split(";")[0].strip()
        return response.status_code, content, media_type

    def health(self) -> dict[str, Any]:
        response = self._request("GET", "/health", f"Tool server {self.url}")
        try:
            report = response.json()
        except ValueError:
            report = None
        if not isinstance(report, dict):
            raise ToolBackendError(f"Tool server {self.url} sent a malformed /health answer ({response.status_code})")
        return report

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
