"""Vectorised copies of :class:`MedVQAEnv`: a Gymnasium ``VectorEnv`` over :class:`EnvPool`.

``gym.make_vec("MedVQA-v0", n)`` builds this (it is the env's ``vector_entry_point``): n copies that
share one reward (one set of ARMed thresholds, moved by :meth:`MedVQAVectorEnv.end_batch`) and one
toolbox per worker, so a GRPO group is n copies on one question::

    venv = gym.make_vec("MedVQA-v0", 8, dataset="embedded", backend="process")
    obs, info = venv.reset(seed=[0] * 8, options={"index": 17})   # 8 identical episodes
    obs, rewards, terminated, truncated, info = venv.step(turns)
    venv.end_batch(step)                                          # the batch boundary

The n copies are one group unless ``group_size`` says otherwise, so by default they all sit on one
worker (a tool call the group makes runs once); ``group_size=k`` places groups of k copies on
separate workers. Episodes end at different turns, so autoreset is ``SAME_STEP``: a finished copy
restarts in the same call, and its last observation and info are in ``info["final_obs"]``/
``info["final_info"]``. Observations batch as tuples (texts; per copy a tuple of images).

Gymnasium's own ``vectorization_mode="sync"`` and ``"async"`` also work, and build each copy
through :func:`make_env`. Their copies share nothing unless handed something to share: a sync copy
given ``services=EnvServices.build(...)`` shares that reward and toolbox with its siblings (call
``services.end_batch(step)`` at the batch end); otherwise -- and always for async copies, which live
in their own processes -- each copy scores alone with its own adaptive reward state that nobody
moves, and :func:`make_env` warns (:class:`ScoresAloneWarning`) when the reward has such state.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from medvqa_env.env import MedVQAEnv
from medvqa_env.errors import ConfigError
from medvqa_env.pool import EnvPool
from medvqa_env.spaces import action_space, observation_space


class MedVQAVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` copies in an :class:`EnvPool` (``backend``: thread, process or ray).

    Every other keyword argument is a :class:`MedVQAEnv` argument (``reward`` is the copies' one
    reward object or name). ``group_size`` keeps each GRPO group's copies on one worker (default:
    all ``num_envs`` copies are one group); ``close()`` also closes a reward the pool built.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, backend: str = "thread", workers: int | None = None,
                 group_size: int | None = None, **env_kwargs: Any) -> None:
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise ConfigError(f"expected num_envs >= 1, got {num_envs!r}")
        env_kwargs.pop("max_episode_steps", None)  # Gymnasium's make_vec passes the spec's (None)
        if env_kwargs.pop("render_mode", None) is not None:
            raise ConfigError("expected render_mode=None for a vector env; render single envs instead")
        if group_size is None:  # the copies of one reset are one GRPO group: keep them on one worker
            group_size = num_envs
            if workers is not None and workers > 1 and num_envs > 1:
                warnings.warn(f"workers={workers}, but the {num_envs} copies are one group (group_size defaults "
                              f"to num_envs) and run on one worker; pass group_size=k to place groups of k "
                              "copies on separate workers", stacklevel=2)
        self.num_envs = num_envs
        self.pool = EnvPool(env_kwargs, size=num_envs, backend=backend, workers=workers, group_size=group_size)
        self.single_observation_space = observation_space(max_text_chars=1 << 22,
                                                          max_image_side=int(env_kwargs.get("max_image_side", 4096)))
        self.single_action_space = action_space(int(env_kwargs.get("max_action_chars", 65_536)))
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._seed_next: list[int | None] = [None] * num_envs

    # -------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: Mapping[str, Any] | None = None):
        """``seed``: one int (copy ``i`` gets ``seed + i``) or one per copy; ``options`` go to every copy
        (``{"index": i}`` puts all copies on record ``i``: a GRPO group)."""
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds = [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ConfigError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        results = self.pool.reset([(s, dict(options or {})) for s in seeds])
        infos: dict[str, Any] = {}
        for i, (_, info) in enumerate(results):
            infos = self._add_info(infos, info, i)
        return self._batch([obs for obs, _ in results]), infos

    def step(self, actions: Sequence[Any]):
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ConfigError(f"expected {self.num_envs} actions, got {len(actions)}")
        results = self.pool.step(dict(enumerate(actions)))
        finished = [i for i in range(self.num_envs) if results[i][2] or results[i][3]]
        restarted = dict(zip(finished, self.pool.reset_slots({i: (None, None) for i in finished}))) if finished else {}
        observations, rewards, terminated, truncated, infos = [], [], [], [], {}
        for i in range(self.num_envs):
            obs, reward, term, trunc, info = results[i]
            if i in restarted:
                info = {**restarted[i][1], "final_obs": obs, "final_info": info}
                obs = restarted[i][0]
            observations.append(obs)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            infos = self._add_info(infos, info, i)
        return (self._batch(observations), np.array(rewards, dtype=np.float64), np.array(terminated, dtype=np.bool_),
                np.array(truncated, dtype=np.bool_), infos)

    def end_batch(self, batch_id: Any = None) -> dict[str, Any]:
        """The end of a training batch: the copies' shared reward state moves once."""
        return self.pool.end_batch(batch_id)

    def state_dict(self) -> dict[str, Any]:
        return self.pool.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.pool.load_state_dict(state)

    def close_extras(self, **kwargs: Any) -> None:
        self.pool.close()

    @staticmethod
    def _batch(observations: Sequence[Mapping[str, Any]]) -> dict[str, tuple]:
        return {"text": tuple(o["text"] for o in observations), "images": tuple(tuple(o["images"]) for o in observations)}


