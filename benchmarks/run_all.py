"""Run every benchmark in ``benchmarks/bench_*.py`` and rewrite ``BENCHMARKS.md``.

Each benchmark prints one Markdown section (its figures side by side with a baseline measured in
the same run). This script adds the machine description, the date and the command, keeps each
section in ``benchmarks/results/<topic>.md``, and records a failing benchmark as failed (with the
tail of its error) instead of stopping.

    python benchmarks/run_all.py [--quick] [--only env,tools] [--timeout 900]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
ORDER = ["env", "tools", "rewards", "eval", "train", "load"]  # the data flow; others follow alphabetically


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal")).split()[1])
        mem = f"{mem_kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        mem = "RAM unknown"
    try:
        import torch

        torch_v = f"torch {torch.__version__}"
    except ImportError:
        torch_v = "no torch"
    return f"{cpu}, {os.cpu_count()} cores, {mem}, Python {platform.python_version()}, {torch_v}, no GPU"


def discover() -> list[str]:
    topics = sorted(p.stem[len("bench_"):] for p in BENCH_DIR.glob("bench_*.py"))
    return sorted(topics, key=lambda t: (ORDER.index(t) if t in ORDER else len(ORDER), t))


def run_one(topic: str, quick: bool, timeout: int) -> str:
    cmd = [sys.executable, str(BENCH_DIR / f"bench_{topic}.py")] + (["--quick"] if quick else [])
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"## {topic}\n\nFailed: did not finish within {timeout} s.\n"
    out = proc.stdout.strip()
    start = out.find("## ")
    if proc.returncode != 0 or start < 0:
        tail = "\n".join((proc.stderr or out).strip().splitlines()[-15:])
        return f"## {topic}\n\nFailed (exit {proc.returncode}):\n\n```\n{tail}\n```\n"
    return out[start:] + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test); figures are noisier")
    ap.add_argument("--only", default="", help="comma-separated topics (default: all)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per benchmark")
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = ap.parse_args(argv)
    topics = discover()
    if args.only:
        wanted = [t.strip() for t in args.only.split(",") if t.strip()]
        unknown = sorted(set(wanted) - set(topics))
        if unknown:
            print(f"Unknown benchmark(s) {unknown}; choose from {topics}", file=sys.stderr)
            return 2
        topics = [t for t in topics if t in wanted]
    results_dir = BENCH_DIR / "results"
    results_dir.mkdir(exist_ok=True)
    sections = []
    for topic in topics:
        print(f"[run_all] {topic} ...", file=sys.stderr, flush=True)
        section = run_one(topic, args.quick, args.timeout)
        (results_dir / f"{topic}.md").write_text(section)
        sections.append(section)
    command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "")
    header = [
        "# Benchmarks",
        "",
        f"Rewritten by `{command}` on {dt.date.today().isoformat()}.",
        f"Machine: {machine_description()}.",
        "",
        "Every figure is measured side by side with its baseline in the same run; ratios compare the two.",
        "A single benchmark can be rerun with `python benchmarks/bench_<topic>.py`.",
        "",
    ]
    Path(args.out).write_text("\n".join(header) + "\n" + "\n".join(sections))
    print(f"[run_all] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
