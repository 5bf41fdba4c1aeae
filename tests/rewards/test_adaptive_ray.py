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
        RayThresholds(name=f"t-{uuid.uuid4().hex}").observe({"cosine": [0.5]})


def test_workers_share_one_owner_and_state_replays(ray_session):
    store = RayThresholds(AdaptiveConfig(delta_max=0.05), name=f"t-{uuid.uuid4().hex}")
    assert pickle.loads(pickle.dumps(store))._actor is None      # ships by name, not by handle

    @ray.remote(num_cpus=0)
    def contribute(handle, values):
        seen = []
        for v in values:
            seen.append(handle.current())
            handle.observe({"cosine": [v], "bertscore": [v]})
        return seen

    a = [0.9, 0.8, 0.95, 0.85]
    b = [0.1, 0.2, 0.15, 0.05]
    seen = ray.get([contribute.remote(store, a), contribute.remote(store, b)])
    assert all(s == {"bertscore": 0.5, "cosine": 0.5} for s in seen[0] + seen[1])  # one batch, one T
    # both workers announce the end of batch 0: the thresholds move once
    assert ray.get([ray.remote(num_cpus=0)(lambda h: h.end_batch(0)).remote(store) for _ in range(2)])
    state = store.state_dict()
    assert sorted(state["buffers"]["cosine"]) == sorted(a + b)    # nothing lost, nothing doubled
    assert state["updates"] == 1 and state["last_batch_id"] == 0
    replay = AdaptiveThresholds(AdaptiveConfig(delta_max=0.05))
    replay.observe({"cosine": a + b, "bertscore": a + b})
    assert replay.end_batch() == pytest.approx(store.current())
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
    assert len(reward.state_dict()["thresholds"]["pending"]["cosine"]) == 4
    assert reward.thresholds.current()["cosine"] == 0.5            # scoring did not move it
    reward.end_batch()                                             # the driver ends the batch
    assert len(reward.state_dict()["thresholds"]["buffers"]["cosine"]) == 4
    assert reward.thresholds.current()["cosine"] == pytest.approx(0.51)
    restored = ARMedReward(threshold_store="ray", ray_actor_name=f"{name}-restored")
    restored.load_state_dict(reward.state_dict())
    assert restored.state_dict()["thresholds"] == reward.state_dict()["thresholds"]
    assert all(t > 0.9 for t in worker_totals)
    reward.thresholds.close()
    restored.thresholds.close()
