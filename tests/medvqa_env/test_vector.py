"""Vectorised copies: the pool-backed vector env (the env's vector entry point) and Gymnasium's own
sync/async vector envs (async with its default shared memory)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import medvqa_env  # noqa: F401  (registers MedVQA-v0)
from medvqa_env.errors import ConfigError
from medvqa_env.vector import MedVQAVectorEnv

ZOOM = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [20, 50, 40, 70]}}</tool_call>'


def _make(mode: str, tiny_dataset, n: int = 3):
    kwargs = {"dataset": tiny_dataset, "reward": "rule", "tools": ["image_zoom_in"]}
    if mode in ("thread", "process"):
        return gym.make_vec("MedVQA-v0", n, backend=mode, workers=1 if mode == "thread" else 2, group_size=1, **kwargs)
    return gym.make_vec("MedVQA-v0", n, vectorization_mode=mode,
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **kwargs)


@pytest.mark.parametrize("mode", ["thread", "process", "sync", "async"])
def test_group_of_copies_runs_identical_episodes(tiny_dataset, mode):
    venv = _make(mode, tiny_dataset)
    try:
        assert isinstance(venv, MedVQAVectorEnv) == (mode in ("thread", "process"))
        obs, info = venv.reset(seed=[5, 5, 5], options={"index": 0})
        assert list(info["record_id"]) == ["t_closed"] * 3
        assert len(set(obs["text"])) == 1 and len(obs["images"][0]) == 1
        obs, reward, terminated, truncated, info = venv.step((ZOOM, ZOOM, r"\boxed{no}"))
        assert list(terminated) == [False, False, True] and list(reward) == [0.0, 0.0, -1.0]
        crops = [imgs[0] for imgs in obs["images"][:2]]
        assert crops[0].shape == crops[1].shape and np.array_equal(crops[0], crops[1])
        assert "Zoomed" in obs["text"][0]
        # the finished copy restarted in the same step; its last info is kept
        assert info["final_info"]["end_reason"][2] == "answer"
        obs, reward, terminated, *_ = venv.step((r"\boxed{yes}", r"\boxed{no}", ZOOM))
        assert list(reward[:2]) == [1.0, -1.0] and list(terminated[:2]) == [True, True]
    finally:
        venv.close()


def test_async_shared_memory_refuses_what_does_not_fit_with_the_way_out():
    from medvqa_env.shared_obs import SharedSlots, write_text

    slots = SharedSlots(2, 64)
    write_text(slots, 1, "fits")
    with pytest.raises(ValueError, match="shared_memory': False"):
        write_text(slots, 0, "x" * 100)


def test_bad_vector_arguments(tiny_dataset):
    with pytest.raises(ConfigError, match="Did you mean"):
        gym.make_vec("MedVQA-v0", 2, backend="threads", dataset=tiny_dataset)
    with pytest.raises(ConfigError, match="num_envs"):
        MedVQAVectorEnv(0, dataset=tiny_dataset)
