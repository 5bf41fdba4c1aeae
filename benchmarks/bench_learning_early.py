"""The early learning runs' figures, read from their committed run data (``benchmarks/runs/``).

Nothing trains here. Experiments 1 and 2 (CLOSED questions, rule reward, before the objective fix
of issue 10; ``benchmarks/runs/exp1``, ``exp2``: an SFT run and GRPO/GRASP seeds each) and the
short SmolLM2-135M run (``benchmarks/runs/smollm2``: SFT, then one GRPO seed) were trained once
and their ``metrics.jsonl`` files committed. This script turns them into named figures
(``benchmarks/results/learning_early.json``) so that every number ``docs/training.md`` quotes about
them comes from the run files, and ``tests/test_doc_figures.py`` catches drift. The figures of the
later runs (experiment 3, OPEN) are ``bench_learning.py``'s.

Held-out figures are the greedy evaluations the trainer logs every ``eval_every`` steps; "±" is the
sample standard deviation over seeds; wall seconds are the trainer's own ``time/wall_s`` at its last
step (the run, without process start-up); a seed *learned* when its held-out accuracy ends more
than ``LEARNED_BY`` above its start. The runs' CPU seconds were not logged, so none are given.

    python benchmarks/bench_learning_early.py
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import statistics
from pathlib import Path

from bench_learning import LEARNED_BY, RUNS, read_run
from figures import command_line, record, results_dir_arg

EXPERIMENTS = ("exp1", "exp2")
ALGOS = (("grpo", "GRPO"), ("grasp", "GRASP"))
LAST = 5  # training steps averaged for "at the end" of a noisy per-step curve
FIRST_SEEDS = 3  # experiment 2's first batch of seeds (the others were added later)


def _seeds(folder: Path, algo: str) -> dict[int, list[dict]]:
    runs = sorted(folder.glob(f"{algo}_s*/metrics.jsonl"), key=lambda p: int(p.parent.name.rsplit("_s", 1)[1]))
    if not runs:
        raise SystemExit(f"no {algo} runs under {folder}")
    return {int(p.parent.name.rsplit("_s", 1)[1]): read_run(p) for p in runs}


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _evals(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "eval/accuracy" in r]


def _train(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "rollout/reward_mean" in r]


def _seed_list(values) -> str:
    return ", ".join(str(v) for v in values)


def rl_figures(exp: str, algo: str) -> dict[str, float | int | str | None]:
    """Held-out accuracy and reward at the start and end of each seed, when each seed learned or
    first called the tool (greedy), sampled tool calls and training reward early and late, wall."""
    seeds = _seeds(RUNS / exp, algo)
    fig: dict[str, float | int | str | None] = {"seeds": len(seeds)}
    evals = {s: _evals(rows) for s, rows in seeds.items()}
    train = {s: _train(rows) for s, rows in seeds.items()}
    fig["steps"] = min(e[-1]["step"] for e in evals.values())
    for label, key in (("acc", "eval/accuracy"), ("reward", "eval/reward_mean")):
        start = [e[0][key] for e in evals.values()]
        end = [e[-1][key] for e in evals.values()]
        fig[f"{label}.start"] = statistics.mean(start)
        fig[f"{label}.start_min"], fig[f"{label}.start_max"] = min(start), max(start)
        fig[f"{label}.end_mean"], fig[f"{label}.end_std"] = statistics.mean(end), _std(end)
        fig[f"{label}.end_min"], fig[f"{label}.end_max"] = min(end), max(end)
        fig[f"{label}.end_seeds"] = ", ".join(f"{v:.3f}" for v in end)
    learned = [s for s, e in evals.items() if e[-1]["eval/accuracy"] > e[0]["eval/accuracy"] + LEARNED_BY]
    stayed = [s for s in evals if s not in learned]
    fig["learned"], fig["not_learned"] = len(learned), len(stayed)
    fig["learned_seeds"], fig["not_learned_seeds"] = _seed_list(learned), _seed_list(stayed)
    # the jump of a seed that learned, the wobble of one that did not (largest change between evaluations)
    fig["jump.max"] = max((evals[s][-1]["eval/accuracy"] - evals[s][0]["eval/accuracy"] for s in learned),
                          default=None)
    wobble = [abs(b["eval/accuracy"] - a["eval/accuracy"]) for s in stayed for a, b in zip(evals[s], evals[s][1:])]
    fig["wobble.max"] = max(wobble, default=None)
    for s, e in evals.items():
        start = e[0]["eval/accuracy"]
        fig[f"s{s}.learned_at"] = next((r["step"] for r in e if r["eval/accuracy"] > start + LEARNED_BY), None)
        fig[f"s{s}.first_call_at"] = next((r["step"] for r in e if r["eval/calls_per_episode"] >= 0.5), None)
        fig[f"s{s}.acc.end"] = e[-1]["eval/accuracy"]
        fig[f"s{s}.wall_s"] = seeds[s][-1].get("time/wall_s")
    walls = [rows[-1]["time/wall_s"] for rows in seeds.values() if "time/wall_s" in rows[-1]]
    fig["wall_s.min"], fig["wall_s.max"] = min(walls), max(walls)
    # sampled (training) tool calls and training reward: step 1 and the mean of the last LAST steps
    for label, key in (("calls", "tools/calls_per_episode"), ("train_reward", "rollout/reward_mean")):
        fig[f"{label}.first"] = statistics.mean(t[0][key] for t in train.values())
        late = {s: statistics.mean(r[key] for r in t[-LAST:]) for s, t in train.items()}
        fig[f"{label}.last{LAST}"] = statistics.mean(late.values())
        if learned:
            fig[f"{label}.last{LAST}.learned_min"] = min(late[s] for s in learned)
            fig[f"{label}.last{LAST}.learned_max"] = max(late[s] for s in learned)
    # when the sampled policy stopped calling the tool (every seed at zero at least once by this step)
    zero = [next((r["step"] for r in t if r["tools/calls_per_episode"] == 0), None) for t in train.values()]
    fig["calls.zero_by"] = max(zero) if None not in zero else None
    fig["calls.max"] = max(r["tools/calls_per_episode"] for t in train.values() for r in t)
    fig["calls.after10"] = statistics.mean(r["tools/calls_per_episode"] for t in train.values() for r in t
                                           if r["step"] > 10)
    if len(seeds) > FIRST_SEEDS:  # the first batch of seeds alone (what the first write-up saw)
        first = sorted(seeds)[:FIRST_SEEDS]
        end = [evals[s][-1]["eval/accuracy"] for s in first]
        fig["first3.learned"] = sum(1 for s in first if s in learned)
        fig["first3.acc.end_mean"], fig["first3.acc.end_std"] = statistics.mean(end), _std(end)
        fig["first3.gain"] = statistics.mean(end) - statistics.mean(evals[s][0]["eval/accuracy"] for s in first)
        later = sorted(seeds)[FIRST_SEEDS:]
        fig["later.wall_s.min"] = min(seeds[s][-1]["time/wall_s"] for s in later)
        fig["later.wall_s.max"] = max(seeds[s][-1]["time/wall_s"] for s in later)
    return fig


def sft_figures(folder: Path) -> dict[str, float | int]:
    """The warm start's held-out figures at step 0 and at its last step, its steps and wall time."""
    rows = read_run(folder / "sft" / "metrics.jsonl")
    evals = _evals(rows)
    fig: dict[str, float | int] = {"steps": evals[-1]["step"], "wall_s": rows[-1]["time/wall_s"]}
    fig["step_s"] = fig["wall_s"] / fig["steps"]
    for label, key in (("acc", "eval/accuracy"), ("format", "eval/format_ok"), ("calls", "eval/calls_per_episode")):
        fig[f"{label}.start"], fig[f"{label}.end"] = evals[0][key], evals[-1][key]
    return fig


