"""CPU seconds of a command and every process it starts, Ray's included.

``getrusage(RUSAGE_CHILDREN)`` (what ``train.protocol`` records for a native run) counts only the
children a process waited for. verl's trainer runs in Ray: the driver starts Ray's servers, the
raylet starts the workers, a worker starts vLLM's engine; at shutdown Ray kills them, and what they
used never reaches the driver's rusage. So this samples ``/proc`` every ``interval`` seconds and
adds up, for each process descended from the command (itself included), its own user + system
time at its last sample: a process is counted at most one interval short, and one that lives less
than an interval may be missed (children's reaped time is not added: it would count the sampled
ones twice).

``python -m train.verl_integration.tree_cpu --out cpu.json -- CMD ARGS...`` runs CMD, writes
``{"cpu_s", "wall_s", "rc", "processes", "interval_s"}`` and exits with CMD's exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, the process's own CPU seconds: user + system), or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    ppid = int(fields[1])
    utime, stime = int(fields[11]), int(fields[12])
    return ppid, (utime + stime) / TICK


def descendants_cpu(root: int, seen: dict[int, float]) -> None:
    """Update ``seen`` (pid -> CPU seconds) with every live process under ``root`` (itself included)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                parents[int(entry)], cpu[int(entry)] = st
    tree, frontier = {root}, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in tree:
                tree.add(child)
                frontier.append(child)
    for pid in tree:
        if pid in cpu:
            seen[pid] = max(seen.get(pid, 0.0), cpu[pid])


def run(cmd: list[str], interval: float = 1.0) -> dict[str, float | int]:
    """Run ``cmd`` and sample its process tree until it exits."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd)
    seen: dict[int, float] = {}
    while proc.poll() is None:
        descendants_cpu(proc.pid, seen)
        time.sleep(interval)
    return {"cpu_s": round(sum(seen.values()), 1), "wall_s": round(time.perf_counter() - start, 1),
            "rc": proc.returncode, "processes": len(seen), "interval_s": interval}


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file for the figures")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples of /proc")
    p.add_argument("cmd", nargs="+", help="the command (after --)")
    args = p.parse_args(argv)
    result = run(args.cmd, args.interval)
    Path(args.out).write_text(json.dumps(result) + "\n")
    print(f"[tree_cpu] {result}", file=sys.stderr)
    return int(result["rc"])


if __name__ == "__main__":
    sys.exit(main())
