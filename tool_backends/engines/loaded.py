"""Loaded once: model engines kept per process and shared by every tool that asks for the same one.

Each env copy of a pool builds its own tools; without this every copy re-read the same checkpoint
(a trained CLIP, SAM or grounder folder) and held its own copy of the weights. :func:`load_once`
builds an engine the first time a process asks for (class, options, checkpoint) and hands the same
object to every later caller. The checkpoint part of the key is the ``model`` folder's (or file's)
path with the name, size and modification time of each file in it, so a folder rebuilt or edited
in place (new weights, a new manifest) is loaded afresh; a hub name or ``tiny-random`` is keyed by
name. Engines are safe to share: a model engine runs one forward at a time under its own lock.

A shared engine is owned by this registry: a tool's ``close()`` leaves it loaded for the others
(:func:`forget_loaded` drops them all, e.g. to free memory). Loading shows no third-party progress
bars (transformers' "Loading weights") unless ``MEDVQA_PROGRESS_BARS=1``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from medvqa_env.progress import quiet_progress

T = TypeVar("T")

_LOCK = threading.Lock()
_LOADED: dict[tuple, "_Slot"] = {}


class _Slot:
    __slots__ = ("lock", "engine")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.engine: Any = None


def checkpoint_fingerprint(model: Any) -> tuple:
    """What identifies the checkpoint ``model`` names: for a local folder or file, its resolved path
    and each file's (relative name, size, mtime); otherwise the value itself (a hub name).

    >>> checkpoint_fingerprint("tiny-random")
    ('tiny-random',)
    """
    if not isinstance(model, (str, os.PathLike)) or not os.path.exists(model):
        return (str(model),)
    root = Path(model).resolve()
    if root.is_file():
        st = root.stat()
        return (str(root), (root.name, st.st_size, st.st_mtime_ns))
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((str(path.relative_to(root)), st.st_size, st.st_mtime_ns))
    return (str(root), *files)


def load_once(factory: Callable[..., T], options: Mapping[str, Any] | None = None, what: str | None = None) -> T:
    """``factory(**options)``, built once per process per (``what``: by default the factory's
    name, options, checkpoint files of ``options["model"]``)."""
    options = dict(options or {})
    what = what or f"{getattr(factory, '__module__', '')}:{getattr(factory, '__qualname__', repr(factory))}"
    key = (what, json.dumps(options, sort_keys=True, default=repr), checkpoint_fingerprint(options.get("model")))
    with _LOCK:
        slot = _LOADED.setdefault(key, _Slot())
    with slot.lock:  # two threads asking at once: the second waits for the first's load
        if slot.engine is None:
            with quiet_progress("transformers" in sys.modules or ".hf_" in what):
                engine = factory(**options)
            try:
                engine.shared_by_registry = True
            except AttributeError:  # an engine with __slots__: still shared, close() may free it
                pass
            slot.engine = engine
        return slot.engine


def loaded_count() -> int:
    """Engines this process holds."""
    with _LOCK:
        return sum(slot.engine is not None for slot in _LOADED.values())


def forget_loaded() -> None:
    """Drop every shared engine (their memory is freed once no tool holds them)."""
    with _LOCK:
        _LOADED.clear()


__all__ = ["load_once", "checkpoint_fingerprint", "loaded_count", "forget_loaded"]
