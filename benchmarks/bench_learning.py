"""The learning proofs' figures, read from their committed run data (``benchmarks/runs/``).

Nothing trains here: the runs are made by ``benchmarks/runs/exp3/closed.sh`` (CLOSED, rule
reward) and ``benchmarks/runs/open/open.sh`` (OPEN, ARMed), and their ``metrics.jsonl`` files
are committed beside the scripts. This script turns them into named figures
(``benchmarks/results/learning.json``) so that every number ``docs/training.md`` and the README
quote about learning comes from the run files, and ``tests/test_doc_figures.py`` catches drift.
The same goes for verl's trainer on CPU beside the native one (``benchmarks/runs/verl_cpu/``,
quoted in ``docs/verl.md``): held-out curves from both, the training-side figures of the CLOSED
verl runs and of the 15-step OPEN one (grad norm, KL loss, rollout/actor probability gap, sampled
score, step time) from verl's ``metrics.jsonl``, and for that OPEN run its held-out answers and the
ARMed thresholds they were scored with, and the reward state of verl's last checkpoint. One figure
is not a run's: the parameter count of the ``tiny-qwen2-vl`` policy the proofs train, counted on the
model built from its config (random init, no download).

    python benchmarks/bench_learning.py            # derive, print, keep in benchmarks/results/
    python benchmarks/bench_learning.py --quick    # derive and print only (run_all's smoke run)
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

from figures import ROOT, command_line, record, results_dir_arg

RUNS = ROOT / "benchmarks" / "runs"
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
LAST_STEPS = 10  # "late in the run": the last this many training steps


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
        fig[f"{label}.end_sd"] = statistics.stdev(end)  # the sample SD (n - 1)
        fig[f"{label}.end_seeds"] = ", ".join(f"{v:.3f}" for v in end)
        fig[f"{label}.end_min"], fig[f"{label}.end_max"] = min(end), max(end)
        if label == "metric":
            fig["learned"] = sum(e > s + LEARNED_BY for s, e in zip(start, end))
    last = [read_run(p)[-1] for p in runs]
    walls = [r["time/wall_s"] for r in last if "time/wall_s" in r]
    if walls:
        fig["wall_s.min"], fig["wall_s.max"] = min(walls), max(walls)
    # sampled (temperature 0.7) tool calls per training episode: step 1 and the last steps (mean over
    # seeds), and the most in any step of any seed
    sampled = [[r["tools/calls_per_episode"] for r in read_run(p) if "tools/calls_per_episode" in r] for p in runs]
    if all(sampled):
        fig["sampled_calls.first"] = statistics.mean(s[0] for s in sampled)
        fig[f"sampled_calls.last{LAST_STEPS}"] = statistics.mean(statistics.mean(s[-LAST_STEPS:]) for s in sampled)
        fig["sampled_calls.max"] = max(max(s) for s in sampled)
    thresholds = [[r for r in read_run(p) if "reward/threshold_bertscore" in r] for p in runs]
    if all(thresholds):
        fig["threshold_bertscore.first"] = statistics.mean(t[0]["reward/threshold_bertscore"] for t in thresholds)
        fig["threshold_bertscore.last"] = statistics.mean(t[-1]["reward/threshold_bertscore"] for t in thresholds)
        fig["threshold_cosine.last"] = statistics.mean(t[-1]["reward/threshold_cosine"] for t in thresholds)
        # how often the BERTScore threshold went up (a step is one batch end), and in how many seeds the
        # training episodes' raw BERTScore ended lower than it began (mean of the first / last 5 steps):
        # a threshold that climbs while the answers do not is drift, not the answers improving
        rises = [sum(b["reward/threshold_bertscore"] > a["reward/threshold_bertscore"] for a, b in zip(t, t[1:]))
                 for t in thresholds]
        fig["threshold_bertscore.rises_min"], fig["threshold_bertscore.rises_max"] = min(rises), max(rises)
        fig["threshold_bertscore.transitions"] = min(len(t) - 1 for t in thresholds)
        open_rows = [[r["open/bertscore"] for r in read_run(p) if "open/bertscore" in r] for p in runs]
        fig["train_bertscore.fell_seeds"] = sum(statistics.mean(b[-5:]) < statistics.mean(b[:5]) for b in open_rows if b)
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


def verl_vs_native(name: str, folder: str, at: tuple[int, ...] = ()) -> dict[str, float | int]:
    """Held-out accuracy and reward of the verl run and each native seed: start, end, best (and the
    values at the evaluation steps ``at``)."""
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
            fig[f"{label}.{metric}.best_step"] = next(s for s in steps if curve[s][i] == fig[f"{label}.{metric}.best"])
            # how far the held-out metric moved from its start at any later evaluation
            fig[f"{label}.{metric}.max_dev"] = max(abs(curve[s][i] - curve[steps[0]][i]) for s in steps)
            for s in at:
                if s in curve:
                    fig[f"{label}.{metric}.step{s}"] = curve[s][i]
    return {f"{name}.{k}": v for k, v in fig.items()}


# The CLOSED comparison (docs/verl.md): two SFT starts, each with a verl run and native seeds.
VERL_CLOSED = ("verl_closed", "verl_cpu", ("sft1", "sft2"))
EARLY = 5  # the held-out evaluation the CLOSED table shows between the start and the last one


def _episodes_per_step(config: Path) -> int | None:
    """``data.train_batch_size`` x ``actor_rollout_ref.rollout.n`` of a verl run's saved config."""
    if not config.is_file():
        return None
    import yaml

    cfg = yaml.safe_load(config.read_text())
    return int(cfg["data"]["train_batch_size"]) * int(cfg["actor_rollout_ref"]["rollout"]["n"])


