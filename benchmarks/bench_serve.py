"""Serving ``segment`` past one process: the plain server vs Ray Serve (batching, replicas), side by side.

One run, a real model engine (the trained SAM that ``medvqa-tools build segment`` makes, from the
tool cache; built there on first use), and for each row the same clients and calls, interleaved
row by row so that a slow spell of this shared machine hits every row alike:

* **plain**: ``medvqa-tools serve --tools segment --engine trained`` (default settings,
  ``--max-concurrency 4``: four forwards at once in worker threads, but ``--max-queue 256``: the
  default 64 turns part of a burst of 128 away with 503), over HTTP;
* **Ray Serve, batching**: one replica, ``max_batch_size`` 32, over HTTP (Serve's proxy, the front,
  the replica) and, for in-cluster callers, by handle (no HTTP);
* **Ray Serve, 2 replicas**: two replicas without batching, over HTTP;
* **Ray Serve, 2 replicas with batching**, over HTTP.

Every process runs torch on one thread (``OMP_NUM_THREADS=1`` for the plain server,
``torch_threads: 1`` for replicas): on this 2-core machine shared by other jobs, two OpenMP threads
per process under a load average of 10-20 made one forward several times slower (a first run:
the plain server's single call 1030 ms, a one-thread replica's 99 ms), which would measure thread
oversubscription, not serving. The replica rows are served under the seed's aliases ``medsam2`` and
``medsam3`` of ``segment`` so that one Serve front carries every Ray row and they can be
interleaved (the same tool, engine, weights, arguments and wire).

Measured: throughput and p50/p99 latency of 8, 32 and 128 concurrent *distinct* calls (each its
own client, as an env copy has; each call a different image: a copy of an embedded test image with
one corner pixel changed, so neither cache nor single-flight can merge them); the batched
forward's speed-up over one-at-a-time in this process (``segment_batch`` of 8 distinct images vs 8
``segment`` calls; masks compared pixel by pixel); and a GRPO group (8 clients, the same fresh call)
as the extra time it adds over one call and as a ratio. The load average is recorded: figures are
ratios within this run.

    python benchmarks/bench_serve.py [--quick] [--rounds 1] [--levels 8,32,128]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import concurrent.futures
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

APP = "medvqa-bench-serve"
BOX = [40, 40, 150, 150]


# ---- what is served ---------------------------------------------------------------------------------
def trained_sam() -> str:
    """The cached trained SAM folder (built now if this machine has none)."""
    from tool_backends.engines.trained import trained_tool_folder

    return str(trained_tool_folder("segment"))


def distinct_images(n: int, start: int) -> list[Image.Image]:
    """``n`` images no server has seen: embedded test scans, each with its own corner pixel."""
    from medvqa_env.datasets import load_dataset

    records = load_dataset("embedded", "test")
    out = []
    for i in range(start, start + n):
        arr = np.array(Image.open(records[i % len(records)].image_paths[0]).convert("RGB"))
        arr[0, 0] = (i % 256, (i // 256) % 256, 200)
        out.append(Image.fromarray(arr))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PlainServer:
    def __init__(self, folder: str) -> None:
        import httpx

        self.url = f"http://127.0.0.1:{free_port()}"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tool_backends.cli", "serve", "--tools", "segment", "--engine", "trained",
             "--tool-opt", f"segment.path={folder}", "--max-queue", "256", "--port", self.url.rsplit(":", 1)[1]],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(3000):
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the plain server did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


def deploy_ray(folder: str, port: int, batch: int, wait_s: float):
    """One Serve app: ``segment`` batched on one replica, ``medsam2`` (the same segment tool) on 2
    replicas without batching, ``medsam3`` on 2 replicas with batching; one torch thread each."""
    from tool_backends.ray_serve import load_serve_config
    from tool_backends.ray_serve_deploy import deploy

    engine = {"engine": "trained", "path": folder}
    config = load_serve_config({
        "tools": {"segment": {**engine, "ray": {"replicas": 1, "num_cpus": 1, "max_batch_size": batch,
                                                "batch_wait_timeout_s": wait_s, "torch_threads": 1}},
                  "medsam2": {**engine, "ray": {"replicas": 2, "num_cpus": 1, "max_batch_size": 1,
                                                "torch_threads": 1}},
                  "medsam3": {**engine, "ray": {"replicas": 2, "num_cpus": 1, "max_batch_size": batch,
                                                "batch_wait_timeout_s": wait_s, "torch_threads": 1}}},
        "app": APP, "port": port})
    deploy(config)
    return config


# ---- measuring ------------------------------------------------------------------------------------
def make_clients(kind: str, url: str | None, tool: str, n: int) -> list:
    from tool_backends.http_client import HTTPToolBackend
    from tool_backends.ray_serve_client import RayServeToolBackend

    if kind == "handle":
        clients = [RayServeToolBackend(tools=[tool], app=APP, timeout_s=600) for _ in range(n)]
    else:
        clients = [HTTPToolBackend(tools=[tool], url=url, timeout_s=600) for _ in range(n)]
    for c in clients:
        c.specs()  # connected (and, by handle, the deployment looked up) before the clock starts
    return clients


def burst(clients: list, tool: str, images: list[Image.Image]) -> tuple[float, list[float]]:
    """All calls at once, one client each: (wall seconds, per-call latencies)."""
    from tool_backends.base import ToolContext

    barrier = threading.Barrier(len(images) + 1)
    latencies = [0.0] * len(images)
    errors = []

    def one(i: int) -> None:
        barrier.wait()
        t = time.perf_counter()
        try:
            r = clients[i].call(tool, [images[i]], {"bbox": BOX, "image_index": 0, "coordinates": "pixel"},
                                ToolContext())
        except Exception as e:  # a refused call is a failed measurement, never a silent zero
            errors.append(f"{type(e).__name__}: {e}")
            return
        latencies[i] = time.perf_counter() - t
        if not r.ok:
            errors.append(r.text)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(images))]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} calls failed, e.g. {errors[0]!r}")
    return wall, latencies


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def batched_forward(folder: str, reps: int, threads: int) -> dict[str, float]:
    """In this process, on ``threads`` torch threads: ``segment_batch`` of 8 distinct images vs 8
    ``segment`` calls."""
    import torch

    from tool_backends.engines.trained import trained_segmenter

    torch.set_num_threads(threads)
    sam = trained_segmenter(path=folder)
    images = distinct_images(8, 90_000)
    calls = [{"image": im, "box": BOX} for im in images]
    sam.segment_batch(calls)  # warm
    one, batch, same = [], [], True
    for _ in range(reps):
        t = time.perf_counter()
        alone = [sam.segment(c["image"], box=c["box"]) for c in calls]
        one.append(time.perf_counter() - t)
        t = time.perf_counter()
        together = sam.segment_batch(calls)
        batch.append(time.perf_counter() - t)
        same = same and all(np.array_equal(a, b) for a, b in zip(alone, together))

    return {"one_by_one_s": statistics.median(one), "batch_s": statistics.median(batch),
            "batch_over_one_by_one": statistics.median(batch) / statistics.median(one),
            "speedup": statistics.median(one) / statistics.median(batch), "masks_identical": float(same),
            "torch_threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", default="8,32,128", help="concurrent distinct calls per burst")
    p.add_argument("--rounds", type=int, default=1, help="bursts of each level per row (the row: their median)")
    p.add_argument("--group-reps", type=int, default=3, help="repetitions of the group-of-8 measure per row")
    p.add_argument("--batch", type=int, default=32, help="max_batch_size of the batched deployments")
    p.add_argument("--batch-wait-s", type=float, default=0.05, help="batch_wait_timeout_s of the batched deployments")
    p.add_argument("--quick", action="store_true", help="8 concurrent calls only, one rep; nothing recorded")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = p.parse_args(argv)
    levels = [8] if args.quick else [int(x) for x in args.levels.split(",")]
    group_reps = 1 if args.quick else args.group_reps
    load_start = os.getloadavg()[0]
    folder = trained_sam()
    forward = {f"t{t}.{k}": v for t in (2, 1) for k, v in batched_forward(folder, 1 if args.quick else 3, t).items()}

    import ray
    from ray import serve

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)  # logical CPUs: the machine has 2
    plain = PlainServer(folder)
    port = free_port()
    try:
        deploy_ray(folder, port, args.batch, args.batch_wait_s)
        front = f"http://127.0.0.1:{port}"
        rows = {"plain": ("http", plain.url, "segment"), "ray_batched": ("http", front, "segment"),
                "ray_batched_handle": ("handle", None, "segment"), "ray_2_replicas": ("http", front, "medsam2"),
                "ray_2_replicas_batched": ("http", front, "medsam3")}
        warm = distinct_images(4, 80_000)
        for kind, url, tool in rows.values():  # every model loaded and warm before any clock
            c = make_clients(kind, url, tool, 4)
            burst(c, tool, warm)
        fresh = iter(range(0, 10**6, 1))
        results: dict[str, dict[str, float]] = {r: {} for r in rows}
        for n in levels:
            walls: dict[str, list[float]] = {r: [] for r in rows}
            lats: dict[str, list[float]] = {r: [] for r in rows}
            for _ in range(args.rounds):
                for row, (kind, url, tool) in rows.items():  # interleaved: a slow spell hits every row
                    clients = make_clients(kind, url, tool, n)
                    wall, lat = burst(clients, tool, distinct_images(n, next(fresh) * 1000))
                    walls[row].append(wall)
                    lats[row] += lat
                    for c in clients:
                        c.close()
            for row in rows:
                wall = statistics.median(walls[row])
                results[row].update({f"c{n}.wall_s": wall, f"c{n}.throughput": n / wall,
                                     f"c{n}.p50_ms": pct(lats[row], 50) * 1e3, f"c{n}.p99_ms": pct(lats[row], 99) * 1e3})
        for row, (kind, url, tool) in rows.items():
            one, group = [], []
            for _ in range(group_reps):
                image = distinct_images(1, next(fresh) * 1000)
                one.append(burst(make_clients(kind, url, tool, 1), tool, image)[0])
                image = distinct_images(1, next(fresh) * 1000)
                group.append(burst(make_clients(kind, url, tool, 8), tool, image * 8)[0])
            o, g = statistics.median(one), statistics.median(group)
            results[row].update({"one_call_s": o, "group8_s": g, "group8_extra_ms": (g - o) * 1e3,
                                 "group8_ratio": g / o})
        from tool_backends.ray_serve_deploy import replica_stats

        for row, tool in (("ray_batched", "segment"), ("ray_2_replicas_batched", "medsam3")):
            stats = replica_stats(tool, APP, 8)
            results[row]["largest_batch"] = max(s["largest_batch"] for s in stats)
            results[row]["mean_batch"] = (sum(s["batched_calls"] for s in stats) / max(1, sum(s["batches"] for s in stats)))
    finally:
        plain.close()
        serve.shutdown()
        ray.shutdown()
    load_end = os.getloadavg()[0]
    report(results, forward, levels, args, load_start, load_end, argv)


def report(results, forward, levels, args, load_start, load_end, argv) -> None:
    names = {"plain": "plain `medvqa-tools serve` (HTTP)", "ray_batched": f"Ray Serve, batching ≤{args.batch} (HTTP)",
             "ray_batched_handle": f"Ray Serve, batching ≤{args.batch} (by handle)",
             "ray_2_replicas": "Ray Serve, 2 replicas, no batching (HTTP)",
             "ray_2_replicas_batched": f"Ray Serve, 2 replicas, batching ≤{args.batch} (HTTP)"}
    figures = {"load_start": load_start, "load_end": load_end, "rounds": args.rounds, "max_batch_size": args.batch,
               "batch_wait_s": args.batch_wait_s}
    figures.update({f"forward.{k}": v for k, v in forward.items()})
    for row, r in results.items():
        figures.update({f"{row}.{k}": v for k, v in r.items()})
    base = results["plain"]
    for row, r in results.items():
        for n in levels:
            figures[f"{row}.c{n}.throughput_vs_plain"] = r[f"c{n}.throughput"] / base[f"c{n}.throughput"]
    head = "| row | " + " | ".join(f"{n} calls: calls/s (× plain), p50 / p99 ms" for n in levels) + " |"
    lines = ["## Serving `segment` past one process (`benchmarks/bench_serve.py`)", "",
             f"Trained SAM (`medvqa-tools build segment`, from the tool cache); concurrent *distinct* calls, each "
             f"from its own client; rows interleaved, {args.rounds} burst(s) per level and row (median). Load average "
             f"{load_start:.1f} at the start, {load_end:.1f} at the end (2 cores, shared).", "",
             head, "|---|" + "---:|" * len(levels)]
    for row, r in results.items():
        cells = [f"{r[f'c{n}.throughput']:.2f} ({r[f'c{n}.throughput'] / base[f'c{n}.throughput']:.2f}×), "
                 f"{r[f'c{n}.p50_ms']:.0f} / {r[f'c{n}.p99_ms']:.0f}" for n in levels]
        lines.append(f"| {names[row]} | " + " | ".join(cells) + " |")
    lines += ["", "A GRPO group: 8 clients make the same fresh call at once, against one client making one fresh call "
              f"(median of {args.group_reps}):", "", "| row | one call (ms) | group of 8 (ms) | extra (ms) | ratio |",
              "|---|---:|---:|---:|---:|"]
    for row, r in results.items():
        lines.append(f"| {names[row]} | {r['one_call_s'] * 1e3:.0f} | {r['group8_s'] * 1e3:.0f} | "
                     f"{r['group8_extra_ms']:+.0f} | {r['group8_ratio']:.2f}× |")
    lines += ["", "The batched forward in one process (`segment_batch` of 8 distinct images vs 8 `segment` calls, "
              "median of 3), masks compared pixel by pixel:", "",
              "| torch threads | 8 calls one by one (ms) | one batch of 8 (ms) | batch / one by one | masks identical |",
              "|---:|---:|---:|---:|---|"]
    for t in (1, 2):
        lines.append(f"| {t} | {forward[f't{t}.one_by_one_s'] * 1e3:.0f} | {forward[f't{t}.batch_s'] * 1e3:.0f} | "
                     f"{forward[f't{t}.batch_over_one_by_one']:.2f} | "
                     f"{'yes' if forward[f't{t}.masks_identical'] else 'NO'} |")
    lines += ["", "Batches the batched deployments ran (over the whole "
              f"run, warm-up and groups included): one replica up to {results['ray_batched']['largest_batch']:.0f} "
              f"calls, {results['ray_batched']['mean_batch']:.1f} on average; two replicas up to "
              f"{results['ray_2_replicas_batched']['largest_batch']:.0f}, "
              f"{results['ray_2_replicas_batched']['mean_batch']:.1f} on average. Every process runs torch on one "
              "thread (module docstring); a batch waits up to "
              f"{args.batch_wait_s * 1e3:.0f} ms to fill.", ""]
    command = command_line("bench_serve.py", argv)
    record("serve", "\n".join(lines), figures, command, None if args.quick else results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
