"""``compute_score`` as verl loads and calls it, on real VQA-RAD answers."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from train.verl_integration.config import compose_config  # noqa: E402
from train.verl_integration.reward import SCORE_KEYS, compute_score, overlong_penalty  # noqa: E402


@pytest.fixture(scope="module")
def verl_reward_fn():
    """Our function, loaded by verl's own loader from the composed config's path/name."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    return get_custom_reward_fn(compose_config())


@pytest.fixture(scope="module")
def vqa_rad_records(vqa_rad_root):
    from medvqa_env.datasets import load_dataset

    ds = load_dataset("vqa_rad", split="test", root=str(vqa_rad_root))
    closed = [r for r in ds if r.answer_type.value == "CLOSED" and r.answer.lower() in ("yes", "no")][:3]
    opened = [r for r in ds if r.answer_type.value == "OPEN"][:3]
    return closed, opened


def multi_turn(final: str) -> str:
    """What verl decodes for a tool-using rollout (special tokens skipped)."""
    return ('<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 9, 9]}}</tool_call>\n'
            "user\n<observation>\n[image_zoom_in] Zoomed. \\boxed{decoy}\n</observation>\nassistant\n" + final)


def info(record):
    return {"answer_type": record.answer_type.value, "record_id": record.id, "question": record.question,
            "options": [], "index": 0}


def test_closed_answers(verl_reward_fn, vqa_rad_records):
    closed, _ = vqa_rad_records
    assert closed
    for r in closed:
        wrong = "no" if r.answer.lower() == "yes" else "yes"
        right = verl_reward_fn(data_source="medvqa/vqa_rad", solution_str=multi_turn(f"\\boxed{{{r.answer}}}"),
                               ground_truth=r.answer, extra_info=info(r))
        bad = verl_reward_fn(data_source="medvqa/vqa_rad", solution_str=multi_turn(f"\\boxed{{{wrong}}}"),
                             ground_truth=r.answer, extra_info=info(r))
        assert tuple(right) == SCORE_KEYS and tuple(bad) == SCORE_KEYS
        assert (right["score"], right["acc"], right["format_ok"]) == (1.0, 1.0, 1.0)
        assert (bad["score"], bad["acc"]) == (-1.0, 0.0)


def test_open_answers_use_armed(verl_reward_fn, vqa_rad_records):
    _, opened = vqa_rad_records
    assert opened
    for r in opened:
        exact = verl_reward_fn(data_source="medvqa/vqa_rad", solution_str=f"\\boxed{{{r.answer}}}",
                               ground_truth=r.answer, extra_info=info(r))
        off = verl_reward_fn(data_source="medvqa/vqa_rad", solution_str="\\boxed{completely unrelated words}",
                             ground_truth=r.answer, extra_info=info(r))
        assert -1.0 <= off["score"] < exact["score"] <= 1.0
        assert exact["acc"] == 1.0


def test_answer_is_read_from_the_final_turn_only():
    """An answer inside an observation (or an unanswered last turn) does not count."""
    s = compute_score("medvqa/x", multi_turn("I cannot tell."), "decoy", {"answer_type": "CLOSED"})
    assert s["answered"] == 0.0 and s["score"] == -1.0


def test_mcq_with_parquet_style_options():
    opts = [{"key": "A", "text": "0"}, {"key": "B", "text": "1"}]
    assert compute_score("medvqa/x", "\\boxed{B}", "B", {"answer_type": "MCQ", "options": opts})["score"] == 1.0
    assert compute_score("medvqa/x", "\\boxed{A}", "B", {"answer_type": "MCQ", "options": opts})["score"] == -1.0


def test_overlong_penalty():
    assert overlong_penalty(100, 1000, 200) == 0.0
    assert overlong_penalty(1000, 1000, 200, penalty_factor=0.5) == -0.5
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(10, 100, 0)


def test_under_ray_armed_thresholds_are_shared_by_workers(monkeypatch):
    """In a Ray job (verl's workers) the shared reward keeps ARMed's thresholds in one named actor:
    a second worker's reward sees what the first one's samples queued for the next batch end."""
    ray = pytest.importorskip("ray")
    from rewards.adaptive_ray import RayThresholds

    from train.verl_integration import reward as reward_mod

    monkeypatch.setattr(reward_mod, "_REWARDS", {})
    if ray.is_initialized():  # another module's Ray: this test needs its own namespace
        ray.shutdown()
    ray.init(num_cpus=1, include_dashboard=False, namespace="verl-reward-test", log_to_driver=False)
    try:
        worker_a = reward_mod.shared_reward()  # "auto" resolves to "ray" inside a Ray job
        open_a = next(fn for kind, fn in worker_a.fn.routes.items() if kind.value == "OPEN")
        assert isinstance(open_a.thresholds, RayThresholds)
        answers = ("left lung", "right kidney", "liver", "brain")
        for answer in answers:
            reward_mod.score_turn(f"\\boxed{{{answer}}}", "left lung", {"answer_type": "OPEN"}, worker_a)
        worker_b = reward_mod.build_reward("ray")  # what another worker process builds
        state = worker_b.state_dict()["OPEN"]["thresholds"]
        assert [len(state["pending"][m]) for m in ("bertscore", "cosine")] == [len(answers)] * 2
        assert state == worker_a.state_dict()["OPEN"]["thresholds"]
    finally:
        RayThresholds(name="medvqa-armed-thresholds").close()
        ray.shutdown()
    assert reward_mod.resolve_store("auto") == "local"
