"""What a GRPO group's identical tool call costs: 8 copies vs one, in each pool backend.

A group is n copies of the env on one question; when they make the same call, the toolbox their
worker shares runs it once (a group's copies are placed on one worker). For each backend of
:class:`medvqa_env.pool.EnvPool` (thread, process, Ray), on fresh questions (no earlier cache entry),
in one run and interleaved:

* **one copy**: one slot makes a ``segment`` call (classical engine) -- the baseline;
* **group of 8**: 8 copies on one question make the same call;
* **8 different questions**: 8 copies make the call on 8 questions (nothing to share).

Reported: median seconds, each row's ratio to one copy in the same pool, and how many calls the
tool really ran (tool-cache misses).

    python benchmarks/bench_group.py [--quick] [--reps 5]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from medvqa_env.pool import EnvPool  # noqa: E402

from figures import record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

CALL = '<tool_call>{"name": "segment", "arguments": {"bbox": [60, 60, 200, 200]}}</tool_call>'
KWARGS = {"dataset": "embedded", "split": "test", "tools": {"segment": {"engine": "classical"}},
          "max_turns": 1, "reward": "rule"}
GROUP = 8


def measure(backend: str, reps: int, fresh) -> dict[str, float]:
    pool = EnvPool(KWARGS, size=GROUP, backend=backend, workers=1 if backend == "thread" else 2, group_size=GROUP)
    rows: dict[str, list[float]] = {"one": [], "group": [], "distinct": []}
    misses: dict[str, list[int]] = {"one": [], "group": [], "distinct": []}
    try:
        for rep in range(reps + 1):  # rep 0 warms up (imports, first image decode)
            for case in ("one", "group", "distinct"):
                if case == "distinct":
                    indices = [next(fresh) for _ in range(GROUP)]
                else:
                    indices = [next(fresh)] * (1 if case == "one" else GROUP)
                pool.reset([(0, {"index": i}) for i in indices])
                before = pool.tool_cache_stats()["misses"]
                t0 = time.perf_counter()
                pool.step({s: CALL for s in range(len(indices))})
                elapsed = time.perf_counter() - t0
                if rep:
                    rows[case].append(elapsed)
                    misses[case].append(pool.tool_cache_stats()["misses"] - before)
    finally:
        pool.close()
    out = {f"{case}_s": statistics.median(v) for case, v in rows.items()}
    out.update({f"{case}_calls": statistics.median(v) for case, v in misses.items()})
    out["group_ratio"] = out["group_s"] / out["one_s"]
    out["distinct_ratio"] = out["distinct_s"] / out["one_s"]
    return out


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="2 repetitions, thread and process only, nothing recorded")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = p.parse_args(argv)
    reps = 2 if args.quick else args.reps
    backends = ("thread", "process") if args.quick else ("thread", "process", "ray")
    fresh = iter(range(10_000))
    results = {b: measure(b, reps, fresh) for b in backends}
    if "ray" in results:
        import ray

        ray.shutdown()
    lines = ["## A GRPO group's identical tool call (`benchmarks/bench_group.py`)", "",
             f"`segment` (classical engine) on fresh embedded questions; median of {reps} repetitions; "
             "ratios against one copy making the call in the same pool.", "",
             "| pool | one copy (s) | group of 8, same call (s) | ratio | tool ran | 8 different questions (s) | ratio | tool ran |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    figures = {}
    for b, r in results.items():
        lines.append(f"| {b} | {r['one_s']:.4f} | {r['group_s']:.4f} | {r['group_ratio']:.2f}× | {r['group_calls']:.0f} | "
                     f"{r['distinct_s']:.4f} | {r['distinct_ratio']:.2f}× | {r['distinct_calls']:.0f} |")
        figures.update({f"{b}.{k}": v for k, v in r.items()})
    lines += ["", "A group of 8 identical calls runs the tool once in every backend (its copies share a "
              "worker's toolbox); 8 different calls run it 8 times.", ""]
    record("group", "\n".join(lines), figures, "python benchmarks/bench_group.py",
           results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
