"""Vectorised copies (sync and async) and GRPO groups of identical episodes."""

from __future__ import annotations

import numpy as np
import pytest

from medvqa_env.errors import ConfigError
from medvqa_env.vector import make_vec_env
from rewards import RuleReward

ZOOM = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [20, 50, 40, 70]}}</tool_call>'


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_group_of_copies_runs_identical_episodes(tiny_dataset, mode):
    venv = make_vec_env(3, mode=mode, dataset=tiny_dataset, reward=RuleReward())
    try:
        obs, info = venv.reset(seed=[5, 5, 5], options={"index": 0})
        assert list(info["record_id"]) == ["t_closed"] * 3
        assert len(set(obs["text"])) == 1
        obs, reward, terminated, truncated, info = venv.step((ZOOM, ZOOM, r"\boxed{no}"))
        assert list(terminated) == [False, False, True] and list(reward) == [0.0, 0.0, -1.0]
        crops = [imgs[0] for imgs in obs["images"][:2]]
        assert np.array_equal(crops[0], crops[1])
        # the finished copy restarted in the same step; its last info is kept
        assert info["final_info"]["end_reason"][2] == "answer"
        obs, reward, terminated, *_ = venv.step((r"\boxed{yes}", r"\boxed{no}", ZOOM))
        assert list(reward[:2]) == [1.0, -1.0] and list(terminated[:2]) == [True, True]
    finally:
        venv.close()


def test_bad_vector_arguments(tiny_dataset):
    with pytest.raises(ConfigError, match="mode"):
        make_vec_env(2, mode="threads", dataset=tiny_dataset)
    with pytest.raises(ConfigError, match="num_envs"):
        make_vec_env(0, dataset=tiny_dataset)
