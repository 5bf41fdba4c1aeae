"""The learning protocol (issue 19): every held-out answer is stored, a constant answer shows, the
baselines are scored like a policy, and the report's statistics are the ones it names."""

from __future__ import annotations

import json
import math
import os

import pytest

from train import grpo, protocol
from train.common import SHORT_SYSTEM_PROMPT

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TINY = dict(policy="tiny-qwen2-vl", answer_types="CLOSED", eval_size=4, max_new_tokens=4, eval_every=1,
            prompts_per_step=2, group_size=2, tools="ground=oracle", demo_prompt=True, max_turns=1,
            tensorboard=False, save_every=1, keep=1)


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_training_run_stores_every_heldout_answer_and_its_ablations(tmp_path):
    out = tmp_path / "run"
    grpo.main(grpo.Args(**TINY, steps=1, eval_ablations="blank,shuffle", out=str(out)))
    rows = read(out / "heldout_answers.jsonl")
    by = {(r["step"], r["tag"]) for r in rows}
    assert by == {(0, None), (1, None), (1, "blank"), (1, "shuffle")}
    assert sum(1 for r in rows if (r["step"], r["tag"]) == (1, None)) == 4
    assert all({"record_id", "gold", "answer", "correct", "tool_calls", "turns"} <= set(r) for r in rows)
    last = read(out / "metrics.jsonl")[-1]
    for key in ("eval/distinct_answers", "eval/answer_entropy", "eval/top_answer_share", "eval_blank/accuracy",
                "eval_shuffle/accuracy", "time/cpu_s"):
        assert key in last, key
    answered = [r["answer"] for r in rows if (r["step"], r["tag"]) == (1, None) and r["answer"] is not None]
    assert last["eval/distinct_answers"] == len({a.strip().lower() for a in answered})


def test_answer_baselines_are_scored_like_a_policy(tmp_path):
    from agents.models import load_policy
    from medvqa_env.datasets import load_dataset
    from medvqa_env.pool import EnvPool
    from train.answer_baselines import best_constant, evaluate_question_prior
    from train.common import env_kwargs, select_indices

    indices = select_indices("embedded", "test", "CLOSED", limit=16)
    test = load_dataset("embedded", split="test")
    golds = [test[i].answer for i in indices]
    _, encoder, _ = load_policy("tiny-qwen2-vl", system_prompt=SHORT_SYSTEM_PROMPT)
    pool = EnvPool(env_kwargs("embedded", "test", "none", 1), 8)
    answers = tmp_path / "answers.jsonl"
    try:
        best, metrics, scores = best_constant(encoder, pool, indices, ["yes", "no"], "eval/accuracy", answers)
        train = [r for r in load_dataset("embedded", split="train") if r.answer_type.value == "CLOSED"]
        prior = evaluate_question_prior(encoder, pool, indices, train, answers)
    finally:
        pool.close()
    share = {a: golds.count(a) / len(golds) for a in ("yes", "no")}
    assert scores == pytest.approx(share)
    assert best == max(share, key=share.get) and metrics["eval/accuracy"] == pytest.approx(max(share.values()))
    assert metrics["eval/distinct_answers"] == 1 and metrics["eval/top_answer_share"] == 1.0
    assert 0.0 <= prior["eval/accuracy"] <= 1.0 and prior["eval/calls_per_episode"] == 0.0
    tags = {r["tag"] for r in read(answers)}
    assert tags == {"constant", "question_prior"}


def test_t_interval_uses_the_sample_sd():
    values = [0.9, 0.8, 0.85, 0.95, 0.7]
    mean, sd, low, high = protocol.t_interval(values)
    assert sd == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / 4))
    assert low < mean < high and high - mean == pytest.approx(2.776445 * sd / math.sqrt(5), rel=1e-5)