def verl_training(run: Path) -> dict[str, float | int | None]:
    """What verl's ``metrics.jsonl`` says about its training steps (not the held-out evaluations):
    steps trained, grad norm, KL loss, rollout/actor probability gap, sampled score, step time, and
    how many sampled episodes did not answer in their first turn."""
    rows = [r for r in read_run(run / "metrics.jsonl") if "actor/grad_norm" in r["data"]]
    data = [r["data"] for r in rows]
    steps = [r["step"] for r in rows]
    fig: dict[str, float | int | None] = {"trained_steps": steps[-1]}
    grad = [d["actor/grad_norm"] for d in data]
    fig["grad_norm.min"], fig["grad_norm.max"] = min(grad), max(grad)
    fig["grad_norm.median"] = statistics.median(grad)
    kl = [d["actor/kl_loss"] for d in data]
    fig["kl_loss.first"], fig["kl_loss.max"], fig["kl_loss.last"] = kl[0], max(kl), kl[-1]
    fig[f"kl_loss.last{LAST_STEPS}.min"] = min(kl[-LAST_STEPS:])
    fig[f"kl_loss.last{LAST_STEPS}.max"] = max(kl[-LAST_STEPS:])
    # the largest per-token gap between the rollout's (vLLM) and the actor's probabilities, any step
    fig["probs_diff.max"] = max(d["training/rollout_probs_diff_max"] for d in data)
    fig["probs_diff.mean_max"] = max(d["training/rollout_probs_diff_mean"] for d in data)
    score = [d["critic/score/mean"] for d in data]  # the sampled (temperature 0.7) episodes' mean score
    fig["score.first"], fig["score.last"] = score[0], score[-1]
    fig["score.min"], fig["score.max"] = min(score), max(score)
    fig["score.min_step"], fig["score.max_step"] = steps[score.index(min(score))], steps[score.index(max(score))]
    fig[f"score.first{LAST_STEPS}.mean"] = statistics.mean(score[:LAST_STEPS])
    fig[f"score.last{LAST_STEPS}.mean"] = statistics.mean(score[-LAST_STEPS:])
    step_s = [d["timing_s/step"] for d in data]
    fig["step_s.min"], fig["step_s.max"] = min(step_s), max(step_s)
    fig["step_s.median"] = statistics.median(step_s)
    # num_turns = assistant turns + user turns + 1 (train/verl_integration/agent_loop.py): 2 when the
    # first turn answered, 4 when it did not (a tool call or a malformed turn; verl's cap is 2 turns)
    n = _episodes_per_step(run / "verl_config.yaml")
    fig["episodes_per_step"] = n
    if n is not None:
        if any(d["num_turns/min"] < 2 or d["num_turns/max"] > 4 for d in data):
            raise SystemExit(f"{run}: num_turns outside 2..4; the first-turn count below assumes 2 or 4")
        second = [round((d["num_turns/mean"] - 2) * n / 2) for d in data]
        fig["no_answer_first_turn.first"] = second[0]
        fig["no_answer_first_turn.max"] = max(second)
        fig["no_answer_first_turn.total"] = sum(second)
        fig["no_answer_first_turn.episodes"] = n * len(second)
        fig[f"no_answer_first_turn.last{LAST_STEPS}"] = sum(second[-LAST_STEPS:])
    return fig