def smollm2_grpo() -> dict[str, float | int | str | None]:
    """SmolLM2's one GRPO seed: held-out figures at each evaluation, per-step times, training reward."""
    rows = read_run(RUNS / "smollm2" / "grpo_s0" / "metrics.jsonl")
    train = _train(rows)
    fig: dict[str, float | int | str | None] = {"steps": train[-1]["step"], "wall_s": rows[-1]["time/wall_s"]}
    for r in _evals(rows):
        for label, key in (("acc", "eval/accuracy"), ("reward", "eval/reward_mean"), ("format", "eval/format_ok"),
                           ("calls", "eval/calls_per_episode")):
            fig[f"eval{r['step']}.{label}"] = r[key]
    fig["eval_steps"] = _seed_list(r["step"] for r in _evals(rows))
    step_s = [r["time/rollout_s"] + r["time/update_s"] for r in train]
    fig["step_s.min"], fig["step_s.max"] = min(step_s), max(step_s)
    fig["generation_s.mean"] = statistics.mean(r["time/generation_s"] for r in train)
    fig["update_s.min"] = min(r["time/update_s"] for r in train)
    fig["update_s.max"] = max(r["time/update_s"] for r in train)
    fig["train_reward.min"] = min(r["rollout/reward_mean"] for r in train)
    fig["train_reward.max"] = max(r["rollout/reward_mean"] for r in train)
    return fig


