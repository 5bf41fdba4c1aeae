"""ARMed thresholds across real Ray workers: one named actor per run owns the buffers, two runs
never share one by accident, and the actor ends with the run."""

from __future__ import annotations

import gc
import pickle
import time
import uuid

import pytest

from medvqa_env.records import AnswerType
from rewards.adaptive import AdaptiveConfig, AdaptiveThresholds
from rewards.adaptive_ray import RayThresholds, held_actor_names
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
    ours, theirs = restored.state_dict()["thresholds"], reward.state_dict()["thresholds"]
    assert (ours.pop("actor"), theirs.pop("actor")) == (f"{name}-restored", name)   # the name is in the state
    assert ours == theirs
    assert all(t > 0.9 for t in worker_totals)
    reward.thresholds.close()
    restored.thresholds.close()


def _exists(name: str) -> bool:
    try:
        ray.get_actor(name)
        return True
    except ValueError:
        return False


def test_two_rewards_in_one_job_keep_separate_thresholds_unless_given_one_name(ray_session):
    from rewards.armed import ARMedReward

    a, b = ARMedReward(threshold_store="ray"), ARMedReward(threshold_store="ray")
    assert a.config.ray_actor_name != b.config.ray_actor_name          # a fresh name per run, in the config
    a.thresholds.observe({"cosine": [0.9] * 4, "bertscore": [0.9] * 4})
    assert a.end_batch(0)["thresholds"]["cosine"] == pytest.approx(0.51)
    assert b.thresholds.current()["cosine"] == 0.5                      # b did not move
    assert b.state_dict()["thresholds"]["actor"] == b.config.ray_actor_name
    shared = f"run-{uuid.uuid4().hex}"
    c, d = (ARMedReward(threshold_store="ray", ray_actor_name=shared) for _ in range(2))
    c.thresholds.observe({"cosine": [0.9]})
    d.end_batch(0)
    assert c.thresholds.current()["cosine"] == pytest.approx(0.51)      # one name, one state
    for r in (a, b, c, d):
        r.close()


@pytest.mark.parametrize("store", ["local", "ray"])
def test_end_batch_ignores_an_id_not_newer_than_the_last(ray_session, store):
    config = AdaptiveConfig(delta_max=0.05, init={"cosine": 0.5})
    t = AdaptiveThresholds(config, ["cosine"]) if store == "local" else RayThresholds(config, ["cosine"])
    moved = []
    for batch_id in (1, 2, 1, 2, 0, 3):
        t.observe({"cosine": [0.9]})
        moved.append(round(t.end_batch(batch_id)["cosine"], 6))
    # steps 1 and 2 move; a late step 1, a repeated 2 and a step 0 do not; step 3 takes what waited
    assert moved == [0.55, 0.6, 0.6, 0.6, 0.6, 0.65]
    assert t.state_dict()["last_batch_id"] == 3
    with pytest.raises(ValueError, match="expected batch ids that order"):
        t.end_batch("step-4")
    if store == "ray":
        t.close()


def test_the_actor_ends_with_its_run_and_a_copy_says_so(ray_session):
    store = RayThresholds()
    name = store.name
    assert _exists(name) and name in held_actor_names()                 # created by its holder at once
    copy = pickle.loads(pickle.dumps(store))
    assert ray.get(ray.remote(num_cpus=0)(lambda h: h.current()).remote(copy)) == store.current()
    store.close()
    assert name not in held_actor_names()
    for _ in range(50):
        if not _exists(name):
            break
        time.sleep(0.1)
    assert not _exists(name)                                            # killed, not leaked
    with pytest.raises(RuntimeError, match="closed or has not started it"):
        copy.current()                                                  # no silent fresh state


def test_a_holder_dropped_without_close_lets_go_and_shared_names_wait_for_the_last(ray_session):
    store = RayThresholds()
    name = store.name
    del store
    gc.collect()
    assert name not in held_actor_names()
    shared = f"run-{uuid.uuid4().hex}"
    first, second = RayThresholds(name=shared), RayThresholds(name=shared)
    first.observe({"cosine": [0.7]})
    first.close()
    assert second.state_dict()["pending"]["cosine"] == [0.7]            # the other holder still has it
    second.close()
    assert shared not in held_actor_names()



def test_a_name_held_in_an_earlier_ray_session_starts_fresh_in_the_next(ray_session):
    name = f"run-{uuid.uuid4().hex}"
    earlier = RayThresholds(AdaptiveConfig(delta_max=0.05), name=name)
    earlier.observe({"cosine": [0.9]})
    ray.shutdown()                                                      # the holder was never closed
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    later = RayThresholds(AdaptiveConfig(delta_max=0.05), name=name)   # same name, new cluster
    assert later.state_dict()["pending"]["cosine"] == []               # a live actor, not the old handle
    later.close()
    earlier.close()