def verl_answers(run: Path) -> dict[str, int | str | None]:
    """The greedy held-out answers of a verl run (its validation episodes): how many questions each
    evaluation had, the most distinct answers any evaluation gave, the most common answer at the
    first and last evaluation, and the first evaluation step whose most common answer differs."""
    steps: dict[int, Counter] = {}
    for path in sorted((run / "episodes").glob("*.jsonl")):
        for e in read_run(path):
            if e.get("validate"):
                steps.setdefault(int(e["global_steps"]), Counter())[str(e["answer"])] += 1
    order = sorted(steps)
    top = {s: steps[s].most_common(1)[0][0] for s in order}
    return {"eval_episodes": sum(steps[order[0]].values()),
            "answers.distinct_max": max(len(c) for c in steps.values()),
            "answers.start": top[order[0]], "answers.end": top[order[-1]],
            "answers.changed_at": next((s for s in order if top[s] != top[order[0]]), None)}


def native_training(run: Path) -> dict[str, float | int | None]:
    """A native seed's sampled tool calls per episode at step 1, from which step there were none, and
    the largest share of its calls that failed."""
    rows = [r for r in read_run(run / "metrics.jsonl") if "tools/calls_per_episode" in r]
    calls = [(r["step"], r["tools/calls_per_episode"]) for r in rows]
    last = max((s for s, c in calls if c > 0), default=None)  # none_from past the last step: it never stopped
    return {"calls.first": calls[0][1], "calls.none_from": 1 if last is None else last + 1,
            "tool_error_rate.max": max(r["tools/error_rate"] for r in rows)}


def _label(run: str) -> str:
    return "verl on CPU" if run == "verl" else f"native, seed {run.rsplit('_s', 1)[1]}"


def verl_closed(name: str, folder: str, starts: tuple[str, ...]) -> dict[str, float | int | str | None]:
    """The CLOSED verl-vs-native runs: held-out curves (``verl_vs_native``), SFT steps, training-side
    figures of each verl run and native seed, and the comparison table ``docs/verl.md`` shows."""
    fig: dict[str, float | int | str | None] = {}
    rows = ["| start | run | steps trained | held-out accuracy, step 0 -> "
            f"{EARLY} -> last evaluation | held-out reward, step 0 -> last evaluation |", "|---|---|---:|---|---|"]
    for start in starts:
        base = RUNS / folder / start
        sft_steps = read_run(base / "sft" / "metrics.jsonl")[-1]["step"]
        fig[f"{start}.sft.steps"] = sft_steps
        fig.update({f"{start}.{k[len(name) + 1:]}": v
                    for k, v in verl_vs_native(name, f"{folder}/{start}", at=(EARLY,)).items()})
        fig.update({f"{start}.verl.{k}": v for k, v in verl_training(base / "verl").items()})
        fig.update({f"{start}.verl.{k}": v for k, v in verl_answers(base / "verl").items()})
        for seed in sorted(base.glob("native_s*")):
            fig.update({f"{start}.{seed.name}.{k}": v for k, v in native_training(seed).items()})
            fig[f"{start}.{seed.name}.trained_steps"] = read_run(seed / "metrics.jsonl")[-1]["step"]
        for run in ["verl"] + sorted(p.name for p in base.glob("native_s*")):
            f = {k[len(f"{start}.{run}."):]: v for k, v in fig.items() if k.startswith(f"{start}.{run}.")}
            last = f["steps"]
            at_last = "" if last == f["trained_steps"] else f" (step {last})"
            early = f"{f[f'accuracy.step{EARLY}']:.3f}" if f"accuracy.step{EARLY}" in f else "n/a"
            rows.append(f"| SFT {sft_steps} steps (`{start}`) | {_label(run)} | {f['trained_steps']} | "
                        f"{f['accuracy.start']:.3f} -> {early} -> {f['accuracy.end']:.3f}{at_last} | "
                        f"{f['reward.start']:.3f} -> {f['reward.end']:.3f}{at_last} |")
    ends = [v for k, v in fig.items() if k.endswith(".accuracy.end")]
    fig["accuracy.end_min"], fig["accuracy.end_max"] = min(ends), max(ends)
    fig["table"] = "\n".join(rows)
    return {f"{name}.{k}": v for k, v in fig.items()}