def table(figures: dict, exp: str) -> str:
    """Experiment ``exp``'s GRPO/GRASP table, one row per method."""
    steps = figures[f"{exp}.grpo.steps"]
    rows = ["| method | seeds | held-out acc. start | held-out acc. end (step "
            f"{steps}), mean ± std (per seed) | held-out reward start | held-out reward end | seeds that learned "
            "| wall s per run |",
            "|---|---:|---:|---|---:|---:|---:|---:|"]
    for algo, label in ALGOS:
        f = {k[len(f"{exp}.{algo}."):]: v for k, v in figures.items() if k.startswith(f"{exp}.{algo}.")}
        rows.append(f"| {label} | {f['seeds']} | {f['acc.start']:.3f} | {f['acc.end_mean']:.3f} ± "
                    f"{f['acc.end_std']:.3f} ({f['acc.end_seeds']}) | {f['reward.start']:.3f} | "
                    f"{f['reward.end_mean']:.3f} ± {f['reward.end_std']:.3f} | {f['learned']} | "
                    f"{f['wall_s.min']:.0f}–{f['wall_s.max']:.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="print the figures, keep nothing (run_all's smoke run)")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = ap.parse_args(argv)
    figures: dict = {}
    for exp in EXPERIMENTS:
        for algo, _ in ALGOS:
            figures.update({f"{exp}.{algo}.{k}": v for k, v in rl_figures(exp, algo).items()})
        figures.update({f"{exp}.sft.{k}": v for k, v in sft_figures(RUNS / exp).items()})
        figures[f"{exp}.table"] = table(figures, exp)
    figures.update({f"smollm2.sft.{k}": v for k, v in sft_figures(RUNS / "smollm2").items()})
    figures.update({f"smollm2.grpo.{k}": v for k, v in smollm2_grpo().items()})
    g = {k[len("smollm2."):]: v for k, v in figures.items() if k.startswith("smollm2.")}
    section = "\n".join([
        "## Learning before the objective fix, and SmolLM2 (from the committed run data)", "",
        "CLOSED questions, rule reward, `tiny-qwen2-vl`, before issue 10's objective fix "
        "(`benchmarks/runs/exp1`, `benchmarks/runs/exp2`); held-out (greedy) accuracy and reward at step 0 and "
        f"at the last step; ± is the sample std over seeds; a seed *learned* when its accuracy ends more than "
        f"{LEARNED_BY} "
        "above its start; wall is the trainer's `time/wall_s`. Discussion in `docs/training.md`.", "",
        "Experiment 1 (SFT that never calls the tool):", "", figures["exp1.table"], "",
        "Experiment 2 (SFT that leaves RL a choice):", "", figures["exp2.table"], "",
        f"SmolLM2-135M (`benchmarks/runs/smollm2`): SFT {g['sft.steps']} steps, held-out accuracy "
        f"{g['sft.acc.start']:.3f} → {g['sft.acc.end']:.3f}, {g['sft.wall_s']:.0f} s wall; GRPO {g['grpo.steps']} "
        f"steps, held-out accuracy {g['grpo.eval0.acc']:.3f} → {g['grpo.eval' + str(g['grpo.steps']) + '.acc']:.3f}, "
        f"{g['grpo.wall_s']:.0f} s wall.", ""])
    record("learning_early", section, figures, command_line("bench_learning_early.py", argv),
           results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
