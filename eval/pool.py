"""Env workers: many live episodes stepped in parallel, in this process or in worker processes.

The agent stays in the main process (it may own a GPU model); envs, tools, rewards and per-episode
scoring run in workers. Each worker owns ``slots`` envs (one live episode each) sharing one toolbox
(and so one tool cache). The main loop sends a worker a *list* of commands and gets a list of
results back, so one pipe round trip serves many episodes:

* ``("reset", slot, index, seed)`` -> ``{"obs", "info"}`` or ``{"error"}``
* ``("step", slot, action)`` -> ``{"obs", "reward", "terminated", "truncated", "info", "trace"}``;
  each tool call is flagged ``invalid`` (see :func:`eval.scoring.is_invalid_call`); when the
  episode ends also ``"score"`` (see :func:`eval.scoring.score_episode`).

Every failure inside a worker (a missing image at reset, a crashing tool backend, a bug) comes
back as ``{"error": {"kind", "message"}}`` for that one episode; a worker process that dies is
restarted and only its live episodes are lost (recorded as ``worker_crash``).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from multiprocessing.connection import Connection, wait
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from medvqa_env.errors import DatasetError
from medvqa_env.records import VQADataset

log = logging.getLogger(__name__)


@dataclass
class EnvSpec:
    """Everything a worker needs to build its envs (picklable).

    ``reward``: ``"rule"`` (default: rule ±1 for CLOSED/MCQ, exact match for OPEN -- cheap and
    stateless, so results do not depend on episode order), ``"default"`` (the training reward,
    :func:`rewards.default_reward`) or a name for ``rewards.registry.build_reward``.
    """

    dataset: VQADataset
    tools: Any = None
    reward: str = "rule"
    env_options: Mapping[str, Any] = field(default_factory=dict)
    open_metrics: bool = True
    metrics_options: Mapping[str, Any] = field(default_factory=dict)
    """:class:`rewards.armed.ARMedConfig` fields for :class:`eval.scoring.OpenMetrics` (encoders)."""


def build_reward(name: str):
    from rewards import ByAnswerType, ExactMatchReward, RuleReward, default_reward

    if name == "rule":
        rule = RuleReward()
        return ByAnswerType(closed=rule, mcq=rule, open=ExactMatchReward())
    if name == "default":
        return default_reward()
    from rewards.registry import build_reward as registry_build

    return registry_build(name)


class EnvWorker:
    """Runs commands against ``slots`` envs. Used directly (serial) or inside a worker process."""

    def __init__(self, spec: EnvSpec, slots: int) -> None:
        from medvqa_env.env import MedVQAEnv
        from tool_backends.toolbox import Toolbox

        toolbox = spec.tools if isinstance(spec.tools, Toolbox) else Toolbox.from_config(spec.tools)
        reward = build_reward(spec.reward)
        self.envs = [MedVQAEnv(spec.dataset, tools=toolbox, reward=reward, **dict(spec.env_options))
                     for _ in range(slots)]
        self.tool_specs = {s.name: s for s in toolbox.specs}
        self._want_open_metrics = spec.open_metrics
        self._metrics_options = dict(spec.metrics_options)
        self._open_metrics = None
        self.open_metrics_error: str | None = None

    def open_metrics(self):
        if self._want_open_metrics and self._open_metrics is None and self.open_metrics_error is None:
            from eval.scoring import OpenMetrics

            try:
                self._open_metrics = OpenMetrics(**self._metrics_options)
            except ImportError as e:
                self.open_metrics_error = f"{type(e).__name__}: {e}"
                log.warning("open-answer metrics unavailable: %s", e)
        return self._open_metrics

    def run(self, commands: Sequence[tuple]) -> list[dict[str, Any]]:
        self._to_score: list[tuple[dict[str, Any], Any]] = []
        out = [self._run_one(c) for c in commands]
        self._score_open_answers()
        return out

    def _score_open_answers(self) -> None:
        """The episodes that ended in this command list get their open metrics in one batch."""
        if not self._to_score:
            return
        t0 = time.perf_counter()
        batch = [(res, record) for res, record in self._to_score if res["score"].pop("needs_open_metrics", False)]
        metrics = self.open_metrics() if batch else None
        if metrics is None:
            for res, _ in batch:
                if self._want_open_metrics:
                    res["score"]["metrics_error"] = self.open_metrics_error
            return
        try:
            rows = metrics([res["score"]["answer"] or "" for res, _ in batch], [r.answer for _, r in batch])
        except Exception as e:  # a metric failure costs the metrics, not the episodes
            log.warning("open-answer metrics failed: %s", e, exc_info=True)
            for res, _ in batch:
                res["score"]["metrics_error"] = f"{type(e).__name__}: {e}"
            return
        share = (time.perf_counter() - t0) / len(batch)
        for (res, _), row in zip(batch, rows):
            res["score"]["metrics"] = row
            res["score_s"] = share

    def _run_one(self, command: tuple) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            if command[0] == "reset":
                out = self._reset(*command[1:])
            elif command[0] == "step":
                out = self._step(*command[1:])
            else:
                raise ValueError(f"expected a 'reset' or 'step' command, got {command[0]!r}")
        except DatasetError as e:
            out = {"error": {"kind": "dataset_error", "message": str(e)}}
        except Exception as e:  # one episode's failure must not end the run
            log.debug("env command %r failed", command[0], exc_info=True)
            out = {"error": {"kind": "env_error", "message": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc(limit=8)}}
        out["env_s"] = time.perf_counter() - start
        return out

    def _reset(self, slot: int, index: int, seed: int) -> dict[str, Any]:
        obs, info = self.envs[slot].reset(seed=seed, options={"index": index})
        return {"kind": "reset", "obs": obs, "info": info}

    def _step(self, slot: int, action: Any) -> dict[str, Any]:
        env = self.envs[slot]
        obs, reward, terminated, truncated, info = env.step(action)
        from eval.scoring import is_invalid_call, score_episode

        for call in info.get("tool_calls", ()):
            call["invalid"] = is_invalid_call(call, self.tool_specs)
        out = {"kind": "step", "obs": obs, "reward": float(reward), "terminated": bool(terminated),
               "truncated": bool(truncated), "info": info}
        if terminated or truncated:
            out["score"] = score_episode(env.record, info.get("answer"), bool(info.get("format_ok")))
            out["score_s"] = 0.0
            self._to_score.append((out, env.record))
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()


class ArenaImage(NamedTuple):
    """An observation image left in the worker's shared-memory arena (what crosses the pipe)."""

    offset: int
    shape: tuple[int, ...]
    dtype: str


