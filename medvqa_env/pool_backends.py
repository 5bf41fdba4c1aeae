"""Worker processes and Ray actors for :class:`medvqa_env.pool.EnvPool`.

Both answer the same interface as :class:`medvqa_env.pool.ThreadWorkers`: ``submit(worker,
commands)`` to an idle worker, ``poll()`` for every answer that is ready (``None`` once for a
worker that died; it is restarted), ``busy``, ``close()``.

Processes are spawned (no fork of a process that holds threads or torch state). Observation images
come back through a shared-memory arena per worker (one memcpy each) instead of the pipe: VQA-RAD
images are ~2 MB, and pickling them through a socket costs several copies and many reads.
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
from typing import Any, Iterator, NamedTuple

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
    """Worker side: copy observation images into the arena; what does not fit goes inline."""
    offset = 0
    for res in results:
        obs = res.get("obs")
        if not obs or not obs.get("images"):
            continue
        parked = []
        for image in obs["images"]:
            arr = np.ascontiguousarray(image)
            if offset + arr.nbytes > arena.size:
                parked.append(arr)
                continue
            np.ndarray(arr.shape, arr.dtype, buffer=arena.buf, offset=offset)[...] = arr
            parked.append(ArenaImage(offset, arr.shape, arr.dtype.str))
            offset += -(-arr.nbytes // 64) * 64
        obs["images"] = tuple(parked)
    return results


def fetch_images(results: list[dict[str, Any]], arena: Any) -> list[dict[str, Any]]:
    """Main side: copy parked images out of the arena (before the worker gets new commands)."""
    for res in results:
        obs = res.get("obs")
        if obs and obs.get("images"):
            obs["images"] = tuple(
                np.ndarray(a.shape, np.dtype(a.dtype), buffer=arena.buf, offset=a.offset).copy()
                if isinstance(a, ArenaImage) else a for a in obs["images"])
    return results


def _worker_main(conn: Connection, spec: PoolSpec, slots: int, arena_name: str | None) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per worker: the pool is the parallelism
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        worker = EnvWorker(spec, slots)
    except Exception as e:  # noqa: BLE001 -- reported to the owner, which raises it
        conn.send({"fatal": f"{type(e).__name__}: {e}"})
        return
    arena = None
    if arena_name:
        try:
            arena = shared_memory.SharedMemory(name=arena_name)  # the owner unlinks it
        except OSError:  # no shared memory here: images go through the pipe
            arena = None
    conn.send({"ready": True})
    while True:
        try:
            commands = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if commands is None:
            break
        results = worker.run(commands)
        conn.send(park_images(results, arena) if arena is not None else results)
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
    """``n_workers`` spawned processes with ``slots`` copies each."""

    def __init__(self, spec: PoolSpec, n_workers: int, slots: int, start_method: str = "spawn",
                 start_timeout_s: float = 600.0) -> None:
        self.spec, self.slots, self.n_workers = spec, slots, n_workers
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
        proc = self._ctx.Process(target=_worker_main, args=(child, self.spec, self.slots, arena_name), daemon=True,
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
                out.append((w, fetch_images(results, self._arenas[w]) if self._arenas[w] is not None else results))
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
    """Start a local Ray (no dashboard, token auth off) unless one is already up."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if not ray.is_initialized():
        env_vars = {"RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
        if "MEDVQA_CACHE" in os.environ:
            env_vars["MEDVQA_CACHE"] = os.environ["MEDVQA_CACHE"]
        ray.init(num_cpus=num_cpus or max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": env_vars})
    return ray


class RayWorkers:
    """``n_workers`` Ray actors with ``slots`` copies each (built inside the actor from the spec)."""

    def __init__(self, spec: PoolSpec, n_workers: int, slots: int, cpus_per_worker: float = 0.5) -> None:
        self.ray = ensure_ray()
        self.spec, self.slots, self.n_workers = spec, slots, n_workers
        self._actor_cls = self.ray.remote(num_cpus=cpus_per_worker)(EnvWorker)
        self._actors = [self._actor_cls.remote(spec, slots) for _ in range(n_workers)]
        self._refs: dict[int, Any] = {}
        self.ray.get([a.__ray_ready__.remote() for a in self._actors])

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
                self._actors[w] = self._actor_cls.remote(self.spec, self.slots)
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
