"""The toolbox: the env's one entry point to tools, whichever backend runs each of them.

A :class:`Toolbox` maps tool names to backends (in-process or remote), validates nothing itself
(tools do), turns every failure into a :class:`ToolResult` the model can read, times each call,
and caches deterministic results so the n copies of a GRPO group that make the same call pay once.

>>> box = Toolbox.from_config({"image_zoom_in": "local"})
>>> box.names
['image_zoom_in']
>>> from medvqa_env.parser import ToolCall
>>> box.call(ToolCall("zoom", {}), images=[]).result.text
"Error: Unknown tool 'zoom'. Available: ['image_zoom_in']. Did you mean 'image_zoom_in'?"
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from PIL import Image

from medvqa_env.errors import ConfigError, ToolBackendError, ToolError, unknown_name_message
from medvqa_env.parser import ToolCall
from tool_backends.base import Tool, ToolContext, ToolResult, ToolSpec, canonical_arguments, image_digest
from tool_backends.registry import build_tool

log = logging.getLogger(__name__)


class ToolBackend(Protocol):
    """Anything that can list tool specs and run a named tool (in-process or over HTTP)."""

    def specs(self) -> list[ToolSpec]: ...

    def call(self, name: str, images: Sequence[Image.Image], arguments: Mapping[str, Any],
             context: ToolContext) -> ToolResult: ...

    def close(self) -> None: ...


class LocalBackend:
    """Runs :class:`Tool` objects in this process."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools = {t.name: t for t in tools}

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self.tools.values()]

    def call(self, name: str, images: Sequence[Image.Image], arguments: Mapping[str, Any],
             context: ToolContext) -> ToolResult:
        return self.tools[name](images, arguments, context)

    def close(self) -> None:
        for t in self.tools.values():
            close = getattr(t, "close", None)
            if close:
                close()


@dataclass
class ToolCallRecord:
    """One dispatched call: what was asked, what came back, how long it took, whether cached."""

    name: str
    arguments: dict[str, Any]
    result: ToolResult
    latency_s: float
    cached: bool = False

    @property
    def error(self) -> str | None:
        return self.result.error

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "text": self.result.text,
                "error": self.result.error, "data": self.result.data, "latency_s": self.latency_s,
                "cached": self.cached, "n_images": len(self.result.images)}


class ToolCache:
    """A thread-safe in-memory LRU of tool results keyed by (tool, arguments, image, record).

    Bounded twice: by ``max_entries`` and by ``max_bytes`` (the results' images and text, see
    :func:`result_nbytes`, and what they keep alive: a result image not drawn yet holds its source
    image, :func:`retained_by`, counted once however many entries share it), so a long run with
    large images cannot grow it to gigabytes. A result larger than ``max_bytes`` on its own is not
    cached.
    """

    def __init__(self, max_entries: int = 2048, max_bytes: int = 128 * 1024 * 1024) -> None:
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self._data: OrderedDict[str, ToolResult] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._holds: dict[str, tuple[int, ...]] = {}  # key -> ids of the objects its result keeps alive
        self._held: dict[int, list] = {}  # id -> [object, bytes, entries holding it]
        self.nbytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: str, count: bool = True) -> ToolResult | None:
        """The cached result (a hit), or ``None`` (a miss); ``count=False`` counts neither: a caller
        that only looks first (its counted call comes after, or it counts the hit it used)."""
        with self._lock:
            result = self._data.get(key)
            if result is None:
                self.misses += count
                return None
            self._data.move_to_end(key)
            self.hits += count
            return result

    def count_hit(self) -> None:
        """Count a hit a caller looked up with ``get(count=False)`` and then used."""
        with self._lock:
            self.hits += 1

    def put(self, key: str, result: ToolResult) -> None:
        size = result_nbytes(result)
        held = retained_by(result)
        if size + sum(n for _, n in held.values()) > self.max_bytes:
            return
        with self._lock:
            if key in self._data:
                self._drop(key)
            self._data[key] = result
            self._sizes[key] = size
            self.nbytes += size
            self._holds[key] = tuple(held)
            for ident, (obj, n) in held.items():
                entry = self._held.get(ident)
                if entry is None:
                    self._held[ident] = [obj, n, 1]
                    self.nbytes += n
                else:
                    entry[2] += 1
            while len(self._data) > self.max_entries or self.nbytes > self.max_bytes:
                self._drop(next(iter(self._data)))

    def _drop(self, key: str) -> None:
        del self._data[key]
        self.nbytes -= self._sizes.pop(key)
        for ident in self._holds.pop(key, ()):
            entry = self._held[ident]
            entry[2] -= 1
            if entry[2] == 0:
                del self._held[ident]
                self.nbytes -= entry[1]

    def __len__(self) -> int:
        return len(self._data)

    def __getstate__(self):  # locks do not pickle; a copied env starts with an empty cache
        return {"max_entries": self.max_entries, "max_bytes": self.max_bytes}

    def __setstate__(self, state):
        ToolCache.__init__(self, state["max_entries"], state.get("max_bytes", 128 * 1024 * 1024))


def result_nbytes(result: ToolResult) -> int:
    """Approximate memory held by a result: its images' pixels, its text, 1 KiB for the rest.

    >>> result_nbytes(ToolResult("ok", images=[Image.new("RGB", (10, 10))]))
    1326
    """
    pixels = sum(im.width * im.height * len(im.getbands()) for im in result.images)
    return pixels + len(result.text) + 1024


