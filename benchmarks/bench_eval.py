"""Evaluation harness throughput: episodes/s with a zero-cost scripted agent, serial vs parallel.

The agent (``eval.scripted.ScriptedAgent``) zooms once and answers, costing nothing, so the figures
are the harness's own: image loading, the env, the zoom tool, the rule reward, scoring, JSONL
appends with fsync. Baseline: every env in the main process (``--workers 0``); then 1 and 2 env
worker processes; then the same with the agent sleeping 50 ms per ``act_batch`` call (a stand-in
for a batched model). "overlap" rows run ``EvalConfig(overlap=True)``: two waves of episodes, the
envs of one stepped while the agent "thinks" about the other (each ``act_batch`` still gets up to
the batch of 32), so the env work should hide behind the agent's time.
"CPU cores busy" = (CPU seconds of this process + its workers) / wall seconds. Every row runs
``--reps`` times (rows of a group alternate order), and ratios are reported as min / median.
Open-answer metrics are off except in the last group, the default evaluation setup, where the
harness's process measures the finished OPEN episodes of each round in one batch with the MiniLM
encoders (loaded once per run, however many workers).

    python benchmarks/bench_eval.py [--quick] [--vqa-rad ../shared/data/vqa_rad]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eval.runner import EvalConfig, Runner  # noqa: E402
from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)
from eval.scripted import ScriptedAgent  # noqa: E402
from medvqa_env.datasets import load_dataset  # noqa: E402


def _dataset(vqa_rad: str | None, limit: int):
    if vqa_rad and (Path(vqa_rad) / "source" / "testset.json").is_file():
        return load_dataset("vqa_rad", split="test", root=vqa_rad)[:limit]
    return load_dataset("embedded", split="test")[:limit]


class _TimedPool:
    """``EnvPool`` as the runner builds it, recording how long starting its workers took."""

    started_s = 0.0

    def __new__(cls, *args, **kwargs):
        from medvqa_env.pool import EnvPool

        t0 = time.perf_counter()
        pool = EnvPool(*args, **kwargs)
        cls.started_s = time.perf_counter() - t0
        return pool


def measure(dataset, setup: Setup, k: int, batch_size: int) -> dict[str, float]:
    """One full run into a fresh folder; wall time includes starting the workers (also timed alone)."""
    import eval.runner as runner_module

    before = os.times()
    runner_module.EnvPool = _TimedPool
    try:
        with tempfile.TemporaryDirectory() as out:
            cfg = EvalConfig(k=k, workers=setup.workers, batch_size=batch_size, progress=False,
                             open_metrics=setup.open_metrics, gather=setup.gather, overlap=setup.overlap)
            agent = ScriptedAgent(delay_s=setup.delay_s)
            t0 = time.perf_counter()
            rows = Runner(agent, dataset, cfg, out).run()
            wall = time.perf_counter() - t0
    finally:
        from medvqa_env.pool import EnvPool

        runner_module.EnvPool = EnvPool
    after = os.times()
    main_cpu = (after.user - before.user) + (after.system - before.system)
    worker_cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    batches = agent.batch_sizes
    n = len(rows)
    start = _TimedPool.started_s
    return {"episodes": n, "wall_s": wall, "eps": n / wall, "start_s": start, "steady_eps": n / max(1e-9, wall - start),
            "cores": (main_cpu + worker_cpu) / wall, "main_ms": 1e3 * main_cpu / n, "worker_ms": 1e3 * worker_cpu / n,
            "mean_batch": sum(batches) / len(batches), "errors": sum(1 for r in rows if r["error"])}


class Setup(NamedTuple):
    """One row of the table: how the harness runs and what the agent costs."""

    key: str
    label: str
    workers: int
    delay_s: float = 0.0
    gather: str = "all"
    open_metrics: bool = False
    overlap: bool = False


STAND_IN = "agent sleeping 50 ms per act_batch"
GROUPS = {  # the first row of a group is its baseline
    "zero_cost": [Setup("serial", "serial: envs in the main process (baseline)", 0),
                  Setup("workers_1", "1 env worker process", 1),
                  Setup("workers_2", "2 env worker processes", 2),
                  Setup("workers_2_any", "2 env worker processes, gather=any", 2, gather="any"),
                  Setup("workers_2_overlap", "2 env worker processes, overlap", 2, overlap=True)],
    "model_stand_in": [Setup("serial", f"serial, {STAND_IN} (a model stand-in)", 0, 0.05),
                       Setup("workers_2", f"2 env worker processes, {STAND_IN}", 2, 0.05),
                       Setup("workers_2_overlap", f"2 env worker processes, overlap, {STAND_IN}", 2, 0.05,
                             overlap=True),
                       Setup("serial_overlap", f"envs in a thread of the main process, overlap, {STAND_IN}", 0, 0.05,
                             overlap=True)],
    "open_metrics": [Setup("serial", "serial, open-answer metrics on (MiniLM BERTScore + CosSim)", 0,
                           open_metrics=True),
                     Setup("workers_2", "2 env worker processes, open-answer metrics on", 2, open_metrics=True)],
}


def main(argv: list[str] | None = None) -> str:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vqa-rad", default="../shared/data/vqa_rad")
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None, help="repetitions of every row (default 3; 1 with --quick)")
    ap.add_argument("--groups", default=",".join(GROUPS), help=f"which row groups (of {list(GROUPS)})")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                    "none with --quick)")
    args = ap.parse_args(argv)
    limit, k = (60, 2) if args.quick else (451, 4)
    k = args.k or k
    reps = args.reps or (1 if args.quick else 3)
    dataset = _dataset(args.vqa_rad, limit)
    batch = 32
    groups = {g: GROUPS[g] for g in args.groups.split(",") if g}
    runs: dict[tuple[str, str], list[dict]] = {}
    for rep in range(reps):  # rows of a group alternate order between repetitions
        for g, rows in groups.items():
            for setup in (rows if rep % 2 == 0 else rows[::-1]):
                runs.setdefault((g, setup.key), []).append(measure(dataset, setup, k, batch))
    load = os.getloadavg()[0]
    med = statistics.median
    figures: dict[str, float] = {"episodes": len(dataset) * k, "reps": reps}
    cmd = command_line("bench_eval.py", argv)
    lines = [
        "## Evaluation harness throughput (scripted agent)",
        "",
        f"`{cmd}` — {len(dataset)} {dataset.name} questions × K={k} = {len(dataset) * k} episodes per run, batch of "
        f"{batch} live episodes (overlap rows: two waves of {batch}), zoom then answer, rule reward, fsync per loop "
        f"iteration. {reps} repetitions of "
        "every row, rows of a group alternating order; ratios are per repetition against that repetition's "
        "serial run, reported as min / median. *Total* includes starting the worker processes (each imports the "
        "env stack; also shown alone); *steady* leaves that out. "
        f"{os.cpu_count()} CPU cores, load average {load:.1f} at the end (the machine is shared: other jobs "
        "compete for the same cores). *Bound*: the highest total ratio this row's CPU time per episode allows "
        f"on {os.cpu_count()} cores (cores × the serial run's wall time per episode ÷ this row's CPU time per "
        "episode, medians): how far the row can go on this box whatever the scheduling.",
        "",
        "| setup | episodes/s total, median (min–max) | ratio total, min / median | episodes/s steady, median | "
        "ratio steady, min / median | worker start s | CPU cores busy | main CPU ms/ep | worker CPU ms/ep | "
        "bound | mean act_batch | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g, rows in groups.items():
        base = runs[(g, rows[0].key)]
        base_wall_ms = med(1e3 / b["eps"] for b in base)
        for key, label, *_ in rows:
            rs = runs[(g, key)]
            ratio = [r["eps"] / b["eps"] for r, b in zip(rs, base)]
            steady = [r["steady_eps"] / b["steady_eps"] for r, b in zip(rs, base)]
            eps = [r["eps"] for r in rs]
            f = {"rate": med(eps), "rate_min": min(eps), "rate_max": max(eps), "ratio_min": min(ratio),
                 "ratio": med(ratio), "steady_rate": med(r["steady_eps"] for r in rs),
                 "steady_ratio_min": min(steady), "steady_ratio": med(steady), "start_s": med(r["start_s"] for r in rs),
                 "cores": med(r["cores"] for r in rs), "main_ms": med(r["main_ms"] for r in rs),
                 "worker_ms": med(r["worker_ms"] for r in rs), "mean_batch": med(r["mean_batch"] for r in rs),
                 "errors": sum(r["errors"] for r in rs)}
            f["cpu_bound"] = (os.cpu_count() or 1) * base_wall_ms / (f["main_ms"] + f["worker_ms"])
            figures.update({f"{g}.{key}.{name}": v for name, v in f.items()})
            lines.append(f"| {label} | {f['rate']:.1f} ({f['rate_min']:.1f}–{f['rate_max']:.1f}) | "
                         f"{f['ratio_min']:.2f} / {f['ratio']:.2f} | {f['steady_rate']:.1f} | "
                         f"{f['steady_ratio_min']:.2f} / {f['steady_ratio']:.2f} | {f['start_s']:.2f} | {f['cores']:.2f} | "
                         f"{f['main_ms']:.1f} | {f['worker_ms']:.1f} | {f['cpu_bound']:.2f} | {f['mean_batch']:.1f} | "
                         f"{f['errors']} |")
    lines.append("")
    section = "\n".join(lines)
    record("eval", section, figures, cmd, results_dir_arg(args.quick, args.results))
    return section


if __name__ == "__main__":
    main()
