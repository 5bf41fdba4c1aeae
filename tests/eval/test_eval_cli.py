"""``python -m eval.run`` as a real subprocess: kill it mid-run, rerun, nothing lost or changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval.results import load_results

from eval_helpers import by_key

REPO = Path(__file__).resolve().parents[2]


def eval_cmd(manifest: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "eval.run", "--agent", "scripted", "--agent-opt", "bad_tool_on=q04",
            "--dataset", str(manifest), "--out", str(out), "--k", "2", "--workers", "2", "--batch-size", "4",
            "--no-open-metrics", "--no-progress", "--bootstrap", "50", *extra]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_results(tmp_path, manifest):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    subprocess.run(eval_cmd(manifest, whole), cwd=REPO, env=env(), check=True, capture_output=True, timeout=120)

    proc = subprocess.Popen(eval_cmd(manifest, killed, "--agent-opt", "delay_s=0.15"), cwd=REPO, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = killed / "episodes.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(load_results(results)) < 4:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    n_before = len(load_results(results))
    assert 4 <= n_before < 24, "the run should have been killed mid-way"

    rerun = subprocess.run(eval_cmd(manifest, killed), cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert by_key(load_results(killed)) == by_key(load_results(whole))
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["timing"]["new_episodes"] == 24 - n_before
    assert summary["overall"] == json.loads((whole / "summary.json").read_text())["overall"]

    table = subprocess.run([sys.executable, "-m", "eval.compare", str(whole), str(killed), "--names", "a,b"],
                           cwd=REPO, env=env(), capture_output=True, text=True, timeout=60, check=True).stdout
    assert table.splitlines()[0].startswith("| Run | episodes | CLOSED | OPEN Avg (ARMed)")
    assert table.count("✅") == 0 and "| tie |" in table and "Tie: a, b share the best" in table  # no two winners


def test_cli_reports_caller_errors_clearly(tmp_path, manifest):
    from eval.run import main

    assert main(["--agent", "no-such-agent", "--dataset", str(manifest), "--out", str(tmp_path / "x")]) == 2
    assert main(["--agent", "scripted", "--dataset", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "y")]) == 2


def test_cli_runs_in_process_and_writes_reports(tmp_path, manifest, capsys):
    from eval.run import main

    out = tmp_path / "run"
    rc = main(["--agent", "scripted", "--dataset", str(manifest), "--out", str(out), "--workers", "0",
               "--limit", "6", "--no-open-metrics", "--no-progress", "--tools", "image_zoom_in", "--bootstrap", "50"])
    assert rc == 0
    assert "## Headline" in capsys.readouterr().out
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "Tool use" in html  # no open metrics: no empty plot
    assert json.loads((out / "summary.json").read_text())["n_episodes"] == 6


def test_run_json_is_truthful(tmp_path):
    """run.json said split 'test' for a train split and tools null; now: the records' split, the
    resolved tool config, the package version and the git commit."""
    from eval.runner import EvalConfig, evaluate
    from eval.scripted import ScriptedAgent
    from medvqa_env.datasets import load_dataset

    train = load_dataset("embedded", split="train")
    config = EvalConfig(limit=2, workers=0, tools="image_zoom_in,segment=classical", open_metrics=False,
                        progress=False, bootstrap=0)
    evaluate(ScriptedAgent(), train, config, out_dir=tmp_path / "a")
    run = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run["split"] == "train"
    assert run["tools"] == {"image_zoom_in": {"backend": "local"}, "segment": {"backend": "local", "engine": "classical"}}
    assert run["provenance"]["package_version"] and "git_commit" in run["provenance"]


def test_compare_ranks_runs_and_warns_when_they_differ(tmp_path, capsys):
    from eval.compare import main
    from eval.runner import EvalConfig, evaluate
    from eval.scripted import ScriptedAgent
    from medvqa_env.datasets import load_dataset

    test = load_dataset("embedded", split="test")
    for name, limit, agent in (("small", 2, ScriptedAgent(zoom=False)), ("big", 4, ScriptedAgent())):
        evaluate(agent, test, EvalConfig(limit=limit, workers=0, tools=[], open_metrics=False, progress=False,
                                         bootstrap=0), out_dir=tmp_path / name)
    assert main([str(tmp_path / "small"), str(tmp_path / "big"), "--rank"]) == 0
    captured = capsys.readouterr()
    assert "warning: runs differ in limit" in captured.err and "questions: small=2, big=4" in captured.err
    rows = [line for line in captured.out.splitlines() if line.startswith("| small") or line.startswith("| big")]
    assert len(rows) == 2


def test_compare_writes_its_report_beside_the_runs_and_names_differing_settings(tmp_path, capsys):
    """Two runs of one agent that tie: compare.md / compare.html beside them (their parent folder),
    no run selected, and warnings for a differing tool config and agent setting, which the table
    would otherwise hide; eval.run ends with the command that compares its run with its siblings."""
    from eval.compare import main
    from eval.run import compare_hint
    from eval.runner import EvalConfig, evaluate
    from eval.scripted import ScriptedAgent
    from medvqa_env.datasets import load_dataset

    test = load_dataset("embedded", split="test")
    runs = tmp_path / "runs"
    for name, tools, agent in (("a", "image_zoom_in", ScriptedAgent(answer="yes")),
                               ("b", "image_zoom_in,segment=classical", ScriptedAgent(answer="yes", zoom=False))):
        evaluate(agent, test, EvalConfig(limit=3, workers=0, tools=tools, open_metrics=False, progress=False,
                                         bootstrap=0), out_dir=runs / name)
    assert main([str(runs / "a"), str(runs / "b")]) == 0
    captured = capsys.readouterr()
    assert "warning: runs differ in tools:" in captured.err and "warning: runs differ in agent settings:" in captured.err
    assert "'zoom': True" in captured.err and "the table compares those settings" in captured.err
    assert "✅" not in captured.out and captured.out.count("| tie |") == 2 and "no run is selected" in captured.out
    md, page = (runs / "compare.md").read_text(), (runs / "compare.html").read_text()
    assert "| tie |" in md and "runs differ in tools" in md and str(runs / "b") in md and "## Detail" in md
    assert "<td>tie</td>" in page and "runs differ in agent settings" in page and "✅" not in page
    assert f"Wrote {runs / 'compare.md'}" in captured.err
    hint = compare_hint(runs / "a")
    assert f"python -m eval.compare {runs / 'a'} {runs / 'b'}" in hint and "compare.md" in hint
