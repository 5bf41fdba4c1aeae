"""The one pool of env copies, and the services a GRPO group shares.

Every consumer that runs many copies of :class:`~medvqa_env.env.MedVQAEnv` runs them here: the
Gymnasium vector env (:mod:`medvqa_env.vector`), the evaluation harness (:mod:`eval.runner`) and
the native trainer (:mod:`train.grpo`). What the copies must agree on lives once per pool:

* **the reward**: one object in the owner process (one loaded encoder, one set of ARMed
  thresholds). Copies end episodes without scoring them (``defer_reward``); every episode that ends
  in one call is scored in one batch here. Scoring never moves the thresholds:
  :meth:`EnvPool.end_batch` does, once per training step, and :meth:`EnvPool.state_dict` carries
  them through checkpoints;
* **the toolbox**: one per worker (loaded tool models, one result cache), shared by the worker's
  copies. Slots are placed contiguously, so the copies of a GRPO group (consecutive slots) sit on
  one worker and pay once for the same call; ``tool_cache_dir`` adds a disk cache shared by all.

Backends: ``"thread"`` (copies in this process, stepped in a background thread so env work overlaps
generation), ``"process"`` (spawned worker processes, restarted when they die) and ``"ray"``
(Ray actors). They answer the same commands (see :class:`EnvWorker`).

Two ways to drive it. By slots (trainers, vector envs)::

    pool = EnvPool({"dataset": "embedded", "tools": ["image_zoom_in"]}, size=8, backend="thread")
    resets = pool.reset([(seed, {"index": 17})] * 8)          # a GRPO group: 8 identical episodes
    results = pool.step_async({slot: text, ...}).result()      # slot -> (obs, reward, term, trunc, info)
    pool.end_batch(step)                                        # the batch boundary

or by worker command lists (the evaluation harness keeps many episodes in flight):
:meth:`EnvPool.submit` / :meth:`EnvPool.poll`. One pool is driven one way at a time.

>>> pool = EnvPool({"dataset": "embedded", "tools": [], "reward": "rule"}, size=2)
>>> (_, a), (_, b) = pool.reset([(0, {"index": 3}), (0, {"index": 3})])
>>> a["record_id"] == b["record_id"]
True
>>> out = pool.step({0: r"\\boxed{yes}", 1: r"\\boxed{yes}"})
>>> out[0][1] == out[1][1] and out[0][2]                      # same answer, same reward
True
>>> pool.close()
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from medvqa_env.errors import ConfigError, DatasetError, unknown_name_message

log = logging.getLogger(__name__)

BACKENDS = ("thread", "process", "ray")
StepResult = tuple[dict, float, bool, bool, dict]
ResetRequest = tuple["int | None", "Mapping[str, Any] | None"]  # (seed, options) for one slot


@dataclass
class PoolSpec:
    """Everything a worker needs to build its copies (picklable; no env objects cross processes).

    ``env_kwargs`` are :class:`MedVQAEnv` keyword arguments without ``reward``/``services`` (the
    pool owns those); ``dataset`` is resolved once by the owner and shipped as records.
    ``episode_hook`` (``"module:Class"``) runs in the worker beside the envs: ``Class(toolbox,
    **hook_options)`` with ``on_step(env, out)`` per step result and ``on_batch(outs)`` per command
    list (the harness computes its per-episode scores there, in parallel).
    """

    env_kwargs: Mapping[str, Any]
    episode_hook: str | None = None
    hook_options: Mapping[str, Any] = field(default_factory=dict)
    tool_cache_dir: str | None = None
    """A directory for a :class:`~tool_backends.disk_cache.DiskToolCache` every worker shares."""


def resolve_spec(env_kwargs: Mapping[str, Any] | PoolSpec) -> tuple[PoolSpec, Any]:
    """``(spec with the dataset loaded, reward argument)`` from env kwargs or a spec."""
    spec = env_kwargs if isinstance(env_kwargs, PoolSpec) else PoolSpec(dict(env_kwargs))
    kwargs = dict(spec.env_kwargs)
    for banned in ("services", "defer_reward"):
        if banned in kwargs:
            raise ConfigError(f"expected env kwargs without {banned!r}: the pool builds the shared services")
    reward = kwargs.pop("reward", None)
    from medvqa_env.env import _resolve_dataset

    kwargs["dataset"] = _resolve_dataset(kwargs.get("dataset", "embedded"), kwargs.pop("split", "test"),
                                         kwargs.pop("dataset_options", None))
    return replace(spec, env_kwargs=kwargs), reward


# ==============================================================================================
# A worker: several copies sharing one toolbox, answering command lists
# ==============================================================================================
class EnvWorker:
    """``slots`` env copies with one toolbox, run in this process, a worker process or a Ray actor.

    Commands (a list per message; one result dict per command, in order):

    * ``("reset", slot, seed, options)`` -> ``{"kind": "reset", "obs", "info"}``
    * ``("step", slot, action)`` -> ``{"kind": "step", "obs", "reward", "terminated",
      "truncated", "info"}``; an episode that ended carries ``info["reward_input"]`` for the
      owner to score.
    * ``("stats",)`` -> ``{"kind": "stats", "tool_cache": {"hits", "misses", "entries"}}``: a miss
      is a call the tool backend really ran.

    Any failure of one command (a missing image, a broken tool backend, a bug) comes back as
    ``{"error": {"kind", "message"}}`` for that command only. Every result has ``env_s``.
    """

    def __init__(self, spec: PoolSpec, slots: int, copy_images: bool = True) -> None:
        from medvqa_env.env import MedVQAEnv
        from medvqa_env.services import EnvServices, resolve_toolbox

        kwargs = dict(spec.env_kwargs)
        from tool_backends.config import for_dataset

        toolbox = resolve_toolbox(for_dataset(kwargs.pop("tools", None), kwargs.get("dataset", "embedded")))
        if spec.tool_cache_dir:
            from tool_backends.disk_cache import DiskToolCache

            toolbox.cache = DiskToolCache(spec.tool_cache_dir)
        self.services = EnvServices(reward=None, toolbox=toolbox)  # scoring is the owner's
        self.envs = [MedVQAEnv(services=self.services, defer_reward=True, **kwargs) for _ in range(slots)]
        for env in self.envs:  # False where the results are copied anyway (pickled or into shared memory)
            env.copy_observation_images = copy_images
        self.hook = None
        if spec.episode_hook:
            self.hook = _import(spec.episode_hook)(toolbox, **dict(spec.hook_options))

    def run(self, commands: Sequence[tuple]) -> list[dict[str, Any]]:
        out = [self._run_one(c) for c in commands]
        if self.hook is not None:
            self.hook.on_batch(out)
        return out

    def _run_one(self, command: tuple) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            if command[0] == "reset":
                _, slot, seed, options = command
                obs, info = self.envs[slot].reset(seed=seed, options=dict(options or {}))
                out: dict[str, Any] = {"kind": "reset", "obs": obs, "info": info}
            elif command[0] == "step":
                _, slot, action = command
                obs, reward, terminated, truncated, info = self.envs[slot].step(action)
                out = {"kind": "step", "obs": obs, "reward": float(reward), "terminated": bool(terminated),
                       "truncated": bool(truncated), "info": info}
                if self.hook is not None:
                    self.hook.on_step(self.envs[slot], out)
            elif command[0] == "stats":
                cache = self.services.toolbox.cache
                out = {"kind": "stats", "tool_cache": {"hits": getattr(cache, "hits", 0),
                                                       "misses": getattr(cache, "misses", 0),
                                                       "entries": len(cache) if cache is not None else 0},
                       "node": _node_name(), "pid": os.getpid()}
            else:
                raise ValueError(f"expected a 'reset', 'step' or 'stats' command, got {command[0]!r}")
        except DatasetError as e:
            out = {"error": {"kind": "dataset_error", "message": str(e)}}
        except Exception as e:  # one episode's failure must not end the run
            log.debug("env command %r failed", command[0], exc_info=True)
            out = {"error": {"kind": "env_error", "message": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc(limit=8)}}
        out["env_s"] = time.perf_counter() - start
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.services.close()


def _node_name() -> str:
    """The Ray node id inside a Ray worker, else the host name."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.get_runtime_context().get_node_id()
    import socket

    return socket.gethostname()


