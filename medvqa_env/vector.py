"""Vectorised copies of :class:`MedVQAEnv`: a Gymnasium ``VectorEnv`` over :class:`EnvPool`.

``gym.make_vec("MedVQA-v0", n)`` builds this (it is the env's ``vector_entry_point``): n copies that
share one reward (one set of ARMed thresholds, moved by :meth:`MedVQAVectorEnv.end_batch`) and one
toolbox per worker, so a GRPO group is n copies on one question::

    venv = gym.make_vec("MedVQA-v0", 8, dataset="embedded", backend="process")
    obs, info = venv.reset(seed=[0] * 8, options={"index": 17})   # 8 identical episodes
    obs, rewards, terminated, truncated, info = venv.step(turns)
    venv.end_batch()                                              # the batch boundary

Episodes end at different turns, so autoreset is ``SAME_STEP``: a finished copy restarts in the
same call, and its last observation and info are in ``info["final_obs"]``/``info["final_info"]``.
Observations batch as tuples (texts; per copy a tuple of images). Gymnasium's own
``vectorization_mode="sync"`` and ``"async"`` also work, with copies that share nothing (each its
own reward object, thresholds frozen since nobody ends a batch) -- fine for rollouts and evaluation.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from medvqa_env.errors import ConfigError
from medvqa_env.pool import EnvPool
from medvqa_env.spaces import action_space, observation_space


class MedVQAVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` copies in an :class:`EnvPool` (``backend``: thread, process or ray).

    Every other keyword argument is a :class:`MedVQAEnv` argument (``reward`` is the copies' one
    reward object or name). ``group_size`` keeps each GRPO group's copies on one worker.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, backend: str = "thread", workers: int | None = None, group_size: int = 1,
                 **env_kwargs: Any) -> None:
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise ConfigError(f"expected num_envs >= 1, got {num_envs!r}")
        env_kwargs.pop("max_episode_steps", None)  # Gymnasium's make_vec passes the spec's (None)
        if env_kwargs.pop("render_mode", None) is not None:
            raise ConfigError("expected render_mode=None for a vector env; render single envs instead")
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
