"""The docs quote only recorded figures, and name only files that exist.

Figures in README.md, RELIABILITY.md and docs/ sit inside ``<!-- fig <topic>.<name> <format> -->``
markers that ``python benchmarks/run_all.py`` (or ``python benchmarks/figures.py``) regenerates from
``benchmarks/results/<topic>.json``; BENCHMARKS.md is assembled from ``benchmarks/results/<topic>.md``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "benchmarks" / "figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)


def test_every_quoted_figure_matches_the_results():
    problems = figures.stale()
    assert not problems, "stale figures (run `python benchmarks/run_all.py --docs-only`):\n" + "\n".join(problems)


def test_every_path_a_doc_names_exists():
    assert not figures.missing_paths(), figures.missing_paths()


def test_the_docs_quote_figures_through_markers():
    quoted = [m.group("key") for f in figures.doc_files() for m in figures.markers(f.read_text())]
    topics = {k.split(".", 1)[0] for k in quoted}
    assert {"tools", "rewards", "eval", "verl_rollout", "learning", "learning_early", "vqarad_baselines"} <= topics, \
        sorted(topics)


def test_benchmarks_md_holds_every_recorded_section():
    bench = (ROOT / "BENCHMARKS.md").read_text()
    for md in sorted((ROOT / "benchmarks" / "results").glob("*.md")):
        title, _, body = md.read_text().strip().partition("\n")
        assert title in bench, f"{md.name}: section missing from BENCHMARKS.md (run benchmarks/run_all.py --docs-only)"
        assert body.strip() in bench, f"{md.name} differs from its section in BENCHMARKS.md"


def test_every_results_file_names_its_command_and_figures():
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        assert data["meta"]["command"].startswith("python "), path.name
        assert data["figures"], path.name
        assert (path.with_suffix(".md")).is_file(), f"{path.name} has no Markdown section beside it"


# -- the mechanism itself, on a scratch results folder ----------------------------------------------
@pytest.fixture
def scratch(tmp_path):
    results = tmp_path / "results"
    figures.record("demo", "## Demo\n\n| a | b |", {"segment.overhead_ms": 2.345, "calls": 10318, "gone": float("nan")},
                   "python benchmarks/bench_demo.py", results)
    doc = tmp_path / "doc.md"
    return results, doc


def test_a_wrong_number_in_a_doc_is_reported_and_rewritten(scratch, capsys):
    results, doc = scratch
    doc.write_text("over in-process: <!-- fig demo.segment.overhead_ms +.1f -->+5.3<!-- /fig --> ms, "
                   "<!-- fig demo.calls ,d -->10,318<!-- /fig --> calls\n")
    problems = figures.stale([doc], results)
    assert len(problems) == 1 and "'+5.3' in the doc, '+2.3' in the results" in problems[0]
    assert figures.update_docs([doc], results) == []
    assert figures.stale([doc], results) == []
    assert "<!-- fig demo.segment.overhead_ms +.1f -->+2.3<!-- /fig --> ms" in doc.read_text()


def test_an_unknown_figure_or_format_is_a_problem(scratch):
    results, doc = scratch
    doc.write_text("<!-- fig demo.nope -->1<!-- /fig --> and <!-- fig demo.calls .1q -->1<!-- /fig -->\n")
    problems = figures.stale([doc], results)
    assert any("unknown figure 'demo.nope'" in p for p in problems)
    assert any("cannot be printed with '.1q'" in p for p in problems)


def test_a_figure_that_was_not_finite_prints_as_missing(scratch):
    results, doc = scratch
    assert json.loads((results / "demo.json").read_text())["figures"]["gone"] is None
    doc.write_text("<!-- fig demo.gone .2f -->0<!-- /fig -->\n")
    figures.update_docs([doc], results)
    assert ">n/a<" in doc.read_text()


def test_a_generated_block_is_reported_and_rewritten(scratch):
    results, _ = scratch
    doc = results.parent / "block.md"
    figures.record("tab", "## Tab", {"table": "| a |\n|---|\n| 2 |"}, "python benchmarks/bench_tab.py", results)
    doc.write_text("before\n<!-- fig-block tab.table -->\n| a |\n|---|\n| 1 |\n<!-- /fig-block -->\nafter\n")
    problems = figures.stale([doc], results)
    assert len(problems) == 1 and "'| 1 |' in the doc, '| 2 |' in the results" in problems[0], problems
    assert figures.update_docs([doc], results) == []
    assert doc.read_text() == "before\n<!-- fig-block tab.table -->\n| a |\n|---|\n| 2 |\n<!-- /fig-block -->\nafter\n"
    assert figures.stale([doc], results) == []
    doc.write_text("<!-- fig-block tab.nope -->\nx\n<!-- /fig-block -->\n")
    assert any("unknown figure 'tab.nope'" in p for p in figures.stale([doc], results))


def test_a_quick_run_keeps_no_results_unless_told_where():
    assert figures.results_dir_arg(True, None) is None
    assert figures.results_dir_arg(False, None) == figures.RESULTS
    assert figures.results_dir_arg(True, "/tmp/x") == Path("/tmp/x")


def test_every_benchmark_takes_quick():
    """``run_all.py --quick`` passes ``--quick`` to every ``bench_*.py``: each must accept it."""
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        assert '"--quick"' in script.read_text(), f"{script.name} has no --quick option (run_all.py --quick passes one)"


def test_paths_in_docs_are_found_in_code_spans_and_links_only():
    text = "Run `tests/eval/test_nope.py` (see [data](benchmarks/runs/)); eval/accuracy, `tests/test_*.py`"
    assert figures.named_paths(text) == ["tests/eval/test_nope.py", "benchmarks/runs"]


def test_learning_figures_are_what_the_committed_run_files_say(tmp_path, monkeypatch):
    """``benchmarks/results/learning.json`` is derived from ``benchmarks/runs/``: a run file
    changed without rerunning ``bench_learning.py`` (or a hand-edited figure) fails here."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "benchmarks" / "bench_learning.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--results", str(tmp_path)])
    fresh = json.loads((tmp_path / "learning.json").read_text())["figures"]
    recorded = json.loads((ROOT / "benchmarks" / "results" / "learning.json").read_text())["figures"]
    assert fresh == recorded