def _import(path: str):
    import importlib

    module, _, name = path.partition(":")
    if not name:
        raise ConfigError(f"expected 'module:Class', got {path!r}")
    return getattr(importlib.import_module(module), name)


# ==============================================================================================
# The thread backend (the other two live in medvqa_env.pool_backends)
# ==============================================================================================
class ThreadWorkers:
    """Workers in this process; each runs its command lists in its own background thread."""

    def __init__(self, spec: PoolSpec, n_workers: int, slots: int) -> None:
        self.n_workers = n_workers
        self.workers = [EnvWorker(spec, slots) for _ in range(n_workers)]
        self._threads = [ThreadPoolExecutor(1, thread_name_prefix=f"medvqa-env-{w}") for w in range(n_workers)]
        self._futures: dict[int, Future] = {}

    @property
    def busy(self) -> list[bool]:
        return [w in self._futures for w in range(self.n_workers)]

    def submit(self, worker: int, commands: list[tuple]) -> None:
        self._futures[worker] = self._threads[worker].submit(self.workers[worker].run, commands)

    def poll(self) -> list[tuple[int, list[dict[str, Any]] | None]]:
        if not self._futures:
            return []
        wait(list(self._futures.values()), return_when="FIRST_COMPLETED")
        done = [w for w, f in self._futures.items() if f.done()]
        return [(w, self._futures.pop(w).result()) for w in done]

    def close(self) -> None:
        for t in self._threads:
            t.shutdown(wait=True)
        for w in self.workers:
            w.close()


