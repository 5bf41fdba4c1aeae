"""An optional on-disk layer under :class:`ToolCache`: results survive restarts and are shared
by every process that points at the same directory (the n envs of a GRPO group in n Ray
workers, an evaluation rerun).

Entries are pickled :class:`ToolResult` files named by a hash of the cache key, written
atomically; a corrupt or unreadable entry is a miss. Only open a directory you trust: unpickling
runs code.

>>> import tempfile
>>> from tool_backends.base import ToolResult
>>> d = tempfile.mkdtemp()
>>> DiskToolCache(d).put("k", ToolResult("hello"))
>>> DiskToolCache(d).get("k").text
'hello'
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path

from tool_backends.base import ToolResult
from tool_backends.toolbox import ToolCache


class DiskToolCache(ToolCache):
    """In-memory LRU in front of a directory of pickled results."""

    def __init__(self, directory: str | os.PathLike, max_entries: int = 2048,
                 max_bytes: int = 128 * 1024 * 1024) -> None:
        super().__init__(max_entries, max_bytes)  # bounds the memory layer; the directory is unbounded
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.disk_hits = 0

    def _path(self, key: str) -> Path:
        return self.directory / (hashlib.sha256(key.encode()).hexdigest() + ".pkl")

    def get(self, key: str) -> ToolResult | None:
        result = super().get(key)
        if result is not None:
            return result
        try:
            with open(self._path(key), "rb") as f:
                stored_key, result = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError):
            return None
        if stored_key != key or not isinstance(result, ToolResult):
            return None
        with self._lock:
            self.misses -= 1
            self.hits += 1
            self.disk_hits += 1
        super().put(key, result)
        return result

    def put(self, key: str, result: ToolResult) -> None:
        super().put(key, result)
        path = self._path(key)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                pickle.dump((key, result), f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except OSError:
            pass  # a full disk loses the cache entry, never the result

    def __getstate__(self):
        return {"max_entries": self.max_entries, "max_bytes": self.max_bytes, "directory": str(self.directory)}

    def __setstate__(self, state):
        self.__init__(state["directory"], state["max_entries"], state["max_bytes"])