def test_the_verl_closed_figures_are_what_verls_run_files_say():
    """Spot checks of ``learning.verl_closed.*`` (docs/verl.md's CLOSED comparison), read straight from
    the committed verl and native run files, independent of ``bench_learning.py``'s helpers."""
    recorded = json.loads((ROOT / "benchmarks" / "results" / "learning.json").read_text())["figures"]
    runs = ROOT / "benchmarks" / "runs" / "verl_cpu"
    for start in ("sft1", "sft2"):
        rows = [json.loads(line) for line in (runs / start / "verl" / "metrics.jsonl").read_text().splitlines()]
        train = [r["data"] for r in rows if "actor/grad_norm" in r["data"]]
        key = f"verl_closed.{start}.verl."
        assert recorded[key + "trained_steps"] == rows[-1]["step"]
        assert recorded[key + "grad_norm.max"] == max(d["actor/grad_norm"] for d in train)
        assert recorded[key + "probs_diff.max"] == max(d["training/rollout_probs_diff_max"] for d in train)
        assert recorded[key + "score.first"] == train[0]["critic/score/mean"]
        assert recorded[key + "step_s.max"] == max(d["timing_s/step"] for d in train)
        val = [r["data"] for r in rows if "val-core/medvqa/embedded/acc/mean@1" in r["data"]]  # verl's own summary
        assert recorded[key + "accuracy.start"] == pytest.approx(val[0]["val-core/medvqa/embedded/acc/mean@1"])
        assert recorded[key + "accuracy.end"] == pytest.approx(val[-1]["val-core/medvqa/embedded/acc/mean@1"])
        sft = (runs / start / "sft" / "metrics.jsonl").read_text().splitlines()
        assert recorded[f"verl_closed.{start}.sft.steps"] == json.loads(sft[-1])["step"]
        for seed in sorted((runs / start).glob("native_s*")):
            native = [json.loads(line) for line in (seed / "metrics.jsonl").read_text().splitlines()]
            evals = [r for r in native if "eval/accuracy" in r]
            assert recorded[f"verl_closed.{start}.{seed.name}.accuracy.end"] == evals[-1]["eval/accuracy"]
            assert recorded[f"verl_closed.{start}.{seed.name}.calls.first"] == native[1]["tools/calls_per_episode"]
    assert "| SFT 60 steps (`sft1`) | verl on CPU | 30 |" in recorded["verl_closed.table"]


