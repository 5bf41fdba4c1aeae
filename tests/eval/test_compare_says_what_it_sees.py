"""Issue 42 ("a trainer that says what happened", eval.compare's part) and issue 41's "compare
refuses to rank runs with different failure counts without saying so": eval.compare shows every
figure's interval, flags one constant answer and tool calls that died, never selects a run whose
interval overlaps the runner-up's without saying it is a tie within noise, and says when failure
counts differ."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from eval.compare import choose, comparison_table, main, run_flags
from eval.runner import EvalConfig, evaluate
from eval.scripted import ScriptedAgent
from eval.summary import EvalSummary, GroupSummary, MetricValue
from medvqa_env.datasets import load_dataset

FAST = dict(workers=0, tools=[], open_metrics=False, progress=False, bootstrap=200)


def closed_manifest(root: Path, golds: str) -> Path:
    """One CLOSED question per character of ``golds`` (``y``/``n``), each with its own real PNG."""
    (root / "img").mkdir(parents=True)
    rows = []
    for i, g in enumerate(golds):
        Image.fromarray((np.random.default_rng(i).random((16, 16, 3)) * 255).astype("uint8")).save(root / "img" / f"{i}.png")
        rows.append({"id": f"q{i:02d}", "image_paths": [f"img/{i}.png"], "question": f"Is {i} normal?",
                     "answer_type": "CLOSED", "answer": "yes" if g == "y" else "no"})
    (root / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "qa.jsonl"


def test_a_constant_answer_over_a_prior_within_noise_is_a_tie_not_a_selection(tmp_path, capsys):
    """Issue 42's new-user run: a policy answering "no" everywhere beside one answering "yes"
    everywhere, 0.45 vs 0.55 CLOSED with overlapping intervals: before, the better one was ✅
    selected, no interval shown, no word about the constant."""
    ds = load_dataset(str(closed_manifest(tmp_path / "data", "yyyyyyyyyyynnnnnnnnn")))  # 11 yes, 9 no
    runs = tmp_path / "runs"
    for name, answer in (("grpo_no", "no"), ("prior_yes", "yes")):
        evaluate(ScriptedAgent(answer=answer, zoom=False), ds, EvalConfig(**FAST), out_dir=runs / name)
    assert main([str(runs / "grpo_no"), str(runs / "prior_yes"), "--select", "closed"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| grpo_no |"))
    assert "0.450 [" in row and "one constant answer ('no')" in row and row.endswith("| tie within noise |")
    assert "✅" not in out
    assert "Tie within noise: the best closed score, prior_yes 0.550 [" in out and "no run is selected" in out
    page = (runs / "compare.html").read_text()
    assert "tie within noise" in page and "one constant answer" in page


def test_a_run_clear_of_the_runner_up_is_selected(tmp_path):
    from agents.registry import build_agent

    ds = load_dataset(str(closed_manifest(tmp_path / "data", "yyyyyyyyyyynnnnnnnnn")))
    runs = [(name, evaluate(agent, ds, EvalConfig(**FAST)))
            for name, agent in (("oracle", build_agent("oracle", dataset=ds)), ("const", ScriptedAgent(answer="maybe")))]
    sel = choose(runs, "closed")
    assert (sel.selected, sel.tied, sel.notes) == ("oracle", [], [])
    table = comparison_table(runs, "closed")
    assert "| ✅ |" in table and "1.000 [1.000, 1.000]" in table


def test_tool_calls_that_died_are_flagged(tmp_path):
    """A checkpoint trained with tools that calls none "did not take off"; a run offered tools that
    calls none says so; a run whose tools are unknown and that calls some is not flagged."""
    ckpt = tmp_path / "step_000010"
    ckpt.mkdir()
    (ckpt / "medvqa_run.json").write_text(json.dumps({"env": {"tools": ["ground"], "max_turns": 3}}))
    none = GroupSummary(tool_calls_per_episode=MetricValue(0.0, 0.0, 0.0, 10))
    assert run_flags(EvalSummary(run={"agent": {"model": str(ckpt)}, "tools": ["ground"]}, overall=none)) == \
        ["did not take off: 0.00 tool calls/ep, trained with tools"]
    assert run_flags(EvalSummary(run={"agent": {"name": "prior"}, "tools": ["ground"]}, overall=none)) == \
        ["no tool calls (tools offered)"]
    some = GroupSummary(tool_calls_per_episode=MetricValue(1.2, 1.0, 1.4, 10))
    assert run_flags(EvalSummary(run={"agent": {"model": str(ckpt)}, "tools": ["ground"]}, overall=some)) == []
    assert run_flags(EvalSummary(run={"tools": []}, overall=none)) == []  # no tools: nothing to call


def test_runs_with_different_failure_counts_are_ranked_only_with_a_word(tmp_path, capsys):
    ds = load_dataset(str(closed_manifest(tmp_path / "data", "yyyyyyyyyy")))
    runs = tmp_path / "runs"
    evaluate(ScriptedAgent(answer="yes", zoom=False), ds, EvalConfig(**FAST), out_dir=runs / "clean")
    (tmp_path / "data" / "img" / "3.png").write_text("not a picture")  # one decode failure in the second run
    evaluate(ScriptedAgent(answer="yes", zoom=False), load_dataset(str(tmp_path / "data" / "qa.jsonl")),
             EvalConfig(**FAST), out_dir=runs / "broken")
    assert main([str(runs / "clean"), str(runs / "broken"), "--select", "closed"]) == 0
    captured = capsys.readouterr()
    assert "warning: runs differ in failed episodes: clean=0, broken=1 {'dataset_error': 1}" in captured.err
    assert "Failures differ: clean 0, broken 1 failed episodes" in captured.out and "not like for like" in captured.out
    assert "1 failed episodes" in next(line for line in captured.out.splitlines() if line.startswith("| broken |"))


def test_a_run_without_an_interval_is_within_noise_only_if_its_score_is_inside_the_best_interval():
    """The VQA-RAD baselines table: the oracle (1.000 [1.000, 1.000]) was called a tie within noise
    with a 12-question SmolLM2 row scoring 0.000 with no interval of its own -- a run without an
    interval counted as overlapping whatever its score. A point overlaps only inside the interval."""
    best = EvalSummary(overall=GroupSummary(closed_accuracy=MetricValue(0.90, 0.85, 0.95, 200)))
    far = EvalSummary(overall=GroupSummary(closed_accuracy=MetricValue(0.10, None, None, 1)))
    near = EvalSummary(overall=GroupSummary(closed_accuracy=MetricValue(0.86, None, None, 1)))
    sel = choose([("best", best), ("far", far)], "closed")
    assert (sel.selected, sel.within_noise, sel.tied) == ("best", False, [])
    sel = choose([("best", best), ("near", near), ("far", far)], "closed")
    assert (sel.selected, sel.within_noise, sel.tied) == (None, True, ["best", "near"])
    assert "runner-up near" in sel.notes[0]
