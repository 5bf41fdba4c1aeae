"""The demo (``bash scripts/demo.sh`` = ``python -m eval.demo``): its table has a row with the
trained tools when asked (``--trained-tools``), and says how to get it when not."""

from __future__ import annotations

import pytest

from eval.compare import comparison_table
from eval.demo import TRAINED_RUN, evaluate_baselines, main

pytest.importorskip("torch")
# the trained engines' options for a test: a few steps on a few images (the demo uses the defaults)
TINY_TRAINED = {"steps": 2, "dataset_options": {"n": 48}, "val_options": {"n": 8}}


@pytest.mark.slow
def test_the_demo_table_has_a_row_with_the_trained_tools(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDVQA_CACHE", str(tmp_path / "cache"))  # the trained tools are built here, not in ~/.cache
    runs = evaluate_baselines(tmp_path / "out", limit=3, workers=0, trained=TINY_TRAINED)
    names = [name for name, _ in runs]
    assert names == ["random", "prior", "tools(classical)", "tools(oracle)", TRAINED_RUN, "oracle agent"]
    summary = dict(runs)[TRAINED_RUN]
    assert summary.run["tools"]["ground"]["engine"] == "trained" and summary.run["tools"]["classify"]["engine"] == "trained"
    assert summary.n_episodes == 3 and summary.overall.tool_calls_per_episode.value > 0
    assert f"| {TRAINED_RUN} | 3 |" in comparison_table(runs)


def test_without_the_flag_the_demo_says_how_to_get_the_trained_row(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--limit", "2", "--workers", "0"]) == 0
    out = capsys.readouterr().out
    assert "| tools(oracle) | 2 |" in out and f"| {TRAINED_RUN} |" not in out
    assert "Add --trained-tools for a tools(trained) row" in out
