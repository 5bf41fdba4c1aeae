"""Pools of env copies for rollouts: in-process, or spread over Ray actors, behind one interface.

A pool holds ``size`` independent :class:`~medvqa_env.env.MedVQAEnv` copies built from keyword
arguments (no pickled env objects cross process boundaries: each actor builds its own). A GRPO
group is ``n`` slots reset to the same ``(seed, index)``, which gives identical episodes.

``step_async`` returns at once with a handle; tool calls and rewards then run beside generation
(in a thread for the local pool, in the actors for the Ray pool) until ``.result()`` is asked for.

>>> pool = LocalEnvPool({"dataset": "embedded", "split": "test", "tools": []}, size=2)
>>> [info["record_id"] for _, info in pool.reset([(0, {"index": 3}), (0, {"index": 3})])] == [pool.envs[0].record.id] * 2
True
>>> pool.close()
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Mapping, Protocol, Sequence

from medvqa_env.errors import ConfigError

StepResult = tuple[dict, float, bool, bool, dict]
ResetRequest = tuple["int | None", "dict[str, Any] | None"]  # (seed, options) for one slot


def make_env(env_kwargs: Mapping[str, Any]):
    """Build one env from plain keyword arguments (what every pool and actor calls)."""
    from medvqa_env.env import MedVQAEnv

    return MedVQAEnv(**dict(env_kwargs))


class StepHandle(Protocol):
    def result(self) -> dict[int, StepResult]: ...


class EnvPool(Protocol):
    """What :func:`train.rollout.collect_rollouts` needs from a pool."""

    size: int

    def reset(self, requests: Sequence[ResetRequest]) -> list[tuple[dict, dict]]:
        """Reset slots ``0..len(requests)-1``; returns ``(obs, info)`` per slot."""

    def step_async(self, actions: Mapping[int, str]) -> StepHandle:
        """Step the named slots; the handle's ``result()`` maps slot -> step result."""

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult]: ...

    def close(self) -> None: ...


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class LocalEnvPool:
    """Env copies in this process; ``step_async`` runs the steps in a background thread."""

    def __init__(self, env_kwargs: Mapping[str, Any], size: int, threads: int = 1) -> None:
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"expected a pool size >= 1, got {size!r}")
        self.env_kwargs = dict(env_kwargs)
        self.size = size
        first = make_env(self.env_kwargs)
        self.envs = [first] + [make_env(self.env_kwargs) for _ in range(size - 1)]
        self._executor = ThreadPoolExecutor(max_workers=max(1, threads)) if threads else None

    def reset(self, requests: Sequence[ResetRequest]) -> list[tuple[dict, dict]]:
        _check_slots(len(requests), self.size)
        return [self.envs[i].reset(seed=seed, options=dict(opts or {})) for i, (seed, opts) in enumerate(requests)]

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult]:
        _check_slots(max(actions, default=-1) + 1, self.size)
        return {i: self.envs[i].step(a) for i, a in actions.items()}

    def step_async(self, actions: Mapping[int, str]) -> StepHandle:
        actions = dict(actions)
        if self._executor is None:
            return _Done(self.step(actions))
        fut: Future = self._executor.submit(self.step, actions)
        return fut

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        for env in self.envs:
            env.close()


def _check_slots(n: int, size: int) -> None:
    if n > size:
        raise ConfigError(f"expected at most {size} env slots (the pool size), got {n}")


# ==============================================================================================
# Ray
# ==============================================================================================
def ensure_ray(num_cpus: int = 2):
    """Start a local Ray (no dashboard, token auth off) unless one is already up."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1",
                                           **({"MEDVQA_CACHE": os.environ["MEDVQA_CACHE"]}
                                              if "MEDVQA_CACHE" in os.environ else {})}})
    return ray


class _EnvWorker:
    """Several env copies in one actor process (plain class; wrapped by ``ray.remote``)."""

    def __init__(self, env_kwargs: Mapping[str, Any], n: int) -> None:
        self.envs = [make_env(env_kwargs) for _ in range(n)]

    def reset(self, requests):
        return [self.envs[i].reset(seed=s, options=dict(o or {})) for i, s, o in requests]

    def step(self, actions):
        return {i: self.envs[i].step(a) for i, a in actions.items()}

    def close(self):
        for env in self.envs:
            env.close()
        return True


class _RayHandle:
    def __init__(self, ray, refs, slot_maps):
        self._ray, self._refs, self._maps = ray, refs, slot_maps

    def result(self) -> dict[int, StepResult]:
        out: dict[int, StepResult] = {}
        for ref, mapping in zip(self._refs, self._maps):
            for local, res in self._ray.get(ref).items():
                out[mapping[local]] = res
        return out


class RayEnvPool:
    """``size`` env copies spread over ``num_workers`` Ray actors (slot ``i`` lives on actor
    ``i % num_workers``). Same interface as :class:`LocalEnvPool`."""

    def __init__(self, env_kwargs: Mapping[str, Any], size: int, num_workers: int = 2,
                 cpus_per_worker: float = 0.5) -> None:
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"expected a pool size >= 1, got {size!r}")
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"expected num_workers >= 1, got {num_workers!r}")
        self.ray = ensure_ray()
        self.size = size
        self.num_workers = min(num_workers, size)
        per = [len(range(w, size, self.num_workers)) for w in range(self.num_workers)]
        actor_cls = self.ray.remote(num_cpus=cpus_per_worker)(_EnvWorker)
        self.workers = [actor_cls.remote(dict(env_kwargs), n) for n in per]

    def _split(self, slots: Sequence[int]) -> list[list[int]]:
        buckets: list[list[int]] = [[] for _ in self.workers]
        for s in slots:
            buckets[s % self.num_workers].append(s)
        return buckets

    def reset(self, requests: Sequence[ResetRequest]) -> list[tuple[dict, dict]]:
        _check_slots(len(requests), self.size)
        buckets = self._split(range(len(requests)))
        refs = [w.reset.remote([(s // self.num_workers, *requests[s]) for s in b]) if b else None
                for w, b in zip(self.workers, buckets)]
        out: list[Any] = [None] * len(requests)
        for ref, b in zip(refs, buckets):
            if ref is not None:
                for s, res in zip(b, self.ray.get(ref)):
                    out[s] = res
        return out

    def step_async(self, actions: Mapping[int, str]) -> StepHandle:
        _check_slots(max(actions, default=-1) + 1, self.size)
        refs, maps = [], []
        for w, b in zip(self.workers, self._split(sorted(actions))):
            if b:
                refs.append(w.step.remote({s // self.num_workers: actions[s] for s in b}))
                maps.append({s // self.num_workers: s for s in b})
        return _RayHandle(self.ray, refs, maps)

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult]:
        return self.step_async(actions).result()

    def close(self) -> None:
        try:
            self.ray.get([w.close.remote() for w in self.workers])
        finally:
            for w in self.workers:
                self.ray.kill(w)
            self.workers = []


def make_pool(kind: str, env_kwargs: Mapping[str, Any], size: int, **options: Any) -> EnvPool:
    """``kind``: ``"local"`` or ``"ray"``."""
    if kind == "local":
        return LocalEnvPool(env_kwargs, size, **options)
    if kind == "ray":
        return RayEnvPool(env_kwargs, size, **options)
    from medvqa_env.errors import unknown_name_message

    raise ConfigError(unknown_name_message("env pool", kind, ["local", "ray"]))