def verl_open_sft60(name: str, folder: str) -> dict[str, float | int | str | None]:
    """The OPEN comparison from the 60-step SFT (``VERL_VS_NATIVE``): held-out curves, and the run's
    SFT steps, verl's GRPO steps trained and step times (it ran alone on the idle machine), and the
    held-out questions."""
    base = RUNS / folder
    fig = verl_vs_native(name, folder)
    fig[f"{name}.sft.steps"] = read_run(base / "sft" / "metrics.jsonl")[-1]["step"]
    training = verl_training(base / "verl")
    for k in ("trained_steps", "step_s.min", "step_s.max", "step_s.median"):
        fig[f"{name}.verl.{k}"] = training[k]
    # issue 19: what the rise is made of -- the distinct greedy answers of each evaluation
    fig.update({f"{name}.verl.{k}": v for k, v in verl_answers(base / "verl").items()})
    return fig


# The first OPEN comparison (docs/verl.md): scripts/train_verl_cpu.sh's own 40-step SFT, 15 GRPO steps.
VERL_OPEN_SHORT = ("verl_open_sft40", "verl_cpu/open", (5, 10))


def verl_held_out_episodes(run: Path) -> dict[str, float | int]:
    """What verl's greedy held-out episodes say beyond accuracy and reward: tool calls, and whether the
    reward moved because the answers did or because ARMed's thresholds did -- the evaluations after
    the first whose answers or raw similarity scores differ from the first's, and the thresholds in
    force at the evaluations."""
    steps: dict[int, dict[str, tuple]] = {}
    calls, thresholds = 0, []
    for path in sorted((run / "episodes").glob("*.jsonl")):
        for e in read_run(path):
            if not e.get("validate"):
                continue
            c = e["reward_components"]
            steps.setdefault(int(e["global_steps"]), {})[e["record_id"]] = (e["answer"], c["bertscore"], c["cosine"])
            calls += e["num_tool_calls"]
            thresholds.append((c["threshold_bertscore"], c["threshold_cosine"]))
    order = sorted(steps)
    return {"eval_tool_calls": calls, "evaluations": len(order),
            "answers.changed_evaluations": sum(steps[s] != steps[order[0]] for s in order[1:]),
            "eval_threshold_bertscore.min": min(t[0] for t in thresholds),
            "eval_threshold_bertscore.max": max(t[0] for t in thresholds),
            "eval_threshold_cosine.min": min(t[1] for t in thresholds),
            "eval_threshold_cosine.max": max(t[1] for t in thresholds)}


def reward_state(path: Path, answer_type: str = "OPEN") -> dict[str, float | int]:
    """The ARMed state verl's last checkpoint kept (``medvqa_reward_state.json``): threshold updates,
    last batch id, thresholds."""
    state = json.loads(path.read_text())[answer_type]["thresholds"]
    return {"updates": state["updates"], "last_batch_id": state["last_batch_id"],
            **{f"threshold_{k}": v for k, v in state["thresholds"].items()}}


