"""Shared memory for Gymnasium's ``AsyncVectorEnv`` with text and variable-size images.

``gym.make_vec("MedVQA-v0", n, vectorization_mode="async")`` asks Gymnasium's async vector env for
shared memory by default, and Gymnasium has none for arbitrary Unicode text or for a sequence of
images of any size ("disable shared_memory"). These handlers give each copy a fixed slot in one
shared-memory block -- a length-prefixed UTF-8 text, or a count and (h, w, c) header per image
followed by the pixels -- written by the worker and read by the main process. The blocks live in
``/dev/shm``: pages cost memory only once written, so the generous slot sizes are free until used.
An observation that does not fit raises a clear error that names the way out
(``vector_kwargs={"shared_memory": False}``).

The Gymnasium async env keeps what :func:`read_from_shared_memory` returned and deep-copies it at
each step, so the returned objects are live views whose deep copy is a tuple snapshot.
"""

from __future__ import annotations

import contextlib
import struct
import weakref
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

HEADER = struct.Struct("<q")


class SharedSlots:
    """``n`` slots of ``slot_bytes`` in one shared-memory block; pickles by name (for workers)."""

    def __init__(self, n: int, slot_bytes: int) -> None:
        self.n, self.slot_bytes = int(n), int(slot_bytes)
        self.block = shared_memory.SharedMemory(create=True, size=self.n * self.slot_bytes)
        self._finalizer = weakref.finalize(self, _unlink, self.block)  # the creator frees it

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.block.name, "n": self.n, "slot_bytes": self.slot_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.n, self.slot_bytes = state["n"], state["slot_bytes"]
        # a spawned worker shares the creator's resource tracker; the creator unlinks the block
        self.block = shared_memory.SharedMemory(name=state["name"])
        self._finalizer = weakref.finalize(self, self.block.close)

    def view(self, index: int) -> memoryview:
        return self.block.buf[index * self.slot_bytes:(index + 1) * self.slot_bytes]

    def too_big(self, what: str, nbytes: int) -> ValueError:
        return ValueError(f"an observation's {what} needs {nbytes} bytes of shared memory, the slot holds "
                          f"{self.slot_bytes}; pass vector_kwargs={{'shared_memory': False}} to gym.make_vec")


def _unlink(block: shared_memory.SharedMemory) -> None:
    with contextlib.suppress(Exception):
        block.close()
    with contextlib.suppress(Exception):
        block.unlink()


# ---- text -------------------------------------------------------------------------------------
def write_text(slots: SharedSlots, index: int, text: str) -> None:
    data = text.encode("utf-8")
    if HEADER.size + len(data) > slots.slot_bytes:
        raise slots.too_big("text", HEADER.size + len(data))
    buf = slots.view(index)
    HEADER.pack_into(buf, 0, len(data))
    buf[HEADER.size:HEADER.size + len(data)] = data


def read_text(slots: SharedSlots, index: int) -> str:
    buf = slots.view(index)
    (size,) = HEADER.unpack_from(buf, 0)
    return bytes(buf[HEADER.size:HEADER.size + size]).decode("utf-8")


# ---- images -----------------------------------------------------------------------------------
def write_images(slots: SharedSlots, index: int, images) -> None:
    arrays = [np.ascontiguousarray(im, dtype=np.uint8) for im in images]
    need = HEADER.size * (1 + 3 * len(arrays)) + sum(a.nbytes for a in arrays)
    if need > slots.slot_bytes:
        raise slots.too_big("images", need)
    buf = slots.view(index)
    HEADER.pack_into(buf, 0, len(arrays))
    offset = HEADER.size
    for a in arrays:
        h, w, c = a.shape
        for v in (h, w, c):
            HEADER.pack_into(buf, offset, v)
            offset += HEADER.size
        buf[offset:offset + a.nbytes] = a.reshape(-1).data
        offset += a.nbytes


def read_images(slots: SharedSlots, index: int) -> tuple[np.ndarray, ...]:
    buf = slots.view(index)
    (count,) = HEADER.unpack_from(buf, 0)
    offset, out = HEADER.size, []
    for _ in range(count):
        h, w, c = (HEADER.unpack_from(buf, offset + k * HEADER.size)[0] for k in range(3))
        offset += 3 * HEADER.size
        size = h * w * c
        out.append(np.frombuffer(buf, np.uint8, size, offset).reshape(h, w, c).copy())
        offset += size
    return tuple(out)


class LiveView:
    """What the async env holds as its observations: reads the slots when indexed; deep-copies to a
    tuple snapshot (the async env returns ``deepcopy(observations)``)."""

    def __init__(self, slots: SharedSlots, read) -> None:
        self.slots, self._read = slots, read

    def __len__(self) -> int:
        return self.slots.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(self.slots.n)))
        return self._read(self.slots, int(i) % self.slots.n)

    def __iter__(self):
        return (self[i] for i in range(self.slots.n))

    def __deepcopy__(self, memo) -> tuple:
        return tuple(self)


def register(text_cls: type, images_cls: type, text_slot_bytes: int, image_slot_bytes) -> None:
    """Register the handlers for the two space classes (called once by :mod:`medvqa_env.spaces`).
    ``image_slot_bytes(space)`` sizes an image slot from the space (its ``max_side``)."""

    @create_shared_memory.register(text_cls)
    def _create_text(space, n: int = 1, ctx=None):
        return SharedSlots(n, text_slot_bytes)

    @read_from_shared_memory.register(text_cls)
    def _read_text(space, shm: SharedSlots, n: int = 1):
        return LiveView(shm, read_text)

    @write_to_shared_memory.register(text_cls)
    def _write_text(space, index: int, value: str, shm: SharedSlots):
        write_text(shm, index, value)

    @create_shared_memory.register(images_cls)
    def _create_images(space, n: int = 1, ctx=None):
        return SharedSlots(n, image_slot_bytes(space))

    @read_from_shared_memory.register(images_cls)
    def _read_images(space, shm: SharedSlots, n: int = 1):
        return LiveView(shm, read_images)

    @write_to_shared_memory.register(images_cls)
    def _write_images(space, index: int, value, shm: SharedSlots):
        write_images(shm, index, value)
