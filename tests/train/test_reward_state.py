"""The run's reward state in the native trainer: ARMed thresholds move once per training step
(pool.end_batch), are logged, go into checkpoints, and a resumed run continues with the thresholds
the uninterrupted run has."""

from __future__ import annotations

import json

import pytest

from train import grpo, sft
from train.checkpoint import STATE_DIR, latest_checkpoint
from train.common import parse_args
from train.metrics_log import read_metrics

OPEN_RUN = ["--answer_types", "OPEN", "--reward", "default", "--tools", "none", "--eval_size", "2",
            "--eval_every", "0", "--max_new_tokens", "6", "--prompts_per_step", "2", "--group_size", "2",
            "--save_every", "1", "--tensorboard", "false", "--save_final", "false"]


def _run(policy, out, steps, *extra):
    args = ["--policy", str(policy), *OPEN_RUN, "--steps", str(steps), "--out", str(out), *extra]
    return grpo.main(parse_args(grpo.Args, args))


def _thresholds(rows, step):
    row = next(r for r in rows if r["step"] == step)
    return {k: row[k] for k in ("reward/threshold_bertscore", "reward/threshold_cosine")}


def _saved_reward_state(out):
    state = json.loads((latest_checkpoint(out) / STATE_DIR / "state.json").read_text())
    return state["reward_state"]["reward"]["OPEN"]["thresholds"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward_state")
    # a short SFT so that the tiny model answers (unanswered episodes never enter the buffers)
    sft.main(parse_args(sft.Args, ["--policy", "tiny-qwen2-vl", "--answer_types", "OPEN", "--tools", "none",
                                   "--demo-prompt", "--steps", "12", "--batch_size", "8", "--lr", "1e-2",
                                   "--eval_size", "2", "--max_new_tokens", "6", "--out", str(root / "sft")]))
    policy = root / "sft" / "final"
    _run(policy, root / "whole", 3)
    _run(policy, root / "split", 2)
    _run(policy, root / "split", 3, "--allow_changed", "steps")  # resumes at step 2
    return read_metrics(root / "whole" / "metrics.jsonl"), read_metrics(root / "split" / "metrics.jsonl"), root


def test_thresholds_move_once_per_step_and_are_logged(runs):
    whole, _, _ = runs
    per_step = [_thresholds(whole, s) for s in (1, 2, 3)]
    assert per_step[0] == {"reward/threshold_bertscore": 0.5, "reward/threshold_cosine": 0.5}  # the initial T
    for before, after in zip(per_step, per_step[1:]):  # one bounded move (delta_max 0.01) per step, no more
        for k in before:
            assert abs(after[k] - before[k]) <= 0.01 + 1e-9
    assert per_step[2] != per_step[0]


def test_a_resumed_run_has_the_uninterrupted_runs_thresholds(runs):
    whole, split, root = runs
    assert [r["step"] for r in split] == [0, 1, 2, 3]
    # step 3 was scored after the resume: with the state restored it meets the same thresholds
    assert _thresholds(split, 3) == _thresholds(whole, 3) != _thresholds(whole, 1)
    a, b = _saved_reward_state(root / "whole"), _saved_reward_state(root / "split")
    assert a["thresholds"] == pytest.approx(b["thresholds"], abs=1e-12)
    for metric in ("bertscore", "cosine"):
        assert a["buffers"][metric] == pytest.approx(b["buffers"][metric], abs=1e-6) and a["buffers"][metric]
    assert a["last_batch_id"] == b["last_batch_id"] == 2


def test_held_out_evaluation_reports_armed_avg_and_exact_match_on_open(runs):
    whole, _, _ = runs
    row = whole[-1]
    assert 0.0 <= row["eval/open/armed_avg"] <= 1.0 and 0.0 <= row["eval/open/exact_match"] <= 1.0
    parts = [row[f"eval/open/{m}"] for m in ("bleu1", "rouge1", "bertscore", "cosine")]
    assert row["eval/open/armed_avg"] == pytest.approx(sum(parts) / 4)
    assert "open/armed_avg" in row  # the same on the training rollouts
