"""``eval.run --image-ablation``: the same run with the images blanked or swapped, and the drop."""

from __future__ import annotations

import json

import pytest

from eval.run import main
from eval.runner import EvalConfig, evaluate
from medvqa_env.datasets import load_dataset

EMBEDDED = ["--dataset", "embedded", "--split", "test", "--limit", "24", "--workers", "0", "--progress", "false",
            "--bootstrap", "0"]


def run(tmp_path, name, *argv):
    out = tmp_path / name
    assert main(["--out", str(out), *EMBEDDED, *argv]) == 0
    return json.loads((out / "summary.json").read_text()), out


def test_an_agent_that_reads_the_tools_drops_without_the_image(tmp_path):
    summary, out = run(tmp_path, "tools", "--agent", "zoom-then-answer", "--agent-opt", "fit_on=embedded:train",
                       "--tools", "image_zoom_in,ground=oracle,classify=oracle", "--image-ablation", "blank,shuffle")
    abl = summary["image_ablation"]
    assert set(abl) == {"blank", "shuffle"}
    for mode in ("blank", "shuffle"):
        assert (out / f"ablation_{mode}" / "episodes.jsonl").is_file()
        closed = abl[mode]["closed_accuracy"]
        assert closed["normal"] == pytest.approx(summary["overall"]["closed_accuracy"]["value"])
        assert closed["drop"] == pytest.approx(closed["normal"] - closed["ablated"])
        assert closed["drop"] > 0.2  # oracle tools on a blank or foreign image say the wrong thing
        rows = [json.loads(line) for line in (out / f"ablation_{mode}" / "episodes.jsonl").read_text().splitlines()]
        assert len(rows) == 24 and all(r["error"] is None for r in rows)
    assert "Image ablation: blank" in (out / "report.md").read_text()


def test_an_agent_that_never_looks_loses_nothing(tmp_path):
    summary, _ = run(tmp_path, "prior", "--agent", "prior", "--agent-opt", "fit_on=embedded:train",
                     "--image-ablation", "blank")
    for name, v in summary["image_ablation"]["blank"].items():
        if isinstance(v, dict) and v["normal"] is not None:
            assert v["drop"] == pytest.approx(0.0), name


def test_a_rerun_resumes_both_runs_and_the_normal_run_is_unchanged(tmp_path):
    ds = load_dataset("embedded", split="test")
    from agents.baselines import AnswerPriorAgent

    agent = AnswerPriorAgent().fit(load_dataset("embedded", split="train"))
    cfg = EvalConfig(limit=12, workers=0, progress=False, bootstrap=0, tools={"ground": {"engine": "oracle"}})
    plain = evaluate(agent, ds, cfg, out_dir=tmp_path / "a")
    cfg.image_ablation = "shuffle"
    first = evaluate(agent, ds, cfg, out_dir=tmp_path / "a")  # the normal rows are resumed, not rerun
    assert first.overall.closed_accuracy == plain.overall.closed_accuracy
    again = evaluate(agent, ds, cfg, out_dir=tmp_path / "a")
    assert again.image_ablation == first.image_ablation
    assert again.run["image_ablation"] is None  # the normal run's identity is the plain run's
    ablated_run = json.loads((tmp_path / "a" / "ablation_shuffle" / "run.json").read_text())
    assert ablated_run["image_ablation"] == "shuffle"


def test_answer_diversity_shows_a_constant_answer(tmp_path):
    summary, _ = run(tmp_path, "const", "--agent", "prior", "--agent-opt", "fit_on=embedded:train",
                     "--agent-opt", "max_words=0")
    closed = summary["answer_diversity"]["CLOSED"]
    assert closed["distinct"] == 1 and closed["top_share"] == 1.0 and closed["entropy_bits"] == 0.0


def test_unknown_mode_is_a_user_error(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "x"), *EMBEDDED, "--agent", "prior", "--image-ablation", "blur"]) == 2
    assert "medvqa-eval: error: Unknown image ablation 'blur'" in capsys.readouterr().err
    assert not (tmp_path / "x" / "episodes.jsonl").exists()  # refused before any episode ran
