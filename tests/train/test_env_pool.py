"""Local and Ray env pools pass one shared suite (real Ray actors)."""

from __future__ import annotations

import numpy as np
import pytest

from medvqa_env.errors import ConfigError
from train.env_pool import make_pool

KWARGS = {"dataset": "embedded", "split": "test", "tools": {"image_zoom_in": "local"}, "max_turns": 1}
ZOOM = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 64, 64]}}</tool_call>'


@pytest.fixture(scope="module", params=["local", "ray"])
def pool(request):
    options = {"num_workers": 2} if request.param == "ray" else {}
    p = make_pool(request.param, KWARGS, size=4, **options)
    yield p
    p.close()
    if request.param == "ray":  # leave no Ray running for later test modules
        import ray

        ray.shutdown()


def test_same_seed_and_index_give_identical_episodes(pool):
    resets = pool.reset([(5, {"index": 7})] * 3 + [(5, {"index": 8})])
    ids = [info["record_id"] for _, info in resets]
    assert ids[0] == ids[1] == ids[2] != ids[3]
    assert all(np.array_equal(resets[0][0]["images"][0], r[0]["images"][0]) for r in resets[:3])


def test_steps_run_tools_and_rewards_in_the_pool(pool):
    pool.reset([(0, {"index": 1})] * 2)
    handle = pool.step_async({0: ZOOM, 1: "\\boxed{no}"})
    results = handle.result()
    obs0, r0, term0, trunc0, info0 = results[0]
    assert not term0 and info0["tool_calls"][0]["name"] == "image_zoom_in" and len(obs0["images"]) == 1
    _, r1, term1, _, info1 = results[1]
    assert term1 and info1["end_reason"] == "answer" and r1 in (-1.0, 1.0)
    results = pool.step({0: "\\boxed{yes}"})
    assert results[0][2] and set(results) == {0}


def test_slot_checks(pool):
    with pytest.raises(ConfigError, match="at most 4 env slots"):
        pool.reset([(0, None)] * 5)


def test_unknown_pool_kind():
    with pytest.raises(ConfigError, match="Did you mean 'ray'"):
        make_pool("rya", KWARGS, size=1)
