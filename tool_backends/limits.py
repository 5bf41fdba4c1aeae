"""Per-request and per-connection limits of a tool server (see ``docs/security.md``).

* :class:`RequestBudget` -- what one HTTP request may make the server do: tool calls, decoded
  input pixels, result-image pixels. Over the input budget a request gets 400; a call over the
  call or result budget gets an error result the model can read (the calls before it keep theirs).
* :class:`ResultDir` -- ``--result-dir`` as a bounded store: the oldest result files go first.
* :func:`read_timeout_protocol` -- uvicorn's HTTP protocol with a deadline for a request's
  headers, so a client that connects and stalls is disconnected.
* :func:`is_regular_file` -- the server opens client-named files only when they are regular files
  (a FIFO would block a worker thread forever, a device could be read without end).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from PIL import Image

from tool_backends.base import ToolResult


class RequestBudget:
    """What one request may still spend. Not shared between requests; one thread uses it.

    >>> b = RequestBudget(calls=1, input_pixels=100, result_pixels=10)
    >>> b.take_call() is None, b.take_call()
    (True, "This request's limit of 1 tool calls is spent: send the rest in another request.")
    """

    def __init__(self, calls: int, input_pixels: int, result_pixels: int) -> None:
        self.max_calls, self.max_input_pixels, self.max_result_pixels = int(calls), int(input_pixels), int(result_pixels)
        self.calls = self.input_pixels = self.result_pixels = 0

    def take_call(self) -> str | None:
        """Count one tool call; the error text once the request has made its allowed calls."""
        self.calls += 1
        if self.calls > self.max_calls:
            return f"This request's limit of {self.max_calls} tool calls is spent: send the rest in another request."
        return None

    def take_input(self, image: Image.Image) -> None:
        """Count a decoded request image; ``ValueError`` (a 400) once the request is over its pixels."""
        from tool_backends.wire import WireError

        self.input_pixels += image.size[0] * image.size[1]
        if self.input_pixels > self.max_input_pixels:
            raise WireError(f"the request's images decode to over {self.max_input_pixels} pixels in all: "
                            "send fewer or smaller images per request")

    def take_result(self, result: ToolResult) -> ToolResult:
        """``result``, or an error result if its images would take the response over its pixels
        (a response's first images always fit: each is within the pixel limit already)."""
        pixels = sum(im.size[0] * im.size[1] for im in result.images)
        if self.result_pixels and self.result_pixels + pixels > self.max_result_pixels:
            return ToolResult.failure(f"The result images of this request are over its limit of "
                                      f"{self.max_result_pixels} pixels: make this call in another request.")
        self.result_pixels += pixels
        return result


class ResultDir:
    """The files a server writes under ``--result-dir``, bounded by ``max_bytes``: after each
    write the oldest files *it wrote* are deleted. Files it did not write (there before it started,
    or put there by anyone else) are never deleted, nor counted."""

    def __init__(self, path: str | os.PathLike, max_bytes: int) -> None:
        self.path, self.max_bytes = Path(path), int(max_bytes)
        self._files: OrderedDict[str, int] = OrderedDict()
        self.nbytes = 0
        self._lock = threading.Lock()

    def wrote(self, path: str) -> None:
        """Record a file the server has just created under the directory, then trim."""
        try:
            size = os.stat(path).st_size
        except OSError:
            return
        with self._lock:
            if path in self._files:
                self._files.move_to_end(path)
                return
            self._files[path] = size
            self.nbytes += size
            self._trim()

    def used(self, path: str) -> None:
        """A file it wrote was named in a response again: the newest to keep."""
        with self._lock:
            if path in self._files:
                self._files.move_to_end(path)

    def _trim(self) -> None:
        while self.nbytes > self.max_bytes and len(self._files) > 1:
            old, size = self._files.popitem(last=False)
            self.nbytes -= size
            try:
                os.unlink(old)
            except OSError:
                pass


def read_under_roots(path: Any, roots, max_bytes: int) -> bytes:
    """The bytes of a client-named file, read only when it lies under one of ``roots`` and is a
    regular file of at most ``max_bytes``; ``PermissionError`` (403) or
    :class:`~tool_backends.wire.WireError` (400) otherwise. Checked on the open descriptor, not the
    name: the path is resolved and checked, opened without following a symlink (``O_NOFOLLOW``,
    ``O_NONBLOCK``: a FIFO does not block the open), then the descriptor is checked (``fstat``:
    a regular file, within the size; its own path, read back from the kernel, still under a root),
    so a file swapped for a symlink, or a folder for a link out, between check and open is
    refused, and a FIFO or device is never read."""
    from tool_backends.wire import WireError, is_under

    if not isinstance(path, str) or not roots or "\0" in path:
        raise PermissionError(f"image path {str(path)[:200]!r} is not under this server's image roots")
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):  # changed while it was being resolved
        raise WireError(f"cannot resolve image path {path!r}") from None
    if not is_under(real, roots):
        raise PermissionError(f"image path {path!r} is not under this server's image roots")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PermissionError(f"image path {path!r} changed into a symlink while it was opened") from None
        raise WireError(f"cannot read image path {path!r}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a folder, FIFO or device under a root: never read it
            raise WireError(f"image path {path!r} is not a regular file")
        if st.st_size > max_bytes:
            raise WireError(f"image file {path!r} of {st.st_size} bytes is over the limit of {max_bytes}")
        opened = _descriptor_path(fd)
        if opened is not None and not is_under(opened, roots):
            raise PermissionError(f"image path {path!r} is not under this server's image roots")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:  # it grew while being read
                raise WireError(f"image file {path!r} is over the limit of {max_bytes} bytes")
    except OSError as e:
        raise WireError(f"cannot read image path {path!r}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _descriptor_path(fd: int) -> str | None:
    """The path the kernel names for an open descriptor (Linux), or ``None`` where it cannot say."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def is_regular_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` (symlinks followed) is a regular file; never opens it.

    >>> is_regular_file(__file__), is_regular_file(os.path.dirname(__file__)), is_regular_file("/dev/null")
    (True, False, False)
    """
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


LINGER_S = 2.0
LINGER_BYTES = 4 << 20
"""A connection closed with bytes still coming (a body refused before it was read) first sends
its answer and a FIN, then drains what arrives for up to ``LINGER_S`` seconds and
``LINGER_BYTES`` bytes before it closes: closing at once would reset it, and the client would lose
the answer (a 401, 413) it has not read yet."""


class _LingeringTransport:
    """uvicorn's transport, whose ``close`` is a lingering close (see :data:`LINGER_S`)."""

    def __init__(self, transport: Any, protocol: Any) -> None:
        self._transport, self._protocol = transport, protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._protocol._lingering or self._transport.is_closing()

    def close(self) -> None:
        t = self._transport
        cycle = getattr(self._protocol, "cycle", None)
        unread = cycle is not None and getattr(cycle, "more_body", False)  # the request's body is still coming
        if not unread or self._protocol._lingering or t.is_closing() or not t.can_write_eof():
            return t.close()
        self._protocol._lingering = True
        try:
            t.write_eof()  # after the answer is flushed
            t.resume_reading()
        except (OSError, RuntimeError):
            return t.close()
        self._protocol.loop.call_later(LINGER_S, t.close)


MAX_CONTAINERS = 100_000
"""JSON objects and arrays one request body may hold (counted from its ``{`` and ``[`` bytes before parsing)."""
MAX_DEPTH = 64
"""How deeply one request body's JSON may nest."""
MAX_HEADER_BYTES = 64 * 1024
"""Bytes a request's head (request line and headers) may take (else 431 and the connection closes)."""


def _no_constant(name: str):
    from tool_backends.wire import WireError

    raise WireError(f"a request may not hold {name}: numbers must be finite")


def _finite_float(text: str) -> float:
    import math

    from tool_backends.wire import WireError

    value = float(text)
    if not math.isfinite(value):
        raise WireError(f"the number {text[:40]} is out of range: numbers must be finite")
    return value


def parse_request_json(raw: bytes, max_containers: int | None = MAX_CONTAINERS) -> Any:
    """A request body's JSON, or a :class:`~tool_backends.wire.WireError` (a 400 with its sentence)
    for anything the server would choke on later: not JSON, over :data:`MAX_CONTAINERS` objects
    and arrays (counted before parsing, so a body of a million tiny objects costs a byte scan),
    nested over :data:`MAX_DEPTH`, ``NaN``/``Infinity`` or a float out of range. ``max_containers=None``
    skips the count (a body of model text, whose braces are mostly inside strings). (Huge integers
    parse: a tool argument's is the model's error result, an annotation's a 400 from the server.)

    >>> parse_request_json(b'{"a": [1, 2.5, null]}')
    {'a': [1, 2.5, None]}
    >>> parse_request_json(b'[' * 70 + b']' * 70)
    Traceback (most recent call last):
    ...
    tool_backends.wire.WireError: the request's JSON nests over 64 levels deep
    >>> parse_request_json(b'{"x": Infinity}')
    Traceback (most recent call last):
    ...
    tool_backends.wire.WireError: a request may not hold Infinity: numbers must be finite
    """
    import json

    from tool_backends.wire import WireError

    if max_containers is not None:
        containers = raw.count(b"{") + raw.count(b"[")
        if containers > max_containers:
            raise WireError(f"the request holds {containers} JSON objects and arrays; the limit is {max_containers}")
    try:
        value = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except WireError:
        raise
    except RecursionError:
        raise WireError(f"the request's JSON nests over {MAX_DEPTH} levels deep") from None
    except (ValueError, TypeError):  # UnicodeDecodeError is a ValueError
        raise WireError("expected a JSON body") from None
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise WireError(f"the request's JSON nests over {MAX_DEPTH} levels deep")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return value


def read_timeout_protocol(read_timeout_s: float, limit_concurrency: int | None = None) -> type:
    """uvicorn's HTTP protocol class, closing a connection that has not sent a whole request's
    headers ``read_timeout_s`` after it opened or after its last response (uvicorn itself has no
    such deadline: a client may hold a connection open forever by sending nothing, or one byte now
    and then), answering 431 to a request head over :data:`MAX_HEADER_BYTES`, and applying
    uvicorn's ``limit_concurrency`` (503 past it) to every request but ``GET /health``, so a
    server full of stalled or waiting requests still says how it is. Stalled and slow bodies are
    cut off by :class:`tool_backends.server.RequestGate`."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class ReadTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        @property
        def limit_concurrency(self):  # read by uvicorn once a request's path is known
            scope = getattr(self, "scope", None) or {}
            if scope.get("path") == "/health" and scope.get("method") == "GET":
                return None
            return limit_concurrency if limit_concurrency is not None else getattr(self, "_config_limit", None)

        @limit_concurrency.setter
        def limit_concurrency(self, value) -> None:  # uvicorn's __init__ sets it from its config
            self._config_limit = value

        def connection_made(self, transport: Any) -> None:
            self._lingering, self._drained = False, 0
            super().connection_made(_LingeringTransport(transport, self))
            self._read_timer = None
            self._head_bytes = 0
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._lingering:  # the rest of a refused body: drained, never parsed
                self._drained += len(data)
                if self._drained > LINGER_BYTES:
                    self.transport.abort()
                return
            cycle = self.cycle
            waiting = cycle is None or cycle.response_complete  # on a request's head
            super().data_received(data)
            if not waiting or self.cycle is not cycle:  # a head was complete: its request has a cycle
                self._head_bytes = 0
                return
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
                msg = f"request head over {MAX_HEADER_BYTES} bytes".encode()
                self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
                                     b"content-length: " + str(len(msg)).encode() + b"\r\nconnection: close\r\n\r\n"
                                     + msg)
                self.transport.close()

        def _arm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
            self._read_timer = self.loop.call_later(read_timeout_s, self._expire)

        def _expire(self) -> None:
            self._read_timer = None
            if self.cycle is None or self.cycle.response_complete:  # waiting on a request's headers
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if getattr(self, "_read_timer", None) is not None:
                self._read_timer.cancel()
                self._read_timer = None
            super().connection_lost(exc)

    return ReadTimeoutProtocol


__all__ = ["RequestBudget", "ResultDir", "is_regular_file", "read_under_roots", "read_timeout_protocol", "parse_request_json",
           "MAX_HEADER_BYTES", "MAX_CONTAINERS", "MAX_DEPTH"]