# ==============================================================================================
# The pool
# ==============================================================================================
class EnvPool:
    """``size`` env copies on ``workers`` workers of one backend, with one reward (see the module
    docstring).

    Args:
        env_kwargs: :class:`MedVQAEnv` keyword arguments (``dataset``, ``split``, ``tools``,
            ``max_turns``, ...; ``reward`` is the run's one reward: an object, a registry name or
            ``None`` for the default), or a :class:`PoolSpec`.
        size: env copies (slots).
        backend: ``"thread"``, ``"process"`` or ``"ray"``.
        workers: worker threads/processes/actors (the ``thread`` backend defaults to 1).
        group_size: GRPO group size; slots per worker are rounded up to a multiple of it so a
            group never straddles two workers (and its tool calls hit one cache).
        reward: overrides ``env_kwargs["reward"]``. A reward the pool builds (from a name, a config
            or ``None``) is the pool's: :meth:`close` closes it (a Ray-held ARMed state is let go);
            a reward object passed in stays the caller's to close.
        backend_options: for the backend (``process``: ``start_method``, ``image_views``, ...;
            ``ray``: ``cpus_per_worker``, ``worker_resources`` -- custom resources per worker, e.g.
            one node's, to place workers on nodes).
    """

    def __init__(self, env_kwargs: Mapping[str, Any] | PoolSpec, size: int, backend: str = "thread",
                 workers: int | None = None, group_size: int = 1, reward: Any = None,
                 **backend_options: Any) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"expected a pool size >= 1, got {size!r}")
        if backend not in BACKENDS:
            raise ConfigError(unknown_name_message("pool backend", backend, BACKENDS))
        workers = (1 if backend == "thread" else 2) if workers is None else workers
        if not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"expected workers >= 1, got {workers!r}")
        if not isinstance(group_size, int) or group_size < 1:
            raise ConfigError(f"expected group_size >= 1, got {group_size!r}")
        from medvqa_env.services import builds_reward, resolve_reward

        self.spec, reward_arg = resolve_spec(env_kwargs)
        self.dataset = self.spec.env_kwargs["dataset"]
        reward_arg = reward if reward is not None else reward_arg
        self.reward = resolve_reward(reward_arg)
        self._owns_reward = builds_reward(reward_arg)
        self.size, self.backend = size, backend
        self.n_workers = min(workers, size)
        per = -(-size // self.n_workers)
        self.slots_per_worker = -(-per // group_size) * group_size
        self.n_workers = -(-size // self.slots_per_worker)
        self._reward_lock = threading.Lock()
        self._owner = ThreadPoolExecutor(1, thread_name_prefix="medvqa-pool")
        try:
            self._workers = self._start_backend(backend_options)
        except BaseException:
            self._owner.shutdown(wait=False)
            if self._owns_reward:
                from medvqa_env.services import close_reward

                close_reward(self.reward)
            raise
        self._closed = False

    def _start_backend(self, options: Mapping[str, Any]):
        if self.backend == "thread":
            return ThreadWorkers(self.spec, self.n_workers, self.slots_per_worker, **options)
        from medvqa_env import pool_backends

        cls = pool_backends.ProcessWorkers if self.backend == "process" else pool_backends.RayWorkers
        return cls(self.spec, self.n_workers, self.slots_per_worker, **options)

    # ---- services --------------------------------------------------------------------------
    def end_batch(self, batch_id: Any = None) -> dict[str, Any]:
        """The end of a training batch: the reward's adaptive state moves once; returns what moved."""
        with self._reward_lock:
            return self.reward.end_batch(batch_id) if hasattr(self.reward, "end_batch") else {}

    def state_dict(self) -> dict[str, Any]:
        """The group's reward state (ARMed thresholds and buffers), for checkpoints."""
        with self._reward_lock:
            return {"reward": self.reward.state_dict() if hasattr(self.reward, "state_dict") else {}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "reward" not in state:
            raise ValueError(f"expected a pool state with 'reward', got keys {sorted(state)!r}")
        with self._reward_lock:
            if hasattr(self.reward, "load_state_dict"):
                self.reward.load_state_dict(state["reward"])

    def score(self, results: Sequence[dict[str, Any]]) -> None:
        """Score, in one reward call, every result whose episode ended (``info["reward_input"]``)."""
        from medvqa_env.env import apply_reward

        ended = [r for r in results if r.get("kind") == "step" and "reward_input" in r.get("info", {})]
        if not ended:
            return
        samples = [r["info"].pop("reward_input") for r in ended]
        with self._reward_lock:
            outputs = self.reward(samples)
        for r, out in zip(ended, outputs):
            r["reward"] = apply_reward(r["info"], out)

    @property
    def tool_names(self) -> list[str]:
        """The tools the copies offer (from the config; no toolbox is built for this)."""
        from tool_backends.config import load_tool_config

        return list(load_tool_config(self.spec.env_kwargs.get("tools")))

    # ---- worker commands (the evaluation harness) ------------------------------------------
    @property
    def busy(self) -> list[bool]:
        return self._workers.busy

    def submit(self, worker: int, commands: list[tuple]) -> None:
        """Send a command list to an idle worker (see :class:`EnvWorker` for the commands)."""
        if self._workers.busy[worker]:
            raise RuntimeError(f"worker {worker} is busy; poll() before submitting again")
        self._workers.submit(worker, list(commands))

    def poll(self) -> list[tuple[int, list[dict[str, Any]] | None]]:
        """Wait until a busy worker answers; every answer that is ready, scored, as ``(worker,
        results)``. A worker that died answers ``None`` once (it is restarted)."""
        answers = self._workers.poll()
        self.score([r for _, results in answers if results for r in results])
        return answers

    def tool_cache_stats(self, per_worker: bool = False) -> dict[str, Any]:
        """Tool-cache hits and misses summed over the workers (a miss is a call a tool really ran).

        ``per_worker``: ``{worker: {"hits", "misses", "entries", "node", "pid"}}`` instead, where
        ``node`` is the Ray node id (the host name outside Ray): each worker has its own cache."""
        def ask() -> list:
            for w in range(self.n_workers):
                self._workers.submit(w, [("stats",)])
            answers: list = []
            while len(answers) < self.n_workers:
                answers += self._workers.poll()
            return answers

        stats = {w: (results or [{}])[0] for w, results in self._owner.submit(ask).result()}
        if per_worker:
            return {w: {**r.get("tool_cache", {}), "node": r.get("node"), "pid": r.get("pid")}
                    for w, r in sorted(stats.items())}
        total = {"hits": 0, "misses": 0, "entries": 0}
        for r in stats.values():
            for k in total:
                total[k] += r.get("tool_cache", {}).get(k, 0)
        return total

    # ---- slots (trainers, vector envs) -----------------------------------------------------
    def locate(self, slot: int) -> tuple[int, int]:
        """``(worker, local slot)`` of a slot: contiguous blocks, so a group stays on one worker."""
        if not 0 <= slot < self.size:
            raise ConfigError(f"expected a slot in 0..{self.size - 1}, got {slot!r}")
        return divmod(slot, self.slots_per_worker)

    def reset(self, requests: Sequence[ResetRequest]) -> list[tuple[dict, dict]]:
        """Reset slots ``0..len(requests)-1``; ``requests[k] = (seed, options)``. Returns
        ``(obs, info)`` per slot; a slot that failed raises its error."""
        if len(requests) > self.size:
            raise ConfigError(f"expected at most {self.size} env slots (the pool size), got {len(requests)}")
        return self.reset_slots(dict(enumerate(requests)))

    def reset_slots(self, requests: Mapping[int, ResetRequest]) -> list[tuple[dict, dict]]:
        """Reset the named slots (``{slot: (seed, options)}``); ``(obs, info)`` in the same order."""
        commands = {s: ("reset", self.locate(s)[1], seed, dict(opts or {})) for s, (seed, opts) in requests.items()}
        results = self._owner.submit(self._run_slots, commands).result()  # one thread drives the workers
        return [_raise_error(results[s], s) for s in requests]

    def step_async(self, actions: Mapping[int, Any]) -> Future:
        """Step the named slots in the background; ``.result()`` maps slot -> step result."""
        commands = {s: ("step", self.locate(s)[1], a) for s, a in dict(actions).items()}
        return self._owner.submit(lambda: {s: _raise_error(r, s) for s, r in self._run_slots(commands).items()})

    def step(self, actions: Mapping[int, Any]) -> dict[int, StepResult]:
        return self.step_async(actions).result()

    def _run_slots(self, commands: Mapping[int, tuple]) -> dict[int, dict[str, Any]]:
        by_worker: dict[int, list[int]] = {}
        for s in sorted(commands):
            by_worker.setdefault(self.locate(s)[0], []).append(s)
        for w, slots in by_worker.items():
            self._workers.submit(w, [commands[s] for s in slots])
        results: dict[int, dict[str, Any]] = {}
        pending = set(by_worker)
        while pending:
            for w, answer in self._workers.poll():
                pending.discard(w)
                for k, s in enumerate(by_worker[w]):
                    results[s] = answer[k] if answer is not None else {
                        "error": {"kind": "worker_crash", "message": f"env worker {w} died during this command"}}
        self.score(list(results.values()))
        return results

    def close(self) -> None:
        """Stop the workers and close a reward the pool built (see ``reward``)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._owner.shutdown(wait=True)
        try:
            self._workers.close()
        finally:
            if self._owns_reward:
                from medvqa_env.services import close_reward

                close_reward(self.reward)

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # a pool left open still frees its workers and shared memory
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass


def _raise_error(result: dict[str, Any], slot: int):
    """A slot result as the Gymnasium tuple, or the slot's error raised (trainers and vector envs
    treat a broken env as a bug; the harness uses :meth:`EnvPool.poll` and keeps errors as data)."""
    if "error" in result:
        err = result["error"]
        cls = DatasetError if err["kind"] == "dataset_error" else RuntimeError
        raise cls(f"env slot {slot}: {err['message']}")
    if result["kind"] == "reset":
        return result["obs"], result["info"]
    return result["obs"], result["reward"], result["terminated"], result["truncated"], result["info"]