def retained_by(result: ToolResult) -> dict[int, tuple[Any, int]]:
    """What a result keeps alive beside its own pixels, by ``id``: the images and arrays that its
    undrawn :class:`~medvqa_env.images.LazyImage` results will be drawn from (a zoom's source
    image, a mask), with their bytes.

    >>> from medvqa_env.images import LazyImage
    >>> def crop_of(source):
    ...     return LazyImage(lambda: source.crop((0, 0, 10, 10)), (10, 10))
    >>> [n for _, n in retained_by(ToolResult("ok", images=[crop_of(Image.new("RGB", (100, 50)))])).values()]
    [15000]
    """
    import numpy as np

    from medvqa_env.images import LazyImage

    out: dict[int, tuple[Any, int]] = {}
    for im in result.images:
        draw = getattr(im, "_draw", None) if isinstance(im, LazyImage) else None
        values = list(getattr(draw, "__defaults__", None) or ())
        for cell in getattr(draw, "__closure__", None) or ():
            try:
                values.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        for value in values:
            if isinstance(value, Image.Image):
                out[id(value)] = (value, value.width * value.height * len(value.getbands()))
            elif isinstance(value, np.ndarray):
                out[id(value)] = (value, value.nbytes)
    return out


def cache_key(name: str, arguments: Mapping[str, Any], images: Sequence[Image.Image],
              context: ToolContext) -> str | None:
    """Key on the one image the call targets (``image_index``), so unrelated crops don't matter."""
    index = arguments.get("image_index", 0)
    if not isinstance(index, int) or isinstance(index, bool) or not -len(images) <= index < len(images):
        return None
    try:
        args = json.dumps(arguments, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return f"{name}|{args}|{image_digest(images[index])}|{context.record_id}"


class Toolbox:
    """Dispatches tool calls by name to their backends. See the module docstring."""

    def __init__(self, backends: Mapping[str, ToolBackend], cache: ToolCache | None = None) -> None:
        self._backends = dict(backends)
        self._specs: dict[str, ToolSpec] = {}
        for backend in dict.fromkeys(self._backends.values()):
            for spec in backend.specs():
                if spec.name in self._backends and self._backends[spec.name] is backend:
                    self._specs[spec.name] = spec
        missing = [n for n in self._backends if n not in self._specs]
        if missing:
            raise ConfigError(f"backends did not provide specs for tools {missing}")
        self.cache = cache

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def local(cls, tools: Sequence[Tool], cache: ToolCache | None = None) -> "Toolbox":
        backend = LocalBackend(tools)
        return cls({t.name: backend for t in tools}, cache=cache)

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | None = None, cache: bool | ToolCache = True) -> "Toolbox":
        """Build from ``{tool_name: "local" | "http://host:port" | {"backend": ..., ...options}}``.

        ``backend: local`` builds the tool from the registry with the remaining keys as options
        (e.g. ``engine``, ``model``); ``backend: http`` (or a URL string) calls a tool server with
        ``url``, ``timeout_s``, ``retries``, ``token``. A path to a JSON/YAML file also works.
        """
        from tool_backends.config import load_tool_config, make_backends

        spec = load_tool_config(config)
        backends = make_backends(spec)
        if cache is True:
            cache = ToolCache()
        return cls(backends, cache=cache if isinstance(cache, ToolCache) else None)

    # ---- queries --------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._specs)

    @property
    def specs(self) -> list[ToolSpec]:
        return list(self._specs.values())

    def openai_tools(self) -> list[dict[str, Any]]:
        """Tool schemas for chat templates' ``tools=`` and OpenAI-compatible endpoints."""
        return [s.openai_schema() for s in self._specs.values()]

    # ---- calling --------------------------------------------------------------------------
    def call(self, call: ToolCall, images: Sequence[Image.Image], context: ToolContext | None = None) -> ToolCallRecord:
        """Run one call. Never raises: failures come back as ``ToolResult.failure``."""
        context = context or ToolContext()
        start = time.perf_counter()
        backend = self._backends.get(call.name)
        if backend is None:
            result = ToolResult.failure(unknown_name_message("tool", call.name, self._specs))
            return ToolCallRecord(call.name, call.arguments, result, time.perf_counter() - start)
        try:  # models' argument names (bbox_2d, img_idx) -> ours, before the cache key and the image choice
            arguments = (canonical_arguments(self._specs[call.name], call.arguments)
                         if isinstance(call.arguments, Mapping) else call.arguments)
        except ToolError as e:
            return ToolCallRecord(call.name, call.arguments, ToolResult.failure(str(e)), time.perf_counter() - start)

        key = cache_key(call.name, arguments, images, context) if self.cache is not None else None
        if key is not None:
            hit = self.cache.get(key)
            if hit is not None:
                return ToolCallRecord(call.name, call.arguments, hit, time.perf_counter() - start, cached=True)
        try:
            result = backend.call(call.name, images, arguments, context)
        except ToolError as e:  # backends raise these for timeouts, dead servers, bad responses
            result = ToolResult.failure(str(e))
        except Exception as e:  # a tool bug must not end the episode, let alone the run
            log.exception("tool %r crashed", call.name)
            result = ToolResult.failure(f"Tool {call.name!r} crashed: {type(e).__name__}: {e}")
        if key is not None and result.ok:
            self.cache.put(key, result)
        return ToolCallRecord(call.name, call.arguments, result, time.perf_counter() - start)

    def close(self) -> None:
        for backend in dict.fromkeys(self._backends.values()):
            backend.close()


__all__ = ["Toolbox", "ToolBackend", "LocalBackend", "ToolCache", "ToolCallRecord", "ToolBackendError", "build_tool"]