def verl_open_short(name: str, folder: str, at: tuple[int, ...]) -> dict[str, float | int | str | None]:
    """The 15-step OPEN verl-vs-native runs: held-out curves at each evaluation, SFT steps, verl's
    training-side figures and held-out episodes, its reward state, the native seeds' training-side
    figures, and the table ``docs/verl.md`` shows."""
    base = RUNS / folder
    fig: dict[str, float | int | str | None] = {"sft.steps": read_run(base / "sft" / "metrics.jsonl")[-1]["step"]}
    fig.update({k[len(name) + 1:]: v for k, v in verl_vs_native(name, folder, at=at).items()})
    fig.update({f"verl.{k}": v for k, v in verl_training(base / "verl").items()})
    fig.update({f"verl.{k}": v for k, v in verl_answers(base / "verl").items()})
    fig.update({f"verl.{k}": v for k, v in verl_held_out_episodes(base / "verl").items()})
    state = reward_state(base / "verl" / "medvqa_reward_state.json")
    fig.update({f"verl.reward_state.{k}": v for k, v in state.items()})
    natives = sorted(p.name for p in base.glob("native_s*"))
    for seed in natives:
        rows = [r for r in read_run(base / seed / "metrics.jsonl") if "tools/calls_per_episode" in r]
        fig.update({f"{seed}.{k}": v for k, v in native_training(base / seed).items()})
        fig[f"{seed}.trained_steps"] = rows[-1]["step"]
        fig[f"{seed}.calls.max"] = max(r["tools/calls_per_episode"] for r in rows)
        fig[f"{seed}.threshold_bertscore.last"] = rows[-1]["reward/threshold_bertscore"]
        fig[f"{seed}.threshold_cosine.last"] = rows[-1]["reward/threshold_cosine"]
    evals = [0, *at, fig["verl.steps"]]
    rows = ["| run (same SFT start) | held-out accuracy, step " + " -> ".join(map(str, evals))
            + " | held-out reward (ARMed for OPEN), step " + " -> ".join(map(str, evals)) + " |", "|---|---|---|"]
    for run in ["verl", *natives]:
        f = {k[len(run) + 1:]: v for k, v in fig.items() if k.startswith(f"{run}.")}
        cells = [" -> ".join(f"{f[k]:.3f}" for k in (f"{m}.start", *(f"{m}.step{s}" for s in at), f"{m}.end"))
                 for m in ("accuracy", "reward")]
        rows.append(f"| {_label(run)} | {cells[0]} | {cells[1]} |")
    fig["table"] = "\n".join(rows)
    return {f"{name}.{k}": v for k, v in fig.items()}


TINY_POLICY = "tiny-qwen2-vl"  # the policy of the learning proofs (docs/training.md, README)


def policy_parameters(name: str = TINY_POLICY) -> int:
    """Parameters of the tiny policy the proofs train, counted on the model its config builds."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from agents.models import build_tiny_vlm

    model, _ = build_tiny_vlm(name)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="derive and print the figures, keep nothing (run_all's "
                    "smoke run)")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = ap.parse_args(argv)
    figures: dict = {}
    rows = ["| setting | seeds | held-out metric | start | end (mean ± sample SD) | per seed | seeds that learned |",
            "|---|---:|---|---:|---:|---|---:|"]
    for name, folder, key, what in SETTINGS:
        f = summarise(name, folder, key)
        figures.update(f)
        rows.append(f"| {what} (`benchmarks/runs/{folder}`) | {f[name + '.seeds']} | `{key}` | "
                    f"{f[name + '.metric.start']:.3f} | {f[name + '.metric.end_mean']:.3f} ± "
                    f"{f[name + '.metric.end_sd']:.3f} | {f[name + '.metric.end_seeds']} | {f[name + '.learned']} |")
    if (RUNS / VERL_VS_NATIVE[1] / "verl").is_dir():
        figures.update(verl_open_sft60(*VERL_VS_NATIVE))
    if (RUNS / VERL_OPEN_SHORT[1] / "verl").is_dir():
        figures.update(verl_open_short(*VERL_OPEN_SHORT))
    if all((RUNS / VERL_CLOSED[1] / start / "verl").is_dir() for start in VERL_CLOSED[2]):
        figures.update(verl_closed(*VERL_CLOSED))
    figures[f"policy.{TINY_POLICY.replace('-', '_')}.parameters"] = policy_parameters()
    section = "\n".join([
        "## Learning (from the committed run data)", "",
        "Held-out (greedy) metric at step 0 and at the last step of each GRPO seed; a seed *learned* when",
        f"it ends more than {LEARNED_BY} above the start. Scripts: `benchmarks/runs/exp3/closed.sh`,",
        "`benchmarks/runs/open/open.sh`; discussion in `docs/training.md`.", "", *rows, ""])
    record("learning", section, figures, command_line("bench_learning.py", argv),
           results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
