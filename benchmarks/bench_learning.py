"""The learning proofs' figures, read from their committed run data (``docs/training_runs/``).

Nothing trains here: the runs are made by ``docs/training_runs/exp3/closed.sh`` (CLOSED, rule
reward) and ``docs/training_runs/open/open.sh`` (OPEN, ARMed), and their ``metrics.jsonl`` files
are committed beside the scripts. This script turns them into named figures
(``benchmarks/results/learning.json``) so that every number ``docs/training.md`` and the README
quote about learning comes from the run files, and ``tests/test_doc_figures.py`` catches drift.

    python benchmarks/bench_learning.py
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from figures import ROOT, command_line, record, results_dir_arg

RUNS = ROOT / "docs" / "training_runs"
# (name in the figures, run folder, held-out metric that says "learned", what the setting is)
SETTINGS = [
    ("closed", "exp3", "eval/accuracy", "CLOSED, rule reward ±1, `ground=oracle`"),
    ("open_oracle", "open/oracle", "eval/open/armed_avg", "OPEN, ARMed, `ground=oracle`, all OPEN questions"),
    ("open_oracle800", "open/oracle_n800", "eval/open/armed_avg", "OPEN, ARMed, `ground=oracle`, n=800"),
    ("open_classical", "open/classical", "eval/open/armed_avg", "OPEN, ARMed, `ground=classical` (no oracle), n=800"),
    ("open_oracle_sft150", "open/oracle_sft150", "eval/open/armed_avg",
     "OPEN, ARMed, `ground=oracle`, from a 150-step SFT"),
]
LEARNED_BY = 0.05  # a seed "learned" when its held-out metric ends this far above the start


def read_run(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarise(name: str, folder: str, key: str) -> dict[str, float | int | str]:
    """Start, end (mean, std, per seed) of ``key`` and the other held-out figures over the seeds."""
    runs = sorted((RUNS / folder).glob("grpo_s*/metrics.jsonl"))
    if not runs:
        raise SystemExit(f"no runs under {RUNS / folder}: run its script and copy metrics.jsonl there")
    evals = [[r for r in read_run(p) if key in r] for p in runs]
    steps = min(e[-1]["step"] for e in evals)
    fig: dict[str, float | int | str] = {"seeds": len(runs), "steps": steps}
    keys = {"metric": key, "accuracy": "eval/accuracy", "calls": "eval/calls_per_episode"}
    if key != "eval/accuracy":
        keys["exact_match"] = "eval/open/exact_match"
    for label, k in keys.items():
        start = [e[0][k] for e in evals]
        end = [next(r for r in e if r["step"] == steps)[k] for e in evals]
        fig[f"{label}.start"] = statistics.mean(start)
        fig[f"{label}.end_mean"] = statistics.mean(end)
        fig[f"{label}.end_std"] = statistics.pstdev(end)
        fig[f"{label}.end_seeds"] = ", ".join(f"{v:.3f}" for v in end)
        fig[f"{label}.end_min"], fig[f"{label}.end_max"] = min(end), max(end)
        if label == "metric":
            fig["learned"] = sum(e > s + LEARNED_BY for s, e in zip(start, end))
    last = [read_run(p)[-1] for p in runs]
    walls = [r["time/wall_s"] for r in last if "time/wall_s" in r]
    if walls:
        fig["wall_s.min"], fig["wall_s.max"] = min(walls), max(walls)
    thresholds = [[r for r in read_run(p) if "reward/threshold_bertscore" in r] for p in runs]
    if all(thresholds):
        fig["threshold_bertscore.first"] = statistics.mean(t[0]["reward/threshold_bertscore"] for t in thresholds)
        fig["threshold_bertscore.last"] = statistics.mean(t[-1]["reward/threshold_bertscore"] for t in thresholds)
        fig["threshold_cosine.last"] = statistics.mean(t[-1]["reward/threshold_cosine"] for t in thresholds)
    sft = RUNS / folder / "sft" / "metrics.jsonl"
    if sft.is_file():  # the warm start's own held-out curve: what more SFT alone gives
        curve = [r for r in read_run(sft) if key in r]
        fig["sft.steps"] = curve[-1]["step"]
        fig["sft.metric.last"] = curve[-1][key]
        fig["sft.metric.best"] = max(r[key] for r in curve)
    return {f"{name}.{k}": v for k, v in fig.items()}


VERL_VS_NATIVE = ("verl_open", "verl_cpu/open_sft60")  # verl's trainer on CPU beside the native one


def _plot_script():
    """``scripts/plot_verl_vs_native.py`` as a module: its readers of verl and native run folders."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("plot_verl_vs_native", ROOT / "scripts" / "plot_verl_vs_native.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verl_vs_native(name: str, folder: str) -> dict[str, float | int]:
    """Held-out accuracy and reward of the verl run and each native seed: start, end, best."""
    plot = _plot_script()
    curves = {"verl": plot.verl_curve(RUNS / folder / "verl")}
    for run in sorted((RUNS / folder).glob("native_s*")):
        curves[run.name] = plot.native_curve(run)
    fig: dict[str, float | int] = {}
    for label, curve in curves.items():
        if not curve:
            continue
        steps = sorted(curve)
        fig[f"{label}.steps"] = steps[-1]
        for i, metric in enumerate(("accuracy", "reward")):
            fig[f"{label}.{metric}.start"] = curve[steps[0]][i]
            fig[f"{label}.{metric}.end"] = curve[steps[-1]][i]
            fig[f"{label}.{metric}.best"] = max(curve[s][i] for s in steps)
    return {f"{name}.{k}": v for k, v in fig.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = ap.parse_args(argv)
    figures: dict = {}
    rows = ["| setting | seeds | held-out metric | start | end (mean ± std) | per seed | seeds that learned |",
            "|---|---:|---|---:|---:|---|---:|"]
    for name, folder, key, what in SETTINGS:
        f = summarise(name, folder, key)
        figures.update(f)
        rows.append(f"| {what} (`docs/training_runs/{folder}`) | {f[name + '.seeds']} | `{key}` | "
                    f"{f[name + '.metric.start']:.3f} | {f[name + '.metric.end_mean']:.3f} ± "
                    f"{f[name + '.metric.end_std']:.3f} | {f[name + '.metric.end_seeds']} | {f[name + '.learned']} |")
    if (RUNS / VERL_VS_NATIVE[1] / "verl").is_dir():
        figures.update(verl_vs_native(*VERL_VS_NATIVE))
    section = "\n".join([
        "## Learning (from the committed run data)", "",
        "Held-out (greedy) metric at step 0 and at the last step of each GRPO seed; a seed *learned* when",
        f"it ends more than {LEARNED_BY} above the start. Scripts: `docs/training_runs/exp3/closed.sh`,",
        "`docs/training_runs/open/open.sh`; discussion in `docs/training.md`.", "", *rows, ""])
    record("learning", section, figures, command_line("bench_learning.py", argv),
           results_dir_arg(False, args.results))


if __name__ == "__main__":
    main()