def test_the_verl_open_figures_are_what_verls_run_files_say():
    """Spot checks of ``learning.verl_open_sft40.*`` (docs/verl.md's 15-step OPEN comparison) and of the
    sampled tool calls quoted in docs/training.md, read straight from the committed run files,
    independent of ``bench_learning.py``'s helpers."""
    recorded = json.loads((ROOT / "benchmarks" / "results" / "learning.json").read_text())["figures"]
    run = ROOT / "benchmarks" / "runs" / "verl_cpu" / "open"
    rows = [json.loads(line) for line in (run / "verl" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "actor/grad_norm" in r["data"]]
    key = "verl_open_sft40.verl."
    assert recorded[key + "trained_steps"] == rows[-1]["step"]
    assert recorded[key + "grad_norm.min"] == min(r["data"]["actor/grad_norm"] for r in train)
    assert recorded[key + "grad_norm.max"] == max(r["data"]["actor/grad_norm"] for r in train)
    assert recorded[key + "kl_loss.max"] == max(r["data"]["actor/kl_loss"] for r in train)
    assert recorded[key + "probs_diff.max"] == max(r["data"]["training/rollout_probs_diff_max"] for r in train)
    best = max(train, key=lambda r: r["data"]["critic/score/mean"])
    assert recorded[key + "score.max"] == best["data"]["critic/score/mean"]
    assert recorded[key + "score.max_step"] == best["step"]
    val = [r["data"] for r in rows if "val-core/medvqa/embedded/acc/mean@1" in r["data"]]  # verl's own summary
    assert recorded[key + "accuracy.start"] == pytest.approx(val[0]["val-core/medvqa/embedded/acc/mean@1"])
    assert recorded[key + "reward.start"] == pytest.approx(val[0]["val-aux/medvqa/embedded/reward/mean@1"])
    assert recorded[key + "reward.end"] == pytest.approx(val[-1]["val-aux/medvqa/embedded/reward/mean@1"])
    episodes = [json.loads(line) for line in (run / "verl" / "episodes" / "validation.jsonl").read_text().splitlines()]
    assert recorded[key + "answers.distinct_max"] == max(
        len({e["answer"] for e in episodes if e["global_steps"] == s}) for s in {e["global_steps"] for e in episodes})
    assert recorded[key + "eval_tool_calls"] == sum(e["num_tool_calls"] for e in episodes)
    state = json.loads((run / "verl" / "medvqa_reward_state.json").read_text())["OPEN"]["thresholds"]
    assert recorded[key + "reward_state.updates"] == state["updates"]
    assert recorded[key + "reward_state.threshold_bertscore"] == state["thresholds"]["bertscore"]
    native = [json.loads(line) for line in (run / "native_s0" / "metrics.jsonl").read_text().splitlines()]
    assert recorded["verl_open_sft40.native_s0.calls.max"] == max(
        r["tools/calls_per_episode"] for r in native if "tools/calls_per_episode" in r)
    sft = (run / "sft" / "metrics.jsonl").read_text().splitlines()
    assert recorded["verl_open_sft40.sft.steps"] == json.loads(sft[-1])["step"]
    assert "| verl on CPU | 0.140 -> 0.140 -> 0.140 -> 0.140 |" in recorded["verl_open_sft40.table"]
    seeds = sorted((ROOT / "benchmarks" / "runs" / "open" / "classical").glob("grpo_s*/metrics.jsonl"))
    calls = [[json.loads(line)["tools/calls_per_episode"] for line in p.read_text().splitlines()
              if "tools/calls_per_episode" in line] for p in seeds]
    assert recorded["open_classical.sampled_calls.first"] == pytest.approx(sum(c[0] for c in calls) / len(calls))
    assert recorded["open_classical.sampled_calls.max"] == max(max(c) for c in calls)


def _bench_module(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_early_learning_figures_are_what_the_committed_run_files_say(tmp_path, monkeypatch):
    """``benchmarks/results/learning_early.json`` (experiments 1 and 2, SmolLM2: what
    ``docs/training.md`` quotes about them) is derived from ``benchmarks/runs/exp1``, ``exp2`` and
    ``smollm2``: a changed run file or a hand-edited figure fails here."""
    _bench_module("bench_learning_early", monkeypatch).main(["--results", str(tmp_path)])
    fresh = json.loads((tmp_path / "learning_early.json").read_text())["figures"]
    recorded = json.loads((ROOT / "benchmarks" / "results" / "learning_early.json").read_text())["figures"]
    assert fresh == recorded
    # spot checks read straight from the run files, independent of the script's helpers
    runs = ROOT / "benchmarks" / "runs"
    ends = []
    for path in sorted((runs / "exp2").glob("grpo_s*/metrics.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        evals = [r for r in rows if "eval/accuracy" in r]
        ends.append(evals[-1]["eval/accuracy"])
        assert recorded[f"exp2.grpo.{path.parent.name.split('_')[1]}.wall_s"] == rows[-1]["time/wall_s"]
    assert recorded["exp2.grpo.seeds"] == len(ends)
    assert recorded["exp2.grpo.acc.end_mean"] == pytest.approx(sum(ends) / len(ends))
    smol = [json.loads(line) for line in (runs / "smollm2" / "grpo_s0" / "metrics.jsonl").read_text().splitlines()]
    assert recorded["smollm2.grpo.eval10.acc"] == smol[-1]["eval/accuracy"]


def test_the_vqarad_benchmark_refuses_without_the_dataset(tmp_path, monkeypatch, capsys):
    bench = _bench_module("bench_vqarad_baselines", monkeypatch)
    results = tmp_path / "results"
    assert bench.main(["--root", str(tmp_path / "absent"), "--results", str(results)]) == 1
    assert "VQA-RAD is not under" in capsys.readouterr().err
    assert not results.exists()
