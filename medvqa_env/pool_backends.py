"""Worker processes and Ray actors for :class:`medvqa_env.pool.EnvPool`.

Both answer the same interface as :class:`medvqa_env.pool.ThreadWorkers`: ``submit(worker,
commands)`` to an idle worker, ``poll()`` for every answer that is ready (``None`` once for a
worker that died; it is restarted), ``busy``, ``close()``.

Processes are spawned (no fork of a process that holds threads or torch state). Observation images
come back through a shared-memory arena per worker (one memcpy each) instead of the pipe: VQA-RAD
images are ~2 MB, and pickling them through a socket costs several copies and many reads.

By default the owner copies each image out before the worker's next command list. With
``image_views=True`` (what the evaluation harness asks for) every env slot owns a region of the
arena that a reset rewinds and a step appends to, so an image stays where it is until its slot's
next reset and the owner keeps read-only views instead of copies: a consumer that drops an
episode's images before reusing its slot pays no copy at all.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import sys
import weakref
from multiprocessing import shared_memory
from multiprocessing.connection import Connection, wait
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from medvqa_env.pool import EnvWorker, PoolSpec

log = logging.getLogger(__name__)

ARENA_BYTES = 256 << 20  # per worker; tmpfs pages cost memory only once written


# ==============================================================================================
# Images through shared memory
# ==============================================================================================
class ArenaImage(NamedTuple):
    """An observation image left in the worker's shared-memory arena (what crosses the pipe)."""

    offset: int
    shape: tuple[int, ...]
    dtype: str


def park_images(results: list[dict[str, Any]], arena: Any) -> list[dict[str, Any]]:
    """Worker side: copy observation images into the arena from its start (the owner copies them
    out before the next command list); what does not fit goes inline."""
    offset = 0
    for res in results:
        offset = _park(res, arena, offset, arena.size)
    return results


