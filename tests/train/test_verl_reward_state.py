"""The ARMed state inside verl, with real Ray: one batch boundary per training step whichever worker
process announces it, validation that moves nothing, and the state through verl's checkpoint hook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("verl")

from train.verl_integration import reward as reward_mod  # noqa: E402
from train.verl_integration import reward_state  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ACTOR = "medvqa-armed-thresholds"
# a large drift so one boundary visibly moves the thresholds
OPTIONS = {"threshold_store": "ray", "armed": {"adaptive": {"delta_max": 0.2}}}
ANSWERS = ("left lung", "right kidney", "liver", "brain", "left kidney", "spleen")


def open_state(reward) -> dict:
    return reward.state_dict()["OPEN"]["thresholds"]


def score(reward, answers=ANSWERS):
    """Score OPEN answers against 'left kidney' as the env does; the thresholds each one met."""
    out = []
    for a in answers:
        reward_mod.score_turn(f"\\boxed{{{a}}}", "left kidney", {"answer_type": "OPEN"}, reward)
        out.append(dict(open_state(reward)["thresholds"]))
    return out


@ray.remote(num_cpus=0)
def start_step(options, step):
    """What the first trajectory of a step does in another agent-loop worker process."""
    from train.verl_integration.reward_state import reward_for_step

    reward = reward_for_step(options, step, False)
    return reward.state_dict()["OPEN"]["thresholds"]["thresholds"]


@pytest.fixture
def ray_job(monkeypatch):
    monkeypatch.setattr(reward_mod, "_REWARDS", {})
    monkeypatch.setattr(reward_state, "_ENDED", {})
    monkeypatch.setattr(reward_state, "_FROZEN", {})
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, namespace="verl-reward-state-test", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield
    from rewards.adaptive_ray import RayThresholds

    RayThresholds(name=ACTOR).close()
    ray.shutdown()


def test_one_boundary_per_step_and_validation_moves_nothing(ray_job):
    step1 = reward_state.reward_for_step(OPTIONS, 1, False)
    assert reward_state.reward_for_step(OPTIONS, 1, False) is step1  # the process-wide shared reward
    start = dict(open_state(step1)["thresholds"])
    met = score(step1)
    assert all(m == start for m in met)  # every trajectory of step 1 met the same thresholds
    pending = {m: len(v) for m, v in open_state(step1)["pending"].items()}
    assert pending == {"bertscore": len(ANSWERS), "cosine": len(ANSWERS)}

    # validation after step 1: a frozen copy, scored at the thresholds in force, feeding nothing
    frozen = reward_state.reward_for_step(OPTIONS, 1, True)
    assert frozen is not step1
    assert all(m == start for m in score(frozen, ANSWERS[:2]))
    assert {m: len(v) for m, v in open_state(step1)["pending"].items()} == pending

    # step 2 begins in two other worker processes at once: the thresholds move exactly once
    seen = ray.get([start_step.remote(OPTIONS, 2), start_step.remote(OPTIONS, 2)])
    state = open_state(step1)
    assert state["updates"] == 1 and state["last_batch_id"] == 1
    assert seen[0] == seen[1] == state["thresholds"] != start
    assert all(len(v) == 0 for v in state["pending"].values())
    # ... and this process's own announcement of step 2 changes nothing more
    reward_state.reward_for_step(OPTIONS, 2, False)
    assert open_state(step1)["updates"] == 1
    assert all(m == state["thresholds"] for m in score(step1, ANSWERS[:3]))


def trainer_config(root: Path, resume_mode: str = "auto"):
    from omegaconf import OmegaConf

    return OmegaConf.create({"trainer": {"resume_mode": resume_mode, "resume_from_path": None,
                                         "default_local_dir": str(root)},
                             "medvqa": {"reward": OPTIONS}})


def test_state_goes_into_the_checkpoint_and_comes_back(ray_job, tmp_path, monkeypatch):
    callback = reward_state.RewardStateCheckpoint(trainer_config(tmp_path))
    assert callback.loaded_from is None  # nothing to resume from yet
    reward = reward_state.reward_for_step(OPTIONS, 1, False)
    score(reward)
    reward_state.reward_for_step(OPTIONS, 2, False)  # boundary of batch 1
    score(reward, ANSWERS[:2])  # step 2's values are pending when verl checkpoints step 2
    saved = reward.state_dict()

    folder = tmp_path / "global_step_2"
    callback.on_save(trainer=None, global_step=2, checkpoint_dir=str(folder))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    assert json.loads((folder / reward_state.STATE_FILE).read_text())["OPEN"] == json.loads(json.dumps(saved["OPEN"]))

    # a new run: the actor is gone, the trainer's callback restores it before any worker scores
    from rewards.adaptive_ray import RayThresholds

    RayThresholds(name=ACTOR).close()
    monkeypatch.setattr(reward_mod, "_REWARDS", {})
    monkeypatch.setattr(reward_state, "_ENDED", {})
    resumed = reward_state.RewardStateCheckpoint(trainer_config(tmp_path))
    assert resumed.loaded_from == str(folder / reward_state.STATE_FILE)
    restored = open_state(reward_state.reward_for_step(OPTIONS, 3, False))  # step 3 ends batch 2
    assert restored["updates"] == 2 and restored["last_batch_id"] == 2
    assert all(len(v) == 0 for v in restored["pending"].values())
    assert reward_state.RewardStateCheckpoint(trainer_config(tmp_path, "disable")).loaded_from is None