def test_welch_against_a_single_value_is_the_shifted_t_interval():
    a = [0.9, 0.8, 0.85, 0.95, 0.7]
    d = protocol.welch_difference(a, [0.5])
    mean, _, low, high = protocol.t_interval(a)
    assert (d["difference"], d["ci_low"], d["ci_high"]) == pytest.approx((mean - 0.5, low - 0.5, high - 0.5))
    assert d["beats"]
    assert not protocol.welch_difference(a, [0.84, 0.86, 0.85])["beats"]


def _fake_run(out, name, values, calls=0.0, drop=0.0):
    folder = out / name
    folder.mkdir(parents=True)
    rows = [{"step": 0, "eval/accuracy": 0.5},
            {"step": 5, "eval/accuracy": values, "eval/distinct_answers": 2.0, "eval/calls_per_episode": calls,
             "eval_blank/accuracy": values - drop, "tools/calls_per_episode": 0.5}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "DONE").write_text("{}")
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps({"name": name, "rc": 0, "cpu_s": 100.0, "wall_s": 50.0}) + "\n")


def test_report_compares_grpo_with_every_baseline(tmp_path):
    out = tmp_path
    args = protocol.Args(out=str(out), baselines="more_sft,question_prior,constant")
    for seed, v in enumerate([0.9, 0.85, 0.92, 0.88, 0.9]):
        _fake_run(out, f"grpo_s{seed}", v, calls=1.0, drop=0.3)
        _fake_run(out, f"more_sft_s{seed}", 0.5 + 0.01 * seed)
    (out / "warm_start.json").write_text(json.dumps({"chosen_step": 40, "checkpoint": "x"}))
    (out / "warm_test").mkdir()
    (out / "warm_test" / "eval.json").write_text(json.dumps({"metrics": {"eval/accuracy": 0.5}}))
    (out / "answer_baselines.json").write_text(json.dumps({
        "question_prior": {"eval/accuracy": 0.45}, "constant": {"answer": "no", "eval/accuracy": 0.52}}))
    result = protocol.report(args, out)
    rows = result["rows"]
    assert rows["grpo"]["seeds"] == 5 and rows["grpo"]["mean"] == pytest.approx(0.89)
    assert rows["grpo"]["blank_drop_mean"] == pytest.approx(0.3)
    assert rows["grpo"]["per_seed"][0]["sampled_tool_calls_last5"] == 0.5
    assert set(result["grpo_minus"]) == {"more_sft", "warm_start", "question_prior", "constant"}
    assert result["beats_every_baseline"]
    assert rows["constant"]["answer"] == "no"


def test_a_finished_run_is_skipped_and_a_failed_one_stops(tmp_path):
    info = protocol.run(tmp_path, "ok", "json.tool", ["--help"])
    assert info["rc"] == 0 and (tmp_path / "ok" / "DONE").is_file()
    assert protocol.run(tmp_path, "ok", "no.such.module", []) == info  # not run again
    with pytest.raises(RuntimeError, match="exit code"):
        protocol.run(tmp_path, "bad", "no.such.module", [])
    assert not (tmp_path / "bad" / "DONE").exists()
    assert [r["name"] for r in read(tmp_path / "runs.jsonl")] == ["ok", "bad"]


def test_a_report_without_a_finished_grpo_run_fails(tmp_path, capsys):
    """Baselines alone are no result: the report stage exits 1 and says why."""
    _fake_run(tmp_path, "more_sft_s0", 0.5)
    (tmp_path / "warm_start.json").write_text(json.dumps({"chosen_step": 40, "checkpoint": "x"}))
    (tmp_path / "warm_test").mkdir()
    (tmp_path / "warm_test" / "eval.json").write_text(json.dumps({"metrics": {"eval/accuracy": 0.5}}))
    args = protocol.Args(out=str(tmp_path), stages="report", baselines="more_sft")
    assert protocol.main(args) == 1
    assert "no finished GRPO run" in capsys.readouterr().err
    assert not (tmp_path / "tool_outputs.jsonl").exists()
