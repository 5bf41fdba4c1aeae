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
    write the oldest files (by write time, including those found at start) are deleted."""

    def __init__(self, path: str | os.PathLike, max_bytes: int) -> None:
        self.path, self.max_bytes = Path(path), int(max_bytes)
        self._files: OrderedDict[str, int] = OrderedDict()
        self.nbytes = 0
        self._lock = threading.Lock()
        if self.path.is_dir():
            found = sorted((e.stat().st_mtime_ns, e.path, e.stat().st_size) for e in os.scandir(self.path)
                           if e.is_file(follow_symlinks=False) and e.name.endswith(".bmp"))
            for _, p, size in found:
                self._files[p] = size
                self.nbytes += size
            self._trim()

    def wrote(self, path: str) -> None:
        """Record a file the server wrote (or reused) under the directory, then trim."""
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

    def _trim(self) -> None:
        while self.nbytes > self.max_bytes and len(self._files) > 1:
            old, size = self._files.popitem(last=False)
            self.nbytes -= size
            try:
                os.unlink(old)
            except OSError:
                pass


def is_regular_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` (symlinks followed) is a regular file; never opens it.

    >>> is_regular_file(__file__), is_regular_file(os.path.dirname(__file__)), is_regular_file("/dev/null")
    (True, False, False)
    """
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_timeout_protocol(read_timeout_s: float) -> type:
    """uvicorn's HTTP protocol class, closing a connection that has not sent a whole request's
    headers ``read_timeout_s`` after it opened or after its last response (uvicorn itself has no
    such deadline: a client may hold a connection open forever by sending nothing, or one byte now
    and then). Stalled bodies are cut off by :class:`tool_backends.server.BodyLimit`."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class ReadTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._read_timer = None
            self._arm()

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


__all__ = ["RequestBudget", "ResultDir", "is_regular_file", "read_timeout_protocol"]
