"""ARMed thresholds across real Ray workers: one named actor owns the buffers."""

from __future__ import annotations

import pickle
import uuid

import pytest

from medvqa_env.records import AnswerType
from rewards.adaptive import AdaptiveConfig, AdaptiveThresholds
from rewards.adaptive_ray import RayThresholds
from rewards.base import RewardInput

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_needs_ray_init():
    if ray.is_initialized():
        pytest.skip("ray already initialised in this process")
    with pytest.raises(RuntimeError, match="ray.init"):
        RayThresholds(name=f"t-{uuid.uuid4().hex}").step({"cosine": [0.5]})


def test_workers_share_one_owner_and_state_replays(ray_session):
    store = RayThresholds(AdaptiveConfig(delta_max=0.05), name=f"t-{uuid.uuid4().hex}")
    assert pickle.loads(pickle.dumps(store))._actor is None      # ships by name, not by handle

    @ray.remote(num_cpus=0)
    def contribute(handle, values):
        return [handle.step({"cosine": [v], "bertscore": [v]}) for v in values]

    a = [0.9, 0.8, 0.95, 0.85]
    b = [0.1, 0.2, 0.15, 0.05]
    used = ray.get([contribute.remote(store, a), contribute.remote(store, b)])
    state = store.state_dict()
    assert sorted(state["buffers"]["cosine"]) == sorted(a + b)    # nothing lost, nothing doubled
    assert state["updates"] == 8
    # the actor's history is one sequential order: replaying it locally gives the same thresholds
    replay = AdaptiveThresholds(AdaptiveConfig(delta_max=0.05))
    for v in state["buffers"]["cosine"]:
        replay.step({"cosine": [v], "bertscore": [v]})
    assert replay.peek() == pytest.approx(store.peek())
    assert len(used[0]) == len(used[1]) == 4
    store.close()
    assert store.state_dict()["buffers"]["cosine"] == []          # closed: a new, empty owner
    store.close()


def test_armed_reward_in_a_worker_updates_the_drivers_state(ray_session):
    from rewards.armed import ARMedReward

    name = f"armed-{uuid.uuid4().hex}"
    reward = ARMedReward(threshold_store="ray", ray_actor_name=name)

    @ray.remote(num_cpus=1)
    def score(r):
        batch = [RewardInput(r"\boxed{left lung}", "left lung", "left lung", AnswerType.OPEN)] * 4
        return [o.total for o in r(batch)]

    worker_totals = ray.get(score.remote(reward))                  # the pickled copy reloads MiniLM
    assert len(reward.state_dict()["thresholds"]["buffers"]["cosine"]) == 4
    assert reward.thresholds.peek()["cosine"] == pytest.approx(0.51)
    restored = ARMedReward(threshold_store="ray", ray_actor_name=f"{name}-restored")
    restored.load_state_dict(reward.state_dict())
    assert restored.state_dict()["thresholds"] == reward.state_dict()["thresholds"]
    assert all(t > 0.9 for t in worker_totals)
    reward.thresholds.close()
    restored.thresholds.close()
