"""Issue 46's generalisation task: the CLOSED record's policies, as trained, on the ``test_ood`` split.

``test_ood`` holds test-like scenes asked in wordings no other split uses (``medvqa_env/datasets/
embedded.py``: ``OOD_WORDINGS``). The literature places RL's edge over imitation there (SFT memorises,
RL generalises). Nothing is trained or chosen here: every final policy of the CLOSED record (GRPO and
each trained baseline, seed k on tool build k, and each build's val-chosen warm start) is evaluated
greedily on the first ``--eval-size`` CLOSED questions of ``test_ood`` with the protocol's own env
settings (``train.evaluate``; the no-tool baseline without tools, as it was trained), every answer is
stored, and the figures are recomputed from the stored answers: accuracy per seed, GRPO minus each
row paired over the seeds (the same build and warm start), and whether GRPO beats every one.

    python benchmarks/bench_ood.py --run runs/protocol/closed   # evaluate (resumable), export, derive
    python benchmarks/bench_ood.py                              # derive from the committed answers
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import gzip
import json
import sys
from pathlib import Path

from figures import ROOT, command_line, record, results_dir_arg

RUNS = ROOT / "benchmarks" / "runs" / "protocol" / "closed_independent_ood"
ROWS = ("grpo", "tool_sft", "notool_sft", "imperfect_sft", "rft", "more_sft", "warm")
"""GRPO first; ``warm``: each build's val-chosen warm start (the checkpoint GRPO started from)."""
LABELS = {"grpo": "**GRPO** from the val-chosen warm start", "tool_sft": "tool SFT from scratch",
          "notool_sft": "no-tool SFT from scratch", "imperfect_sft": "SFT on imperfect demonstrations",
          "rft": "rejection-sampling FT", "more_sft": "more SFT", "warm": "warm start alone"}


def policy_of(run: Path, row: str, seed: int, build: int) -> Path:
    if row == "warm":
        return run / json.loads((run / f"warm_start_b{build}.json").read_text())["checkpoint"]
    return run / f"{row}_s{seed}" / "final"


def evaluate_rows(run: Path, seeds: list[int], eval_size: int, dest: Path) -> None:
    """``train.evaluate`` of every row's policy on test_ood (finished ones skipped), then export the answers."""
    from train.protocol import _common, build_of, export, recorded_args
    from train.protocol import run as run_module

    args = recorded_args(json.loads((run / "protocol_args.json").read_text()), run)
    for seed in seeds:
        build = build_of(args, seed)
        for row in ROWS:
            if row == "warm" and seed != build:
                continue
            name = f"ood_{row}_s{seed}"
            common = _common(args, tools="none") if row == "notool_sft" else _common(args, build=build)
            run_module(run, name, "train.evaluate", ["--policy", str(policy_of(run, row, seed, build)), "--split",
                                                     "test_ood", "--eval_size", str(eval_size),
                                                     "--out", str(run / name / "eval.json"), *common])
    export(run, dest, only="ood")  # the protocol's own export: paths made relative, answers gzipped


def stored_answers(folder: Path) -> dict[str, bool]:
    """record id -> right, from a run's stored answers (untagged: the real image)."""
    rows = [json.loads(line) for line in gzip.decompress((folder / "eval.answers.jsonl.gz").read_bytes()).splitlines()]
    return {r["record_id"]: bool(r["correct"]) for r in rows if r["tag"] is None}


def derive(runs: Path) -> tuple[dict, str]:
    from train.protocol import compare, t_interval

    acc: dict[str, dict[int, float]] = {}
    calls: dict[str, list[float]] = {}
    answered: dict[str, list[float]] = {}
    questions = set()
    for folder in sorted(runs.glob("ood_*_s*")):
        row, seed = folder.name.removeprefix("ood_").rsplit("_s", 1)
        right = stored_answers(folder)
        questions.add(len(right))
        acc.setdefault(row, {})[int(seed)] = sum(right.values()) / len(right)
        metrics = json.loads((folder / "eval.json").read_text())["metrics"]
        calls.setdefault(row, []).append(float(metrics.get("eval/calls_per_episode", float("nan"))))
        answered.setdefault(row, []).append(float(metrics.get("eval/answered", float("nan"))))
    fig: dict = {"questions": max(questions) if questions else 0}
    lines = ["| run | seeds | test_ood accuracy, mean [95% CI] | per seed | greedy tool calls / ep | answered (boxed), per seed "
             "| GRPO − run, paired [95% CI] |", "|---|---:|---|---|---:|---|---|"]
    beats = []
    for row in ROWS:
        values = acc.get(row)
        if not values:
            continue
        mean, _, low, high = t_interval(list(values.values()))
        fig[f"{row}.mean"], fig[f"{row}.seeds"] = mean, len(values)
        fig[f"{row}.per_seed"] = ", ".join(f"{v:.3f}" for _, v in sorted(values.items()))
        fig[f"{row}.calls_per_episode"] = sum(calls[row]) / len(calls[row])
        fig[f"{row}.answered_per_seed"] = ", ".join(f"{v:.2f}" for v in answered[row])
        cell = "–"
        if row != "grpo" and "grpo" in acc:
            c = compare(acc["grpo"], values)
            d = c.get("paired")
            if d:
                fig[f"grpo_minus.{row}.difference"], fig[f"grpo_minus.{row}.ci_low"] = d["difference"], d["ci_low"]
                fig[f"grpo_minus.{row}.ci_high"], fig[f"grpo_minus.{row}.beats"] = d["ci_high"], bool(d["beats"])
                cell = f"{d['difference']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"
                beats.append(bool(d["beats"]))
        interval = f"{mean:.3f} [{low:.3f}, {high:.3f}]" if len(values) > 1 else f"{mean:.3f}"
        lines.append(f"| {LABELS[row]} | {len(values)} | {interval} | {fig[f'{row}.per_seed']} | "
                     f"{fig[f'{row}.calls_per_episode']:.2f} | {fig[f'{row}.answered_per_seed']} | {cell} |")
    fig["beats_every_baseline"] = bool(beats) and all(beats)
    fig["table"] = "\n".join(lines)
    return fig, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="", help="the train.protocol CLOSED folder whose final policies to evaluate")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="seeds (seed k on the protocol's build k)")
    ap.add_argument("--eval-size", type=int, default=200, help="test_ood CLOSED questions")
    ap.add_argument("--quick", action="store_true", help="print only, keep nothing")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    a = ap.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if a.run:
        evaluate_rows(Path(a.run), [int(s) for s in a.seeds.split(",")], a.eval_size, RUNS)
    if not RUNS.is_dir():
        print(f"no test_ood answers under {RUNS}: python benchmarks/bench_ood.py --run runs/protocol/closed",
              file=sys.stderr)
        return 1
    fig, table = derive(RUNS)
    lines = ["## Issue 46's generalisation task: the CLOSED record's policies on `test_ood` (from the stored answers)",
             "", f"Every final policy of `closed_independent`, as trained, on the first {fig['questions']} CLOSED questions "
             "of `test_ood` (wordings no other split uses), greedy; paired over seeds (seed k on tool build k).", "",
             table, "", f"GRPO beats every row: {fig['beats_every_baseline']}.", ""]
    record("ood", "\n".join(lines), fig, command_line("bench_ood.py", argv), results_dir_arg(a.quick, a.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