class SlotRegions:
    """Worker side of ``image_views``: slot ``s`` owns bytes ``[s * region, (s + 1) * region)`` of
    the arena. A reset rewinds the slot's cursor and a step appends after its earlier images, so
    an image is not overwritten before its slot's next reset."""

    def __init__(self, arena: Any, slots: int) -> None:
        self.arena = arena
        self.region = arena.size // max(1, slots) // 64 * 64
        self.used = [0] * slots

    def park(self, commands: list[tuple], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for command, res in zip(commands, results):
            slot = command[1] if command[0] in ("reset", "step") else None
            if not isinstance(slot, int) or not 0 <= slot < len(self.used):
                continue  # no env, no images (an out-of-range slot is an error result already)
            if command[0] == "reset":
                self.used[slot] = 0
            start = slot * self.region
            self.used[slot] = _park(res, self.arena, start + self.used[slot], start + self.region) - start
        return results


def _park(res: dict[str, Any], arena: Any, offset: int, end: int) -> int:
    """Copy ``res``'s observation images into ``arena[offset:end]``; returns the next free offset."""
    obs = res.get("obs")
    if not obs or not obs.get("images"):
        return offset
    parked = []
    for image in obs["images"]:
        arr = np.ascontiguousarray(image)
        if offset + arr.nbytes > end:
            parked.append(arr)
            continue
        np.ndarray(arr.shape, arr.dtype, buffer=arena.buf, offset=offset)[...] = arr
        parked.append(ArenaImage(offset, arr.shape, arr.dtype.str))
        offset += -(-arr.nbytes // 64) * 64
    obs["images"] = tuple(parked)
    return offset


def fetch_images(results: list[dict[str, Any]], arena: Any, views: bool = False) -> list[dict[str, Any]]:
    """Main side: parked images as copies (before the worker gets new commands) or, with ``views``
    (slot regions), as read-only views that stay valid until the slot's next reset."""
    for res in results:
        obs = res.get("obs")
        if obs and obs.get("images"):
            obs["images"] = tuple(_from_arena(a, arena, views) if isinstance(a, ArenaImage) else a
                                  for a in obs["images"])
    return results


def _from_arena(image: ArenaImage, arena: Any, view: bool) -> np.ndarray:
    arr = np.ndarray(image.shape, np.dtype(image.dtype), buffer=arena.buf, offset=image.offset)
    if not view:
        return arr.copy()
    arr.flags.writeable = False
    return arr


def _worker_main(conn: Connection, spec: PoolSpec, slots: int, arena_name: str | None,
                 image_views: bool = False) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per worker: the pool is the parallelism
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        # the arena or the pipe copies every observation image anyway: the envs need not
        worker = EnvWorker(spec, slots, copy_images=False)
    except Exception as e:  # noqa: BLE001 -- reported to the owner, which raises it
        with contextlib.suppress(OSError):  # the owner may be gone already (another worker's error stopped it)
            conn.send({"fatal": f"{type(e).__name__}: {e}"})
        return
    arena = None
    if arena_name:
        try:
            arena = shared_memory.SharedMemory(name=arena_name)  # the owner unlinks it
        except OSError:  # no shared memory here: images go through the pipe
            arena = None
    regions = SlotRegions(arena, slots) if arena is not None and image_views else None
    conn.send({"ready": True})
    while True:
        try:
            commands = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if commands is None:
            break
        results = worker.run(commands)
        if regions is not None:
            results = regions.park(commands, results)
        elif arena is not None:
            results = park_images(results, arena)
        conn.send(results)
    worker.close()
    if arena is not None:
        arena.close()


def _widen_socket_buffers(conn: Connection, size: int = 8 << 20) -> None:
    """With the default ~200 KB socket buffers a 2 MB message takes dozens of round trips. Best effort."""
    import socket

    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    try:
        for force, plain in ((getattr(socket, "SO_SNDBUFFORCE", None), socket.SO_SNDBUF),
                             (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF)):
            for opt in (force, plain):
                if opt is None:
                    continue
                try:
                    sock.setsockopt(socket.SOL_SOCKET, opt, size)
                    break
                except OSError:
                    continue
    finally:
        sock.close()


@contextlib.contextmanager
def _main_not_reimported() -> Iterator[None]:
    """Start spawned workers without re-running the user's script.

    A spawned child re-imports ``__main__`` from its file. A plain script that calls ``evaluate()``
    at top level (no ``if __name__ == "__main__"``) would then run again in every worker and fail.
    The workers need nothing from ``__main__`` (their target and spec live in this package; agents
    and rewards stay in the owner), so its file is hidden while they start.
    """
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if main is None or spec_name is not None or path is None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def _release(arenas: list[Any]) -> None:
    for arena in arenas:
        if arena is not None:
            with contextlib.suppress(Exception):
                arena.close()
            with contextlib.suppress(Exception):
                arena.unlink()


class ProcessWorkers:
    """``n_workers`` spawned processes with ``slots`` copies each.

    ``image_views``: observation images come back as read-only views of the worker's arena, valid
    until their slot's next reset (see the module docstring), instead of copies.
    """

    def __init__(self, spec: PoolSpec, n_workers: int, slots: int, start_method: str = "spawn",
                 start_timeout_s: float = 600.0, image_views: bool = False) -> None:
        self.spec, self.slots, self.n_workers = spec, slots, n_workers
        self.image_views = bool(image_views)
        self.start_timeout_s = float(start_timeout_s)
        self._ctx = mp.get_context(start_method)
        self._conns: list[Connection | None] = [None] * n_workers
        self._procs: list[Any] = [None] * n_workers
        self._arenas: list[Any] = [None] * n_workers
        self._finalizer = weakref.finalize(self, _release, self._arenas)  # unlinked even if close() is missed
        self.busy = [False] * n_workers
        self._dead: set[int] = set()
        try:
            for w in range(n_workers):
                self._start(w)
            for w in range(n_workers):
                self._await_ready(w)
        except BaseException:
            self.close()
            raise

    def _start(self, w: int) -> None:
        parent, child = self._ctx.Pipe()
        for conn in (parent, child):
            _widen_socket_buffers(conn)
        if self._arenas[w] is None:
            try:
                self._arenas[w] = shared_memory.SharedMemory(create=True, size=ARENA_BYTES)
            except OSError:
                log.warning("no shared memory; observation images go through the pipe")
        arena_name = self._arenas[w].name if self._arenas[w] is not None else None
        proc = self._ctx.Process(target=_worker_main, args=(child, self.spec, self.slots, arena_name, self.image_views), daemon=True,
                                 name=f"medvqa-env-{w}")
        with _main_not_reimported():
            proc.start()
        child.close()
        self._conns[w], self._procs[w] = parent, proc

    def _await_ready(self, w: int) -> None:
        try:
            if not self._conns[w].poll(self.start_timeout_s):  # e.g. stuck loading a model
                raise RuntimeError(f"env worker {w} did not start within {self.start_timeout_s:.0f} s")
            msg = self._conns[w].recv()
        except EOFError:
            msg = {"fatal": "the worker process exited while starting"}
        if "fatal" in msg:
            raise RuntimeError(f"env worker {w} could not start: {msg['fatal']}")

    def submit(self, worker: int, commands: list[tuple]) -> None:
        self.busy[worker] = True
        try:
            self._conns[worker].send(commands)
        except (OSError, ValueError):  # the worker is gone: poll() reports it and restarts it
            self._dead.add(worker)

    def poll(self) -> list[tuple[int, list[dict[str, Any]] | None]]:
        out: list[tuple[int, list[dict[str, Any]] | None]] = []
        for w in sorted(self._dead):
            log.error("env worker %d died; restarting it", w)
            out.append((w, None))
            self.busy[w] = False
            self._restart(w)
        self._dead.clear()
        if out:
            return out
        pending = {self._conns[w]: w for w in range(self.n_workers) if self.busy[w]}
        if not pending:
            return []
        for conn in wait(list(pending)):
            w = pending[conn]
            try:
                results = conn.recv()
                arena = self._arenas[w]
                out.append((w, fetch_images(results, arena, self.image_views) if arena is not None else results))
            except (EOFError, OSError):
                log.error("env worker %d died; restarting it", w)
                out.append((w, None))
                self._restart(w)
            self.busy[w] = False
        return out

    def _restart(self, w: int) -> None:
        with contextlib.suppress(OSError):
            self._conns[w].close()
        proc = self._procs[w]
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(timeout=5)  # reap it
        self._start(w)
        self._await_ready(w)

    def close(self) -> None:
        for w, conn in enumerate(self._conns):
            if conn is None:
                continue
            try:
                if not self.busy[w]:
                    conn.send(None)
                conn.close()
            except OSError:
                pass
        for proc in self._procs:
            if proc is not None:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=5)
        self._conns = [None] * self.n_workers
        self._procs = [None] * self.n_workers
        self._finalizer()


# ==============================================================================================
# Ray actors
# ==============================================================================================
def ensure_ray(num_cpus: int | None = None):
    """Start a local Ray unless one is already up: no dashboard, every port on loopback only, and
    Ray's own token auth as Ray sets it for a new local cluster (on, with a token it keeps in
    ``~/.ray/auth_token``; ``RAY_AUTH_MODE=disabled`` opts out).

    Loopback: Ray 2.60 turns ``_node_ip_address="127.0.0.1"`` back into the machine's address and
    then its ``gcs_server``, ``raylet`` and workers listen on every interface. Its one switch to a
    loopback node is ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (read as ``ray_constants.ENABLE_RAY_CLUSTER``:
    off, the node's address is ``127.0.0.1`` and the gRPC servers bind it), set here while the
    local node starts. With ``RAY_ADDRESS`` set, ``ray.init`` joins that cluster and nothing is changed."""
    import ray

    if not ray.is_initialized():
        env_vars = {"HF_HUB_OFFLINE": "1"}
        for name in ("MEDVQA_CACHE", "RAY_AUTH_MODE"):
            if name in os.environ:
                env_vars[name] = os.environ[name]
        kwargs = dict(num_cpus=num_cpus or max(2, os.cpu_count() or 2), include_dashboard=False,
                      log_to_driver=False, runtime_env={"env_vars": env_vars})
        if os.environ.get("RAY_ADDRESS"):
            ray.init(**kwargs)
        else:
            with _loopback_ray():
                ray.init(**kwargs)
    return ray


@contextlib.contextmanager
def _loopback_ray():
    """While a local Ray node starts: its address is ``127.0.0.1`` (see :func:`ensure_ray`)."""
    from ray._private import ray_constants

    name = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    saved_env, saved = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name], ray_constants.ENABLE_RAY_CLUSTER = "0", False  # the node's processes inherit it
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved_env


