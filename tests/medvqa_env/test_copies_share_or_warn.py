"""Every way of making copies either shares the run's reward state and reaches ``end_batch``, or
says that each copy scores alone: Gymnasium's own sync/async vector envs, the pooled vector env
(a group on one worker by default), and pools whose ARMed state lives in a Ray actor per run."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest

import medvqa_env  # noqa: F401  (registers MedVQA-v0)
from medvqa_env.services import EnvServices
from medvqa_env.vector import ScoresAloneWarning, reward_state_stores

SEGMENT = '<tool_call>{"name": "segment", "arguments": {"bbox": [20, 50, 40, 70]}}</tool_call>'
OPEN = 2  # tiny_dataset's OPEN record ("left")


def _make_vec(mode, tiny_dataset, **kwargs):
    if "services" not in kwargs:
        kwargs["tools"] = []
    return gym.make_vec("MedVQA-v0", 3, vectorization_mode=mode, dataset=tiny_dataset,
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **kwargs)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_gymnasium_vector_copies_with_adaptive_state_warn_that_they_score_alone(tiny_dataset, mode):
    with pytest.warns(ScoresAloneWarning, match=f"{mode} vector env each score alone.*services.end_batch"):
        venv = _make_vec(mode, tiny_dataset, reward="default")
    venv.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScoresAloneWarning)
        _make_vec(mode, tiny_dataset, reward="rule").close()              # stateless: nothing to share


def test_sync_copies_handed_services_share_the_reward_and_reach_end_batch(tiny_dataset):
    pytest.importorskip("bert_score")
    services = EnvServices.build(tools=[], reward="default")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScoresAloneWarning)
        venv = _make_vec("sync", tiny_dataset, services=services)
    try:
        assert len({id(e.unwrapped.reward_fn) for e in venv.envs}) == 1
        venv.reset(seed=[0, 0, 0], options={"index": OPEN})
        _, first, *_ = venv.step([r"\boxed{left}", r"\boxed{right kidney}", r"\boxed{left}"])
        assert first[0] == first[2] != first[1]
        t0 = services.state_dict()["reward"]["OPEN"]["thresholds"]["thresholds"]["cosine"]
        moved = services.end_batch(0)["OPEN"]["thresholds"]["cosine"]  # all three copies' scores, one move
        assert moved != t0 and services.end_batch(0)["OPEN"]["thresholds"]["cosine"] == moved
        venv.reset(seed=[0, 0, 0], options={"index": OPEN})
        _, after, *_ = venv.step([r"\boxed{left}"] * 3)
        assert len(set(after.tolist())) == 1 and after[0] != first[0]    # every copy sees the moved thresholds
    finally:
        venv.close()
        services.close()


def test_reward_state_stores_names_where_state_lives():
    from rewards import build_reward

    assert reward_state_stores(build_reward("rule")) == []
    assert reward_state_stores(build_reward("default+tools")) == ["local"]


def test_pooled_make_vec_keeps_a_group_on_one_worker_by_default(tiny_dataset):
    tools = {"segment": {"engine": "classical"}}
    with pytest.warns(UserWarning, match="one group"):
        venv = gym.make_vec("MedVQA-v0", 8, backend="process", workers=2, dataset=tiny_dataset, tools=tools,
                            reward="rule")
    try:
        assert venv.pool.n_workers == 1
        venv.reset(seed=[0] * 8, options={"index": 0})
        venv.step([SEGMENT] * 8)
        assert venv.pool.tool_cache_stats()["misses"] == 1               # the group's call ran once
    finally:
        venv.close()
    spread = gym.make_vec("MedVQA-v0", 8, backend="process", workers=2, group_size=4, dataset=tiny_dataset,
                          tools=tools, reward="rule")
    try:
        assert spread.pool.n_workers == 2 and spread.pool.locate(3)[0] == 0 and spread.pool.locate(4)[0] == 1
    finally:
        spread.close()


def test_two_pools_in_one_ray_job_keep_separate_thresholds_and_close_their_actors(tiny_dataset):
    pytest.importorskip("bert_score")
    from medvqa_env.pool import EnvPool
    from medvqa_env.pool_backends import ensure_ray
    from rewards.adaptive_ray import held_actor_names

    ray = ensure_ray()
    try:
        reward = {"name": "default", "threshold_store": "ray"}
        pools = [EnvPool({"dataset": tiny_dataset, "tools": [], "reward": reward}, size=2) for _ in range(2)]
        names = [p.state_dict()["reward"]["OPEN"]["thresholds"]["actor"] for p in pools]
        assert names[0] != names[1] and set(names) <= set(held_actor_names())
        pools[0].reset([(0, {"index": OPEN})] * 2)
        pools[0].step({0: r"\boxed{left}", 1: r"\boxed{right}"})
        moved = pools[0].end_batch(0)["OPEN"]["thresholds"]
        assert moved != pools[1].state_dict()["reward"]["OPEN"]["thresholds"]["thresholds"]   # the other did not move
        assert pools[1].end_batch(0)["OPEN"]["thresholds"] == {"bertscore": 0.5, "cosine": 0.5}  # it scored nothing
        for p in pools:
            p.close()
        assert not set(names) & set(held_actor_names())                  # no actor outlives its pool
    finally:
        ray.shutdown()