# ==============================================================================================
# Gymnasium's own sync/async vector envs: share what is handed in, or say that each copy is alone
# ==============================================================================================
class ScoresAloneWarning(UserWarning):
    """A copy made by Gymnasium's SyncVectorEnv/AsyncVectorEnv has its own adaptive reward state."""


_GYM_VECTOR_MODULES = {"gymnasium.vector.sync_vector_env": "sync", "gymnasium.vector.async_vector_env": "async"}


def make_env(**kwargs: Any):
    """The env's Gymnasium ``entry_point``: :class:`MedVQAEnv` (``**kwargs`` are its arguments).

    When Gymnasium's own vector envs build the copy (``gym.make_vec(..., vectorization_mode=
    "sync"|"async")``), it checks that the copies share the run's reward state: a sync copy built
    with ``services=`` shares it; any other copy whose reward has adaptive state (ARMed's
    thresholds) scores alone, and a :class:`ScoresAloneWarning` says so and names the ways out.
    """
    env = MedVQAEnv(**kwargs)
    mode = _built_by_gym_vector()
    if mode is not None and not (mode == "sync" and kwargs.get("services") is not None):
        stores = reward_state_stores(env.reward_fn)
        if stores:
            warnings.warn(
                f"MedVQA-v0 copies made by Gymnasium's {mode} vector env each score alone: every copy holds its own "
                f"reward state ({', '.join(stores)}) and nothing ends a batch, so ARMed's thresholds never move "
                "together. Use gym.make_vec('MedVQA-v0', n) (the pooled vector env; backend='process' for "
                "processes; venv.end_batch(step)), or for sync copies pass services=EnvServices.build(tools=..., "
                "reward=...) and call services.end_batch(step).", ScoresAloneWarning, stacklevel=2)
    return env


make_env.metadata = MedVQAEnv.metadata  # what gym.make checks render modes against


def _built_by_gym_vector(depth: int = 16) -> str | None:
    """``"sync"``/``"async"`` when the caller is Gymnasium's vector env building its copies (in the
    process that made it: an async worker process is not asked again)."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        mode = _GYM_VECTOR_MODULES.get(frame.f_globals.get("__name__", ""))
        if mode is not None:
            return mode if frame.f_code.co_name in ("__init__", "<listcomp>") else None
        frame = frame.f_back
    return None


def reward_state_stores(reward: Any) -> list[str]:
    """Where a reward's adaptive state lives, one entry per store in its ``state_dict``: ``"local"``
    (inside the object) or ``"ray:<actor>"``; empty for a stateless reward (rule, exact match).

    >>> from rewards import build_reward
    >>> reward_state_stores(build_reward("rule")), reward_state_stores(build_reward("default"))
    ([], ['local'])
    """
    try:
        state = reward.state_dict() if hasattr(reward, "state_dict") else {}
    except Exception as e:  # noqa: BLE001 -- e.g. a Ray-held state without Ray: still state
        return [f"unreadable ({type(e).__name__})"]
    return _stores(state)


def _stores(state: Any) -> list[str]:
    if not isinstance(state, Mapping):
        return []
    if "thresholds" in state and "buffers" in state:  # an adaptive store's own state
        return [f"ray:{state['actor']}" if state.get("store") == "ray" else "local"]
    out: list[str] = []
    for value in state.values():
        out += _stores(value)
    return out
