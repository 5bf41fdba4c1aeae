"""Vectorised copies of :class:`MedVQAEnv` through Gymnasium's own vector envs.

Text observations and variable-size images cannot live in shared memory, and episodes end at
different turns, so the defaults here are ``shared_memory=False`` and ``SAME_STEP`` autoreset (a
finished copy's final observation/info are in ``info["final_obs"]``/``info["final_info"]`` and
it restarts in the same call). A GRPO group is n copies on one question::

    venv = make_vec_env(8, mode="async", dataset="embedded")
    obs, info = venv.reset(seed=[0] * 8, options={"index": 17})   # 8 identical episodes
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from medvqa_env.errors import ConfigError

MODES = ("sync", "async")


def make_vec_env(num_envs: int, mode: str = "sync", autoreset: str = "same_step", **env_kwargs: Any) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``MedVQA-v0`` built with ``env_kwargs``; ``mode`` is sync or async."""
    if mode not in MODES:
        raise ConfigError(f"expected mode in {MODES}, got {mode!r}")
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ConfigError(f"expected num_envs >= 1, got {num_envs!r}")
    modes = {m.name.lower(): m for m in AutoresetMode}
    if autoreset not in modes:
        raise ConfigError(f"expected autoreset in {sorted(modes)}, got {autoreset!r}")
    autoreset_mode = modes[autoreset]
    vector_kwargs: dict[str, Any] = {"autoreset_mode": autoreset_mode}
    if mode == "async":
        vector_kwargs["shared_memory"] = False
    import medvqa_env  # noqa: F401  (registers MedVQA-v0)

    return gym.make_vec("MedVQA-v0", num_envs=num_envs, vectorization_mode=mode, vector_kwargs=vector_kwargs, **env_kwargs)