ARENA_BYTES = 256 << 20  # per worker; tmpfs pages cost memory only once written


def park_images(results: list[dict[str, Any]], arena: Any) -> list[dict[str, Any]]:
    """Worker side: copy observation images into the arena (one memcpy each) and send only their
    place; what does not fit goes through the pipe as before. VQA-RAD images are ~2 MB, and
    pickling them through a socket costs the main process several copies and many reads."""
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


def _worker_main(conn: Connection, spec: EnvSpec, slots: int, arena_name: str | None = None) -> None:
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per worker: the pool is the parallelism
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        worker = EnvWorker(spec, slots)
    except Exception as e:
        conn.send({"fatal": f"{type(e).__name__}: {e}"})
        return
    arena = None
    if arena_name:
        try:
            arena = shared_memory.SharedMemory(name=arena_name)
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
    """Results carry images (VQA-RAD: ~2 MB each); with the default ~200 KB socket buffers a
    message takes dozens of read/write round trips between the processes. Best effort."""
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


class EnvPool:
    """``workers`` env workers with ``slots`` envs each; ``workers=0`` runs one worker in-process.

    :meth:`submit` sends a command list to an idle worker; :meth:`poll` waits until at least one
    worker has answered and returns every answer that is ready as ``(worker, results)``; a
    crashed worker answers ``None`` once and is restarted.
    """

    def __init__(self, spec: EnvSpec, workers: int, slots: int, start_method: str = "spawn") -> None:
        if workers < 0 or slots < 1:
            raise ValueError(f"expected workers >= 0 and slots >= 1, got workers={workers!r}, slots={slots!r}")
        self.spec, self.slots = spec, slots
        self.n_workers = max(1, workers)
        self.in_process = workers == 0
        self._ctx = mp.get_context(start_method)
        self._local: EnvWorker | None = None
        self._local_results: dict[int, list[dict[str, Any]]] = {}
        self._conns: list[Connection | None] = [None] * self.n_workers
        self._procs: list[Any] = [None] * self.n_workers
        self._arenas: list[Any] = [None] * self.n_workers
        self.busy = [False] * self.n_workers
        self._dead: set[int] = set()
        if self.in_process:
            self._local = EnvWorker(spec, slots)
        else:
            for w in range(self.n_workers):
                self._start(w)
            for w in range(self.n_workers):
                self._await_ready(w)

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
                                 name=f"medvqa-eval-env-{w}")
        proc.start()
        child.close()
        self._conns[w], self._procs[w] = parent, proc

    def _await_ready(self, w: int) -> None:
        try:
            msg = self._conns[w].recv()
        except EOFError:
            msg = {"fatal": "the worker process exited while starting"}
        if "fatal" in msg:
            self.close()
            raise RuntimeError(f"env worker {w} could not start: {msg['fatal']}")

    def submit(self, worker: int, commands: list[tuple]) -> None:
        if self.busy[worker]:
            raise RuntimeError(f"worker {worker} is busy; poll() before submitting again")
        self.busy[worker] = True
        if self.in_process:
            self._local_results[worker] = self._local.run(commands)
            return
        try:
            self._conns[worker].send(commands)
        except (OSError, ValueError):  # the worker is gone: poll() reports it and restarts it
            self._dead.add(worker)

    def poll(self) -> list[tuple[int, list[dict[str, Any]] | None]]:
        if self.in_process:
            out = list(self._local_results.items())
            self._local_results.clear()
            for w, _ in out:
                self.busy[w] = False
            return out
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
        try:
            self._conns[w].close()
        except OSError:
            pass
        proc = self._procs[w]
        if proc is not None and proc.is_alive():
            proc.kill()
        self._start(w)
        self._await_ready(w)

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
            self._local = None
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
                    proc.join(timeout=5)  # reap it
        self._conns = [None] * self.n_workers
        self._procs = [None] * self.n_workers
        for arena in self._arenas:
            if arena is not None:
                arena.close()
                arena.unlink()
        self._arenas = [None] * self.n_workers
