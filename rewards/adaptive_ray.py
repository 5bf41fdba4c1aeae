"""One owner for a run's ARMed thresholds across Ray workers and nodes: a named actor per run.

Every copy of an :class:`rewards.armed.ARMedReward` built with ``threshold_store="ray"`` -- the
run's own object and the pickled copies inside workers, on any node of the cluster -- talks to one
actor, found by name. The name is the run's: a :class:`RayThresholds` built without one gets a
fresh ``medvqa-armed-thresholds-<random>``, so two pools, envs or trainers in one Ray job never move
each other's thresholds unless they are given the same name (``ray_actor_name``). The name is in the
reward's config and in :meth:`RayThresholds.state_dict`.

The actor runs one call at a time, with the semantics of the in-process
:class:`rewards.adaptive.AdaptiveThresholds`: scoring reads :meth:`~RayThresholds.current` and queues
raw values with ``observe``; only ``end_batch`` moves a threshold, and ``end_batch(batch_id)``
ignores an id not newer than the last, so every worker of a step may announce the step's end and the
thresholds still move once.

Lifetime: the object built in user code (a *holder*, not a pickled copy) creates the actor, or
attaches to the one of that name. The actor is an ordinary (not detached) actor owned by the
process that created it: it ends when that process ends, when its holders there are closed
(:meth:`RayThresholds.close`, which :meth:`medvqa_env.pool.EnvPool.close` calls) or garbage
collected -- nothing outlives the run. A pickled copy only borrows it; if the owner is gone, the
copy's next call raises instead of silently starting a fresh, empty state.
"""

from __future__ import annotations

import os
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rewards.adaptive import AdaptiveConfig, AdaptiveThresholds

ACTOR_PREFIX = "medvqa-armed-thresholds"


def run_actor_name(prefix: str = ACTOR_PREFIX) -> str:
    """A fresh actor name: one run's state, shared with nobody who was not handed the name.

    >>> run_actor_name() != run_actor_name() and run_actor_name().startswith(ACTOR_PREFIX)
    True
    """
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def job_actor_name(prefix: str = ACTOR_PREFIX) -> str:
    """One name per Ray job (``<prefix>-job-<job id>``), for processes that each build the run's
    reward from the same config rather than receive a pickled copy (verl's workers): every process
    of the job finds the same actor, another job never does. Needs Ray initialised."""
    import ray

    return f"{prefix}-job-{ray.get_runtime_context().get_job_id()}"