class RayWorkers:
    """``n_workers`` Ray actors with ``slots`` copies each (built inside the actor from the spec).

    ``worker_resources``: custom Ray resources per worker, cycled over the workers -- e.g.
    ``[{"node_a": 0.01}, {"node_b": 0.01}]`` with nodes started with those resources puts worker 0
    (slots ``0..slots-1``, whole groups) on one node and worker 1 on the other. Without it Ray places
    the actors wherever CPUs are free.
    """

    def __init__(self, spec: PoolSpec, n_workers: int, slots: int, cpus_per_worker: float = 0.5,
                 worker_resources: Sequence[Mapping[str, float]] | None = None) -> None:
        self.ray = ensure_ray()
        self.spec, self.slots, self.n_workers = spec, slots, n_workers
        self._actor_cls = self.ray.remote(num_cpus=cpus_per_worker)(EnvWorker)
        resources = [dict(r) for r in (worker_resources or [])]
        if worker_resources is not None and not resources:
            raise ValueError("expected at least one resource mapping in worker_resources, got none")
        if resources:  # an unknown resource would leave the actor pending forever: refuse it now
            known = self.ray.cluster_resources()
            for r in resources:
                missing = {k: v for k, v in r.items() if known.get(k, 0.0) < v}
                if missing:
                    custom = sorted(k for k in known if k not in ("CPU", "GPU", "memory", "object_store_memory")
                                    and not k.startswith("node:"))
                    raise ValueError(f"expected worker_resources the cluster has, got {missing!r}; "
                                     f"its custom resources: {custom}")
        self._options = [{"resources": resources[w % len(resources)]} if resources else {} for w in range(n_workers)]
        self._actors = [self._new_actor(w) for w in range(n_workers)]
        self._refs: dict[int, Any] = {}
        self.ray.get([a.__ray_ready__.remote() for a in self._actors])

    def _new_actor(self, w: int):
        return self._actor_cls.options(**self._options[w]).remote(self.spec, self.slots)

    @property
    def busy(self) -> list[bool]:
        return [w in self._refs for w in range(self.n_workers)]

    def submit(self, worker: int, commands: list[tuple]) -> None:
        self._refs[worker] = self._actors[worker].run.remote(commands)

    def poll(self) -> list[tuple[int, list[dict[str, Any]] | None]]:
        if not self._refs:
            return []
        by_ref = {ref: w for w, ref in self._refs.items()}
        ready, _ = self.ray.wait(list(by_ref), num_returns=1)
        ready, _ = self.ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0) if len(by_ref) > 1 else (ready, None)
        out = []
        for ref in ready:
            w = by_ref[ref]
            del self._refs[w]
            try:
                out.append((w, self.ray.get(ref)))
            except self.ray.exceptions.RayActorError:
                log.error("env actor %d died; restarting it", w)
                out.append((w, None))
                self._actors[w] = self._new_actor(w)
        return out

    def close(self) -> None:
        try:
            self.ray.get([a.close.remote() for a in self._actors])
        except Exception:  # noqa: BLE001 -- a dead actor has nothing left to close
            pass
        finally:
            for a in self._actors:
                self.ray.kill(a)
            self._actors = []
