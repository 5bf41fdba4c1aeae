"""Decoders that can abort the process run in a child process, where an abort costs one file.

GDCM throws an uncaught C++ exception on some corrupt codestreams (a header-corrupted JPEG
Baseline, a JPEG 2000 header): ``terminate called after throwing an instance of ...``, SIGABRT,
exit 134 -- no Python ``except`` can catch it, and an env or evaluation decoding in-process dies
without a word. :mod:`medvqa_env.medical_images` therefore never calls an aborting plugin
(:data:`ABORTING_PLUGINS`) in this process: it tries the in-process decoders first (Pillow for
JPEG, pylibjpeg-openjpeg for JPEG 2000), and hands what only GDCM reads (JPEG Lossless, JPEG-LS,
a file the others refused) to :class:`ContainedDecoder`.

One child per process, started on first use (Python, pydicom, GDCM) and kept: a request is the
file's bytes over a pipe and the decoded array back. The child's stderr goes to a
file of its own, so what GDCM prints (libjpeg's "Corrupt JPEG data", GDCM's ``what()``) never
reaches this process's stderr and no other thread's output is redirected; it is read back for the
request that caused it, into the failure's reason. A child that dies (SIGABRT) or hangs (past
``timeout``) fails that request with :class:`DecodeFailed` and is started afresh for the next one.

>>> ContainedDecoder.describe_exit(-6)
'aborted (SIGABRT)'
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from typing import Any

ABORTING_PLUGINS = ("gdcm",)
"""pydicom decoder plugins that can take the process down on corrupt data: run only in the child."""
TIMEOUT_S = 120.0
"""The longest one contained decode may take before its child is killed (a hung decoder)."""
_HEADER = struct.Struct(">Q")


class DecodeFailed(Exception):
    """A contained decode failed: the decoder raised (``raised``: its ``Type: message``), or the
    child aborted, died or timed out (the message says how); ``said``: what the decoder printed."""

    def __init__(self, message: str, said: str = "", error: Exception | None = None) -> None:
        super().__init__(message)
        self.said, self.error = said, error

    @property
    def raised(self) -> bool:
        """Whether the decoder raised (``error``: the child's exception, rebuilt) rather than died."""
        return self.error is not None


def _write(stream, payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    import time

    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_message(fd: int, deadline: float | None) -> bytes:
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return _read_exact(fd, n, deadline)


class _RaisedInChild(Exception):
    """The exception a decoder raised in the child: its message, and its type's name as ``kind``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class ContainedDecoder:
    """A child process that decodes DICOM pixel data with one pydicom plugin (module docstring).

    Thread-safe: requests are serialised (one child). Picklable copies start their own child.
    """

    def __init__(self, timeout: float = TIMEOUT_S) -> None:
        self.timeout = float(timeout)
        self._child: subprocess.Popen | None = None
        self._stderr = None
        self._lock = threading.Lock()
        self.started = 0  # children started (one, unless some died)

    def __getstate__(self) -> dict[str, Any]:
        return {"timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["timeout"])

    @staticmethod
    def describe_exit(code: int | None) -> str:
        """How a child ended, in words (``-6`` -> ``'aborted (SIGABRT)'``)."""
        if code is None:
            return "did not answer"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"{'aborted' if -code == signal.SIGABRT else 'was killed'} ({name})"
        return f"exited with status {code}"

    def _start(self) -> subprocess.Popen:
        if self._child is not None and self._child.poll() is None:
            return self._child
        self.close()
        self._stderr = tempfile.TemporaryFile()
        # run this file by path with the -c entry's '' taken off sys.path: the child imports pydicom,
        # numpy and GDCM, not the package (nor a module of the caller's working directory)
        bootstrap = ("import runpy, sys; sys.path.pop(0); "
                     f"runpy.run_path({os.path.abspath(__file__)!r}, run_name='__contained_decode__')")
        self._child = subprocess.Popen([sys.executable, "-c", bootstrap], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=self._stderr, close_fds=True)
        self.started += 1
        self._owner = os.getpid()  # a forked copy of this object must not stop its parent's child
        _CHILDREN.add(self)
        return self._child

    def _said(self, start: int) -> str:
        """What the child wrote to its stderr since offset ``start``."""
        if self._stderr is None:
            return ""
        self._stderr.seek(start)
        return self._stderr.read(8192).decode("utf-8", "replace")

    def decode(self, data: bytes, plugin: str):
        """The pixel array pydicom's ``plugin`` decodes from the DICOM ``data`` (its
        ``pixel_array``), or :class:`DecodeFailed` with the reason (the decoder's error and what
        it printed, or how the child died)."""
        import time

        import numpy as np

        with self._lock:
            child = self._start()
            start = self._stderr.seek(0, os.SEEK_END)
            try:
                _write(child.stdin, json.dumps({"plugin": plugin}).encode())
                _write(child.stdin, data)
                child.stdin.flush()
                deadline = time.monotonic() + self.timeout
                head = json.loads(_read_message(child.stdout.fileno(), deadline))
                body = _read_message(child.stdout.fileno(), deadline) if head.get("ok") else b""
            except TimeoutError:
                child.kill()
                child.wait()
                raise DecodeFailed(f"{plugin}: gave no answer in {self.timeout:g} s (the decoding process was "
                                   "killed)", self._said(start)) from None
            except (EOFError, BrokenPipeError, OSError, ValueError):
                code = child.wait()
                raise DecodeFailed(f"{plugin}: {self.describe_exit(code)} on this file (in a decoding process of its "
                                   "own; this one carries on)", self._said(start)) from None
            if not head.get("ok"):
                error = _RaisedInChild(head.get("error", ""), head.get("type", "Error"))
                raise DecodeFailed(f"{error.kind}: {error}", self._said(start), error)
            array = np.frombuffer(body, dtype=np.dtype(head["dtype"])).reshape(head["shape"])
            return array.copy()  # writable, as pydicom's own arrays are

    def close(self) -> None:
        """Stop the child (it also ends by itself when this process's end of the pipe closes)."""
        child, self._child = self._child, None
        if child is not None:
            try:
                child.stdin.close()
                child.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                child.kill()
                child.wait()
            child.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


_CHILDREN: "set[ContainedDecoder]" = set()
_SHARED: dict[str, ContainedDecoder] = {}
_SHARED_LOCK = threading.Lock()


def shared_decoder() -> ContainedDecoder:
    """This process's contained decoder (one per process; a forked or spawned worker gets its own)."""
    key = str(os.getpid())
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED.clear()  # a decoder inherited over fork belongs to the parent
            _SHARED[key] = ContainedDecoder()
        return _SHARED[key]


@atexit.register
def _close_children() -> None:
    for decoder in list(_CHILDREN):
        if getattr(decoder, "_owner", None) != os.getpid():
            continue
        try:
            decoder.close()
        except Exception:  # noqa: BLE001 -- the interpreter is going down
            pass


# ----------------------------------------------------------------------------------------------
# The child: read (plugin, bytes), answer (header, array bytes), until stdin closes.
# ----------------------------------------------------------------------------------------------
def _serve() -> None:  # pragma: no cover -- runs in the child
    import io
    import logging
    import warnings

    import numpy as np
    import pydicom

    logging.getLogger("pydicom").setLevel(logging.CRITICAL + 1)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            request = json.loads(_read_message(stdin.fileno(), None))
            data = _read_message(stdin.fileno(), None)
        except EOFError:
            return
        plugin = str(request.get("plugin", ""))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = pydicom.dcmread(io.BytesIO(data), force=True)
                if plugin:
                    ds.pixel_array_options(decoding_plugin=plugin)
                array = np.ascontiguousarray(ds.pixel_array)
            head = {"ok": True, "dtype": array.dtype.str, "shape": list(array.shape)}
            body = array.tobytes()
        except Exception as e:  # noqa: BLE001 -- the reason goes back to the parent
            head, body = {"ok": False, "error": str(e), "type": type(e).__name__}, b""
        _write(stdout, json.dumps(head).encode())
        if head["ok"]:
            _write(stdout, body)
        stdout.flush()


if __name__ == "__contained_decode__":  # pragma: no cover
    _serve()