class _ThresholdOwner:
    """The actor body: an :class:`AdaptiveThresholds` behind remote methods."""

    def __init__(self, config: AdaptiveConfig, metrics: Sequence[str], creator: str = "") -> None:
        self.inner = AdaptiveThresholds(config, metrics)
        self.creator = creator

    def created_by(self) -> str:
        return self.creator

    def where(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def current(self) -> dict[str, float]:
        return self.inner.current()

    def observe(self, values: Mapping[str, Sequence[float]]) -> None:
        self.inner.observe(values)

    def end_batch(self, batch_id: Any = None) -> dict[str, float]:
        return self.inner.end_batch(batch_id)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inner.load_state_dict(state)


# ---------------------------------------------------------------------------------------------
# The actors this process holds: (namespace, name) -> handle and the holders open here
# ---------------------------------------------------------------------------------------------
@dataclass
class _Held:
    handle: Any
    created_here: bool
    holders: set[str] = field(default_factory=set)


_HELD: dict[tuple[str, str | None, str], _Held] = {}  # (Ray session, namespace, name)
_LOCK = threading.Lock()


def _attach(key: tuple[str, str | None, str], holder: str, config: AdaptiveConfig, metrics: Sequence[str]) -> Any:
    import ray

    with _LOCK:
        held = _HELD.get(key)
        if held is None:
            _, namespace, name = key
            token = f"{os.getpid()}-{uuid.uuid4().hex}"
            actor_cls = ray.remote(num_cpus=0, max_concurrency=1)(_ThresholdOwner)
            handle = actor_cls.options(name=name, namespace=namespace, get_if_exists=True).remote(
                config, tuple(metrics), token)
            created = ray.get(handle.created_by.remote()) == token
            held = _HELD[key] = _Held(handle, created)
        held.holders.add(holder)
        return held.handle


def _detach(key: tuple[str, str | None, str], holder: str) -> None:
    """Forget ``holder``; the last holder of an actor this process created kills it."""
    with _LOCK:
        held = _HELD.get(key)
        if held is None or holder not in held.holders:
            return
        held.holders.discard(holder)
        if held.holders:
            return
        del _HELD[key]
    if held.created_here:
        try:
            import ray

            if ray.is_initialized():
                ray.kill(held.handle)
        except Exception:  # noqa: BLE001 -- interpreter shutdown or a cluster already gone
            pass


def held_actor_names() -> list[str]:
    """Names of the threshold actors this process holds open (for tests and leak checks)."""
    with _LOCK:
        return sorted(name for _, _, name in _HELD)


class RayThresholds:
    """Same interface as :class:`AdaptiveThresholds`, state held by the actor ``name``.

    ``name=None`` gives the run its own actor (:func:`run_actor_name`); the same name given to two
    objects means one shared state. Needs ``ray.init(...)`` before the first call (the actor is
    created then, or at once if Ray is up); a copy pickled to a worker finds the actor by name.
    """

    def __init__(self, config: AdaptiveConfig | None = None, metrics: Sequence[str] = ("bertscore", "cosine"),
                 name: str | None = None, namespace: str | None = None) -> None:
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"expected a non-empty actor name or None, got {name!r}")
        self.config = config or AdaptiveConfig()
        self.metrics = tuple(metrics)
        self.name = name or run_actor_name()
        self.namespace = namespace
        self._holder: str | None = uuid.uuid4().hex  # None in pickled copies: they only borrow
        self._actor = None
        self._finalizer: Any = None
        if _ray_up():
            self._handle()

    @property
    def _key(self) -> tuple[str, str | None, str]:
        import ray

        # the Ray session too: a handle held from an earlier ray.init() is dead in the next one
        context = ray.get_runtime_context()
        return (f"{context.get_node_id()}/{context.get_job_id()}", self.namespace, self.name)

    def __getstate__(self) -> dict[str, Any]:
        if self._holder is not None and self._actor is None and _ray_up():
            self._handle()  # the holder's process owns the actor before any copy travels
        return {**self.__dict__, "_actor": None, "_holder": None, "_finalizer": None}

    def _handle(self):
        if self._actor is not None:
            return self._actor
        if not _ray_up():
            raise RuntimeError("threshold_store='ray' needs ray.init(...) before the first reward call")
        if self._holder is not None:
            key = self._key
            self._actor = _attach(key, self._holder, self.config, self.metrics)
            if self._finalizer is None:  # collected without close(): let go all the same
                self._finalizer = weakref.finalize(self, _detach, key, self._holder)
            return self._actor
        import ray

        try:
            self._actor = ray.get_actor(self.name, namespace=self.namespace)
        except ValueError:
            raise RuntimeError(f"the reward state actor {self.name!r} does not exist: the run that owns it was "
                               "closed or has not started it") from None
        return self._actor

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        try:
            return ray.get(getattr(self._handle(), method).remote(*args))
        except ray.exceptions.RayActorError as e:
            self._actor = None
            raise RuntimeError(f"the reward state actor {self.name!r} is gone (its owner process ended or closed "
                               f"the run): {type(e).__name__}") from e

    def current(self) -> dict[str, float]:
        return self._call("current")

    def observe(self, values: Mapping[str, Sequence[float]]) -> None:
        # blocking, so a trainer's end_batch after the rollouts cannot overtake a worker's values
        self._call("observe", {k: list(map(float, v)) for k, v in values.items()})

    def end_batch(self, batch_id: Any = None) -> dict[str, float]:
        return self._call("end_batch", batch_id)

    @property
    def thresholds(self) -> dict[str, float]:
        return self.current()

    def where(self) -> dict[str, Any]:
        """The node id and process of the actor (where the run's state lives)."""
        return self._call("where")

    def state_dict(self) -> dict[str, Any]:
        return {**self._call("state_dict"), "store": "ray", "actor": self.name, "namespace": self.namespace}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._call("load_state_dict", dict(state))

    def close(self) -> None:
        """Let go of the actor. The run's last holder in the process that created it kills it; a
        holder used again afterwards starts a fresh one."""
        if self._finalizer is not None:
            self._finalizer()  # _detach, once
            self._finalizer = None
        self._actor = None


def _ray_up() -> bool:
    import sys

    ray = sys.modules.get("ray")  # not imported means not initialised
    return bool(ray is not None and ray.is_initialized())
