"""Issue 12: which questions an evaluation asks (shuffle, stratified limit, none is an error) and
what the report says about errors (scored vs errored episodes, the failed records, no empty plots)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from eval.metrics import summarize
from eval.report import to_markdown, write_reports
from eval.runner import EvalConfig, evaluate
from eval.scripted import ScriptedAgent
from eval.selection import select_records
from medvqa_env.datasets import load_dataset
from medvqa_env.errors import ConfigError
from medvqa_env.records import VQADataset

REPO = Path(__file__).resolve().parents[2]
FAST = dict(progress=False, open_metrics=False, bootstrap=0, workers=0)


def _kinds(ds) -> Counter:
    return Counter(r.answer_type.value for r in ds)


@pytest.mark.data
def test_stratified_limit_keeps_the_answer_type_shares_of_vqa_rad(vqa_rad_root):
    test = load_dataset("vqa_rad", split="test", root=vqa_rad_root)  # 272 CLOSED / 179 OPEN
    assert _kinds(select_records(test, limit=40)) == {"CLOSED": 38, "OPEN": 2}  # the first 40: what issue 12 saw
    strat = select_records(test, limit=40, stratify="answer_type")
    assert _kinds(strat) == {"CLOSED": 24, "OPEN": 16}
    shuffled = select_records(test, limit=40, shuffle=True, stratify="answer_type", seed=7)
    assert _kinds(shuffled) == {"CLOSED": 24, "OPEN": 16}
    assert {r.id for r in shuffled} != {r.id for r in strat}
    assert [r.id for r in select_records(test, limit=40, shuffle=True, stratify="answer_type", seed=7)] == \
        [r.id for r in shuffled]  # seeded
    smaller = select_records(test, limit=20, shuffle=True, stratify="answer_type", seed=7)
    assert {r.id for r in smaller} <= {r.id for r in shuffled}  # a larger limit extends the selection


def test_shuffle_draws_a_seeded_random_subset(dataset):
    first = select_records(dataset, limit=4)
    assert [r.id for r in first] == ["q00", "q01", "q02", "q03"]
    a, b = (select_records(dataset, limit=4, shuffle=True, seed=s) for s in (1, 2))
    assert [r.id for r in a] != [r.id for r in b] and len(a) == 4
    with pytest.raises(ConfigError, match="expected stratify to be one of"):
        select_records(dataset, limit=4, stratify="colour")


def test_an_evaluation_that_selects_nothing_fails_and_writes_nothing(tmp_path, dataset):
    empty = VQADataset([], name="none")
    with pytest.raises(ConfigError, match="the evaluation selects no questions: dataset 'none'"):
        evaluate(ScriptedAgent(), empty, EvalConfig(**FAST), out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="expected limit to be a positive int"):
        evaluate(ScriptedAgent(), dataset, EvalConfig(limit=0, **FAST), out_dir=tmp_path / "run")


def test_eval_cli_exits_non_zero_when_the_split_selects_nothing(tmp_path, manifest):
    rows = [dict(json.loads(line), split="train") for line in manifest.read_text().splitlines()]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))  # every row is train
    proc = subprocess.run([sys.executable, "-m", "eval.run", "--agent", "scripted", "--dataset", str(manifest),
                           "--split", "validation", "--out", str(tmp_path / "out"), "--workers", "0"],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "error:" in proc.stderr and "split 'validation'" in proc.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_cli_shuffles_and_stratifies_from_config_fields(tmp_path, manifest):
    from eval.run import main

    out = tmp_path / "run"
    assert main(["--agent", "scripted", "--agent-opt", "zoom=false", "--dataset", str(manifest), "--out", str(out),
                 "--workers", "0", "--tools", "none", "--max-turns", "0", "--no-open-metrics", "--no-progress",
                 "--bootstrap", "0", "--limit", "3", "--shuffle", "--stratify", "answer_type"]) == 0
    sel = json.loads((out / "run.json").read_text())["selection"]
    assert (sel["n_selected"], sel["by_answer_type"], sel["shuffle"]) == (3, {"CLOSED": 1, "MCQ": 1, "OPEN": 1}, True)


def test_run_json_records_the_seeded_selection(tmp_path, dataset):
    cfg = EvalConfig(limit=6, shuffle=True, stratify="answer_type", shuffle_seed=3, **FAST)
    summary = evaluate(ScriptedAgent(zoom=False), dataset, cfg, out_dir=tmp_path / "run")
    sel = json.loads((tmp_path / "run" / "run.json").read_text())["selection"]
    assert sel["n_selected"] == 6 == summary.n_questions and sel["by_answer_type"] == {"CLOSED": 2, "MCQ": 2, "OPEN": 2}
    assert (sel["shuffle"], sel["stratify"], sel["seed"]) == (True, "answer_type", 3)
    assert summary.run["selection"]["ids_sha256"] == sel["ids_sha256"]


def _row(rid, kind="CLOSED", correct=True, error=None):
    correct = correct and error is None
    return {"key": f"{rid}#0", "record_id": rid, "sample": 0, "answer_type": kind, "correct": correct,
            "exact_match": correct, "prediction": None if error else "yes", "format_ok": error is None,
            "error": error, "metrics": {}, "reward": 1.0, "judge": None, "turns": 1, "dataset": "d",
            "modality": "CT", "organ": None, "timing": {"total_s": 0.1, "agent_s": 0.0, "env_s": 0.1},
            "tool_stats": {"calls": 0, "by_tool": {}, "malformed": 0, "invalid": 0, "errors": 0}}


def test_report_separates_scored_from_errored_lists_failures_and_draws_no_empty_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [_row("q1"), _row("q2", correct=False),
            _row("q3", error={"kind": "dataset_error", "message": "record 'q3': image '/x/q3.png' does not exist"}),
            _row("q4", error={"kind": "agent_error", "message": "RuntimeError: | boom"})]
    s = summarize(rows, k=1, resamples=0)
    g = s.overall
    assert (g.n_episodes, g.n_scored, g.n_errors) == (4, 3, 2)
    assert g.closed_accuracy.value == pytest.approx(1 / 3) and g.closed_accuracy.n == 3  # agent_error scores as wrong
    assert [(f["record_id"], f["kind"], f["scored"]) for f in s.failures] == [("q3", "dataset_error", False),
                                                                              ("q4", "agent_error", True)]
    md = to_markdown(s)
    assert "| Slice | episodes | scored | errors |" in md and "| all | 4 | 3 | 2 |" in md
    assert "## Failed episodes (2)" in md and "| q4 | 0 | agent_error | as wrong | RuntimeError: \\| boom |" in md
    write_reports(tmp_path, s)
    drawn = sorted(p.stem for p in (tmp_path / "plots").iterdir())
    assert drawn == ["by_slice", "headline"]  # no OPEN answers, no tool calls: those plots are not drawn
