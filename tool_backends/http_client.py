"""``HTTPToolBackend``: the client side of :mod:`tool_backends.server` (and of the router).

One pool of keep-alive connections per backend; each call has a deadline of ``timeout_s`` in total,
and retries with exponential backoff only what is safe and quick to retry (connection refused or
reset, 502/503/504) within that deadline. The connections are a minimal HTTP/1.1 client on the
standard library's sockets (:class:`Connection`, with ``TCP_NODELAY``), not ``httpx`` as elsewhere in
the project nor ``http.client``: a tool call is on the rollout's critical path, and a request costs
about a third of ``http.client``'s client CPU (``benchmarks/bench_group.py``, its per-request floor
table; ``benchmarks/bench_tools.py`` measures the remote overhead per tool). A timeout, a dead server or a refusal becomes a
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


MAX_HEADER_LINE = 65536
MAX_HEADERS = 100


class Connection:
    """One keep-alive HTTP/1.1 connection: a request goes out in one ``sendall``, and the answer is
    read with a few ``readline`` calls. The standard library's ``http.client`` spends most of its
    client CPU parsing headers through ``email``; this takes about a third of it
    (``benchmarks/bench_group.py``, the per-request floor table). It speaks what a tool server, the router
    or a proxy in front of them answers: ``content-length`` or ``chunked`` bodies, or a body up to
    the connection's close. Transport failures raise ``OSError`` or ``http.client.HTTPException``
    (``RemoteDisconnected`` when a kept connection was closed by the server before answering)."""

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None) -> None:
        self.host, self.port = host, port
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._file = sock.makefile("rb")
        self.will_close = False

    def request(self, method: str, path: str, body: bytes | None, headers: Mapping[str, str],
                timeout: float) -> Response:
        self.sock.settimeout(timeout)
        lines = [f"{method} {path} HTTP/1.1", f"host: {self.host}:{self.port}"]
        for k, v in headers.items():
            if any(c in str(k) + str(v) for c in "\r\n\0"):  # as http.client: no header splitting
                raise ValueError(f"invalid header {k!r}")
            lines.append(f"{k}: {v}")
        if body is not None or method in ("POST", "PUT"):
            lines.append(f"content-length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.sock.sendall(head + body if body else head)
        while True:
            status, reason, fields, version = self._read_head()
            if not 100 <= status < 200:  # skip interim answers (100 Continue)
                break
        no_body = method == "HEAD" or status in (204, 304)  # never a body, whatever the headers say
        content = b"" if no_body else self._read_body(fields)
        connection = fields.get("connection", "").lower()
        self.will_close = (self.will_close or "close" in connection
                           or (version == "HTTP/1.0" and "keep-alive" not in connection))
        return Response(status, fields, content)

    def _readline(self) -> bytes:
        line = self._file.readline(MAX_HEADER_LINE + 1)
        if len(line) > MAX_HEADER_LINE:
            raise http.client.LineTooLong("header line")
        return line

    def _read_head(self) -> tuple[int, str, dict[str, str], str]:
        line = self._readline()
        if not line:
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/") or len(code) != 3 or not code.isdigit():
            raise http.client.BadStatusLine(line.decode("latin-1", "replace")[:100])
        fields: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = self._readline()
            if line in (b"\r\n", b"\n"):
                return int(code), reason, fields, version
            if not line:
                raise http.client.IncompleteRead(b"", None)
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise http.client.HTTPException(f"malformed header line {line[:100]!r}")
            name = name.strip().lower()
            fields[name] = f"{fields[name]}, {value.strip()}" if name in fields else value.strip()
        raise http.client.HTTPException(f"more than {MAX_HEADERS} headers")

    def _read_exactly(self, n: int) -> bytes:
        data = self._file.read(n)
        if len(data) < n:
            raise http.client.IncompleteRead(data, n - len(data))
        return data

    def _read_body(self, fields: Mapping[str, str]) -> bytes:
        if "chunked" in fields.get("transfer-encoding", "").lower():
            parts = []
            while True:
                size_line = self._readline().split(b";", 1)[0].strip()
                try:
                    size = int(size_line, 16)
                except ValueError:
                    raise http.client.HTTPException(f"malformed chunk size {size_line[:20]!r}") from None
                if size == 0:
                    while self._readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(parts)
                parts.append(self._read_exactly(size))
                self._read_exactly(2)  # the chunk's CRLF
        length = fields.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise http.client.HTTPException(f"malformed content-length {length[:20]!r}")
            return self._read_exactly(int(length))
        self.will_close = True  # the body runs to the connection's end
        return self._file.read()

    def close(self) -> None:
        self._file.close()
        self.sock.close()


class ConnectionPool:
    """Keep-alive :class:`Connection` s to one server, shared by threads (at most ``size`` kept
    idle). A kept connection the server has closed in the meantime is replaced once, silently, as
    a fresh one would have been used."""

    def __init__(self, url: str, size: int, connect_timeout_s: float) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or (443 if self.https else 80)
        self.size, self.connect_timeout_s = int(size), float(connect_timeout_s)
        self._tls = ssl.create_default_context() if self.https else None
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def _new(self, timeout: float) -> Connection:
        return Connection(self.host, self.port, min(self.connect_timeout_s, timeout), self._tls)

    def request(self, method: str, path: str, body: bytes | None, headers: Mapping[str, str],
                timeout: float) -> Response:
        """One request on a kept connection (or a new one); raises ``OSError`` /
        ``http.client.HTTPException`` for transport failures, ``TimeoutError`` on timeouts."""
        with self._lock:
            kept = self._idle.pop() if self._idle else None
        if kept is None:
            return self._send(self._new(timeout), method, path, body, headers, timeout)
        try:
            return self._send(kept, method, path, body, headers, timeout)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            # the server closed the kept connection while it was idle: a fresh one gets the request
            return self._send(self._new(timeout), method, path, body, headers, timeout)

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
                 connect_timeout_s: float = 2.0, derived_images: bool = True, optimistic_refs: bool = True) -> None:
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
            self._pool = ConnectionPool(self.url, self.pool_size, self.connect_timeout_s)
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
        for attempt in range(self.retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                response = pool.request(method, path, content, headers, remaining)
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
            if attempt < self.retries and time.monotonic() + delay < deadline:
                time.sleep(delay)
                delay *= 2
            else:
                break
        raise ServerUnavailable(f"{what} is unavailable: {problem}. Try another tool or answer without it.",
                                problem=f"{seen}, {attempt + 1} attempt{'s' if attempt else ''}")

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
            for entry in response.json().get("tools", []):
                fn = entry["function"]
                served[fn["name"]] = ToolSpec(fn["name"], fn.get("description", ""), fn.get("parameters", {}))
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
        return response.json()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
