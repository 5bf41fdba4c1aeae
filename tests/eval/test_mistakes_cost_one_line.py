"""Issue 41, item 6: a mistake costs one line. A misspelt ``--tools`` name is one clean line and
exit 2 at any ``--workers`` (before: three tracebacks and exit 1 at the default 2); a run folder that
scored nothing is not "a different setup" (the corrected command runs); ``eval.compare runs/X/*``
works again after it wrote compare.md/compare.html into the folder its glob covers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE = ["--agent", "scripted", "--dataset", "embedded", "--limit", "3", "--no-open-metrics", "--no-progress",
        "--bootstrap", "0"]


@pytest.mark.parametrize("workers", ["2", "0"])
def test_a_misspelt_tool_is_one_line_and_exit_2_at_any_workers(tmp_path, capsys, workers):
    from eval.run import main

    out = tmp_path / "run"
    assert main([*BASE, "--tools", "image_zom_in", "--workers", workers, "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("medvqa-eval: error: Unknown tool 'image_zom_in'. Available: ["), err
    assert err[0].endswith("Did you mean 'image_zoom_in'?")
    assert not out.exists()  # no run folder left behind to refuse the corrected command


def test_a_misspelt_engine_in_a_worker_is_one_line_and_the_corrected_command_runs(tmp_path):
    """The engine is only known where the tool is built (in the workers): still one line, exit 2,
    and the folder the failed attempt made takes the corrected command."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "eval.run", *BASE, "--workers", "2", "--out", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    bad = subprocess.run([*cmd, "--tools", "segment=classicl"], cwd=REPO, capture_output=True, text=True, env=env,
                         timeout=120)
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "Traceback" not in bad.stderr, bad.stderr[-2000:]
    assert bad.stderr.strip().splitlines()[-1].startswith("medvqa-eval: error: Unknown segment engine 'classicl'")
    from eval.run import main

    assert main([*BASE, "--workers", "0", "--tools", "segment=classical", "--out", str(out)]) == 0


def test_a_folder_that_scored_nothing_is_not_a_different_setup(tmp_path, capsys):
    from eval.run import main

    out = tmp_path / "run"
    manifest = tmp_path / "qa.jsonl"
    manifest.write_text(json.dumps({"id": "q0", "image_paths": [str(tmp_path / "missing.png")], "question": "Q?",
                                    "answer_type": "CLOSED", "answer": "yes"}) + "\n")
    args = ["--agent", "scripted", "--workers", "0", "--no-open-metrics", "--no-progress", "--bootstrap", "0",
            "--out", str(out)]
    assert main([*args, "--dataset", str(manifest), "--dataset-opt", "check_images=none"]) == 1  # dataset_error only
    capsys.readouterr()
    assert main([*args, "--dataset", "embedded", "--limit", "2", "--tools", "none"]) == 0  # another setup: it runs
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and not any(r["error"] for r in rows)  # the earlier unscored row is gone
    # a folder that scored something still refuses another setup
    assert main([*args, "--dataset", "embedded", "--limit", "2", "--tools", "image_zoom_in"]) == 2
    assert "holds results of a different setup (differs in ['tools'])" in capsys.readouterr().err


def test_compare_over_a_glob_reads_only_run_folders_every_time(tmp_path, capsys):
    from eval.compare import main as compare
    from eval.run import main

    runs = tmp_path / "runs"
    for name, answer in (("a", "yes"), ("b", "no")):
        assert main([*BASE, "--workers", "0", "--tools", "none", "--agent-opt", f"answer={answer}",
                     "--out", str(runs / name)]) == 0
    capsys.readouterr()
    for attempt in range(2):  # the second glob holds compare.md and compare.html
        paths = sorted(str(p) for p in runs.glob("*"))
        assert compare(paths) == 0, capsys.readouterr().err
        err = capsys.readouterr().err
        if attempt:
            assert f"note: {runs / 'compare.html'} is not a run folder; left out" in err
            assert f"note: {runs / 'compare.md'} is not a run folder; left out" in err
    assert "| a |" in (runs / "compare.md").read_text() and "| b |" in (runs / "compare.md").read_text()
