"""Evaluation harness throughput: episodes/s with a zero-cost scripted agent, serial vs parallel.

The agent (``eval.scripted.ScriptedAgent``) zooms once and answers, costing nothing, so the figures
are the harness's own: image loading, the env, the zoom tool, the rule reward, scoring, JSONL
appends with fsync. Baseline: every env in the main process (``--workers 0``); then 1 and 2 env
worker processes; then the same with the agent sleeping 50 ms per ``act_batch`` call (a stand-in
for a batched model), where worker processes step envs while the agent "thinks".
"CPU cores busy" = (CPU seconds of this process + its workers) / wall seconds.
Open-answer metrics are off except in the last group, the default evaluation setup, where each
process scores its finished OPEN episodes with the MiniLM encoder.

    python benchmarks/bench_eval.py [--quick] [--vqa-rad ../shared/data/vqa_rad]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.runner import EvalConfig, Runner  # noqa: E402
from eval.scripted import ScriptedAgent  # noqa: E402
from medvqa_env.datasets import load_dataset  # noqa: E402


def _dataset(vqa_rad: str | None, limit: int):
    if vqa_rad and (Path(vqa_rad) / "source" / "testset.json").is_file():
        return load_dataset("vqa_rad", split="test", root=vqa_rad)[:limit]
    return load_dataset("embedded", split="test")[:limit]


def measure(dataset, workers: int, k: int, batch_size: int, delay_s: float = 0.0, gather: str = "all",
            open_metrics: bool = False) -> dict[str, float]:
    """One full run into a fresh folder; wall time includes starting the workers."""
    before = os.times()
    with tempfile.TemporaryDirectory() as out:
        cfg = EvalConfig(k=k, workers=workers, batch_size=batch_size, progress=False, open_metrics=open_metrics,
                         gather=gather)
        agent = ScriptedAgent(delay_s=delay_s)
        t0 = time.perf_counter()
        rows = Runner(agent, dataset, cfg, out).run()
        wall = time.perf_counter() - t0
    after = os.times()
    main_cpu = (after.user - before.user) + (after.system - before.system)
    worker_cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    batches = agent.batch_sizes
    n = len(rows)
    main_ms, worker_ms = 1e3 * main_cpu / n, 1e3 * worker_cpu / n
    # What 2 idle cores would allow: the main process is serial; everything together shares 2 cores.
    # (The agent's sleep is wall time, not CPU: it bounds serial rows by itself.)
    cpu_bound = min(1e3 / main_ms, 2e3 / (main_ms + worker_ms)) if workers else 1e3 / main_ms
    return {"episodes": n, "wall_s": wall, "eps": n / wall, "cores": (main_cpu + worker_cpu) / wall,
            "main_ms": main_ms, "worker_ms": worker_ms, "projected": cpu_bound,
            "mean_batch": sum(batches) / len(batches), "errors": sum(1 for r in rows if r["error"])}


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vqa-rad", default="../shared/data/vqa_rad")
    ap.add_argument("--k", type=int, default=None)
    args = ap.parse_args(argv)
    limit, k = (60, 2) if args.quick else (451, 4)
    k = args.k or k
    dataset = _dataset(args.vqa_rad, limit)
    batch = 32
    runs = [  # (name, workers, agent delay, gather, open metrics); ratios are to the first row of a group
        [("serial: envs in the main process (baseline)", 0, 0.0, "all", False),
         ("1 env worker process", 1, 0.0, "all", False),
         ("2 env worker processes", 2, 0.0, "all", False),
         ("2 env worker processes, gather=any", 2, 0.0, "any", False)],
        [("serial, agent sleeping 50 ms per act_batch (a model stand-in)", 0, 0.05, "all", False),
         ("2 env worker processes, agent sleeping 50 ms per act_batch", 2, 0.05, "all", False)],
        [("serial, open-answer metrics on (MiniLM BERTScore + CosSim)", 0, 0.0, "all", True),
         ("2 env worker processes, open-answer metrics on", 2, 0.0, "all", True)],
    ]
    results = [[(name, measure(dataset, w, k, batch, delay, gather, om)) for name, w, delay, gather, om in group]
               for group in runs]
    load = os.getloadavg()[0]
    lines = [
        "## Evaluation harness throughput (scripted agent)",
        "",
        f"`python benchmarks/bench_eval.py{' --quick' if args.quick else ''}` — {len(dataset)} {dataset.name} "
        f"questions × K={k} = {len(dataset) * k} episodes per row, batch of {batch} live episodes, zoom then "
        f"answer, rule reward, fsync per loop iteration; wall time includes worker start-up (and, with open "
        f"metrics, loading the encoder in each process). "
        f"{os.cpu_count()} CPU cores, load average {load:.1f} at the end (the machine is shared: other jobs "
        f"compete for the same cores). Ratios compare rows with the same agent cost.",
        "",
        "| setup | episodes/s | ratio to serial | CPU cores busy | main CPU ms/ep | worker CPU ms/ep | "
        "CPU-bound episodes/s on 2 idle cores | mean act_batch | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for group in results:
        base = group[0][1]["eps"]
        for name, r in group:
            lines.append(f"| {name} | {r['eps']:.1f} | {r['eps'] / base:.2f} | {r['cores']:.2f} | "
                         f"{r['main_ms']:.1f} | {r['worker_ms']:.1f} | {r['projected']:.0f} | "
                         f"{r['mean_batch']:.1f} | {r['errors']} |")
    lines += ["", "\"CPU-bound episodes/s on 2 idle cores\" is a projection from the measured CPU "
              "seconds, not a measurement: min(1000 / main ms, 2000 / (main + worker ms)) with workers, "
              "1000 / main ms without. It ignores the agent's sleep and start-up."]
    lines.append("")
    section = "\n".join(lines)
    print(section)
    return section


if __name__ == "__main__":
    main()
