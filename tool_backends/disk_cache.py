"""An optional on-disk layer under :class:`ToolCache`: results survive restarts and are shared
by every process that points at the same directory (the n envs of a GRPO group in n Ray
workers, an evaluation rerun).

Entries hold data, never code: one ``.npz`` file per result (``numpy.savez``, read back with
``allow_pickle=False``) holding the result's JSON (key, text, data, error, image modes) and its
images as arrays, named by a hash of the cache key and written atomically. A corrupt, foreign or
unreadable entry -- a pickle planted under an entry's name included -- is a miss, and nothing in it
runs. A result whose ``data`` is not plain JSON stays in the memory layer only.

>>> import tempfile
>>> from tool_backends.base import ToolResult
>>> d = tempfile.mkdtemp()
>>> DiskToolCache(d).put("k", ToolResult("hello"))
>>> DiskToolCache(d).get("k").text
'hello'
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from tool_backends.base import ToolResult
from tool_backends.toolbox import ToolCache

ARRAY_MODES = ("1", "L", "RGB", "RGBA", "I", "I;16", "F")
"""Image modes stored as they are; others (palettes, CMYK, ...) are stored as RGB."""


def result_to_npz(key: str, result: ToolResult) -> bytes | None:
    """``result`` as ``.npz`` bytes (``None`` when its ``data`` is not plain JSON)."""
    images = [im if im.mode in ARRAY_MODES else im.convert("RGB") for im in result.images]
    try:
        meta = json.dumps({"key": key, "text": result.text, "data": result.data, "error": result.error,
                           "modes": [im.mode for im in images]}, allow_nan=False)
    except (TypeError, ValueError):
        return None
    arrays = {"meta": np.frombuffer(meta.encode(), np.uint8)}
    arrays.update({f"image{i}": np.asarray(im) for i, im in enumerate(images)})
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def result_from_npz(f) -> tuple[str, ToolResult]:
    """``(key, result)`` from an ``.npz`` file object; ``ValueError`` for anything else (a
    pickle, an object array, a malformed entry) -- nothing in the file is executed."""
    with np.load(f, allow_pickle=False) as npz:
        meta = json.loads(npz["meta"].tobytes().decode())
        if not isinstance(meta, dict) or not isinstance(meta.get("text"), str) or not isinstance(meta.get("data"), dict):
            raise ValueError("not a cache entry")
        images = []
        for i, mode in enumerate(meta.get("modes") or []):
            array = npz[f"image{i}"]
            image = Image.fromarray(array)
            images.append(image if image.mode == mode else image.convert(mode))
    error = meta.get("error")
    return str(meta.get("key")), ToolResult(meta["text"], images, meta["data"], error if isinstance(error, str) else None)


class DiskToolCache(ToolCache):
    """In-memory LRU in front of a directory of ``.npz`` results (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, max_entries: int = 2048,
                 max_bytes: int = 128 * 1024 * 1024) -> None:
        super().__init__(max_entries, max_bytes)  # bounds the memory layer; the directory is unbounded
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.disk_hits = 0

    def _path(self, key: str) -> Path:
        return self.directory / (hashlib.sha256(key.encode()).hexdigest() + ".npz")

    def get(self, key: str) -> ToolResult | None:
        result = super().get(key)
        if result is not None:
            return result
        try:
            with open(self._path(key), "rb") as f:
                stored_key, result = result_from_npz(f)
        except (OSError, EOFError, ValueError, TypeError, KeyError, zipfile.BadZipFile):
            return None
        if stored_key != key:
            return None
        with self._lock:
            self.misses -= 1
            self.hits += 1
            self.disk_hits += 1
        super().put(key, result)
        return result

    def put(self, key: str, result: ToolResult) -> None:
        super().put(key, result)
        blob = result_to_npz(key, result)
        if blob is None:
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, self._path(key))
        except OSError:
            pass  # a full disk loses the cache entry, never the result

    def __getstate__(self):
        return {"max_entries": self.max_entries, "max_bytes": self.max_bytes, "directory": str(self.directory)}

    def __setstate__(self, state):
        self.__init__(state["directory"], state["max_entries"], state["max_bytes"])
