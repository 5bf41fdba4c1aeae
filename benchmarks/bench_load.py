"""Load test: many concurrent clients against a real tool server and router on loopback.

Three targets, one run, the same workload (``segment`` and ``image_zoom_in`` calls with a random box
on a real image, so the server cache does not answer for the tool):

* ``in-process`` -- the baseline: N threads calling the tools through ``LocalBackend`` directly;
* ``server``     -- N threads, each with its own ``HTTPToolBackend``, against ``medvqa-tools serve``;
* ``router``     -- the same clients against ``medvqa-tools router`` in front of that server.

Each target runs for a fixed time after a warm-up. Reported: calls/s, p50/p99 latency, errors
(any exception or ``ToolResult.error``; goal 0) and the server's RSS after warm-up and at the end
(goal: no growth). ::

    python benchmarks/bench_load.py [--quick] [--clients 16] [--duration 10]

:class:`ServerProcess` (start, kill, SIGSTOP/SIGCONT, restart a real server subprocess) and
:func:`run_load` are reused by ``tests/hardening`` and ``benchmarks/soak.py``.
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from PIL import Image  # noqa: E402

from figures import record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)
from tool_backends.base import ToolContext  # noqa: E402

TOOLS = ("segment", "image_zoom_in")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A ``medvqa-tools`` subprocess (``serve`` or ``router``) on a free loopback port.

    ``args`` are the CLI arguments after the command, e.g. ``["--tools", "segment"]``. The process
    can be killed (SIGKILL), stalled (SIGSTOP) and resumed, and restarted on the same port.
    """

    def __init__(self, command: str = "serve", args: Sequence[str] = ("--tools", ",".join(TOOLS)),
                 port: int | None = None, env: dict | None = None, log_path: str | os.PathLike | None = None) -> None:
        self.command, self.args = command, list(args)
        self.port = port or free_port()
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="medvqa-srv-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("expected a started server, got none")
        return self.proc.pid

    def start(self, wait_s: float = 60.0) -> "ServerProcess":
        cmd = [sys.executable, "-m", "tool_backends.cli", self.command, "--port", str(self.port), *self.args]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.wait_healthy(wait_s)
        return self

    def wait_healthy(self, wait_s: float = 60.0) -> None:
        import httpx

        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server on {self.url} not healthy after {wait_s} s: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def rss_bytes(self) -> int:
        import psutil

        return psutil.Process(self.pid).memory_info().rss

    def kill(self) -> None:
        """SIGKILL: the server dies mid-request, no cleanup."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stall(self) -> None:
        """SIGSTOP: the socket stays open and accepts, nothing answers."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def restart(self, wait_s: float = 60.0) -> "ServerProcess":
        self.kill()
        return self.start(wait_s)

    def close(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> "ServerProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.close()


def test_image(size: int = 256) -> Image.Image:
    """A real image: the first embedded phantom (the env's default dataset), resized to ``size``."""
    from medvqa_env.datasets import load_dataset
    from medvqa_env.images import load_image

    record = load_dataset("embedded", split="test")[0]
    return load_image(record.image_paths[0]).convert("RGB").resize((size, size))


def random_call(rng: random.Random, size: int) -> tuple[str, dict]:
    """One tool call with a random box (the cache cannot answer it for the tool)."""
    x0, y0 = rng.randrange(size // 2), rng.randrange(size // 2)
    x1, y1 = x0 + rng.randrange(24, size // 2), y0 + rng.randrange(24, size // 2)
    return rng.choice(TOOLS), {"bbox": [x0, y0, x1, y1]}


@dataclass
class LoadResult:
    target: str
    calls: int
    errors: int
    seconds: float
    latencies_s: list[float] = field(repr=False, default_factory=list)
    first_errors: list[str] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        xs = sorted(self.latencies_s)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_load(make_caller: Callable[[], Callable[[str, dict], object]], clients: int, duration_s: float,
             image: Image.Image, target: str = "", seed: int = 0, max_calls: int | None = None) -> LoadResult:
    """``clients`` threads, each with its own caller from ``make_caller``, calling for ``duration_s``
    (or ``max_calls`` calls each). A caller returns a ``ToolResult``; an exception or an error counts."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s
    start = threading.Barrier(clients + 1)

    def worker(i: int) -> None:
        call = make_caller()
        rng = random.Random(seed * 1000 + i)
        mine, bad = [], []
        start.wait()
        n = 0
        while time.monotonic() < stop_at and (max_calls is None or n < max_calls):
            name, args = random_call(rng, image.size[0])
            t0 = time.perf_counter()
            try:
                result = call(name, args)
                if getattr(result, "error", None):
                    bad.append(f"{name}: {result.error}")
            except Exception as e:  # counted, never raised: the point is to see them
                bad.append(f"{name}: {type(e).__name__}: {e}")
            mine.append(time.perf_counter() - t0)
            n += 1
        getattr(call, "close", lambda: None)()
        with lock:
            latencies.extend(mine)
            errors.extend(bad)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    return LoadResult(target, len(latencies), len(errors), elapsed, latencies, errors[:5])


def local_caller(image: Image.Image) -> Callable[[], Callable[[str, dict], object]]:
    from tool_backends.registry import build_tool
    from tool_backends.toolbox import LocalBackend

    backend = LocalBackend([build_tool(t) for t in TOOLS])
    context = ToolContext("load", "embedded")
    return lambda: (lambda name, args: backend.call(name, [image], args, context))


def http_caller(url: str, image: Image.Image, timeout_s: float = 30.0, token_env: str | None = None):
    from tool_backends.http_client import HTTPToolBackend

    context = ToolContext("load", "embedded")

    def make():
        client = HTTPToolBackend(tools=list(TOOLS), url=url, timeout_s=timeout_s, token_env=token_env, pool_size=2)

        def call(name, args):
            return client.call(name, [image], args, context)

        call.close = client.close  # run_load closes each client when its worker ends
        return call

    return make


# ---- the benchmark --------------------------------------------------------------------------------
def measure(clients: int, duration_s: float, warmup_s: float, size: int) -> tuple[list[LoadResult], dict]:
    image = test_image(size)
    results, memory = [], {}
    results.append(run_load(local_caller(image), clients, duration_s, image, "in-process"))
    server_args = ["--tools", ",".join(TOOLS), "--cache-size", "0", "--max-concurrency", "4"]
    with ServerProcess("serve", server_args) as server:
        caller = http_caller(server.url, image)
        run_load(caller, clients, warmup_s, image, "warm-up", seed=99)
        memory["server_before"] = server.rss_bytes()
        results.append(run_load(caller, clients, duration_s, image, "server"))
        upstream = ",".join(f"{t}={server.url}" for t in TOOLS)
        with ServerProcess("router", ["--upstream", upstream, "--wait-s", "30"]) as router:
            rcaller = http_caller(router.url, image)
            run_load(rcaller, clients, warmup_s, image, "warm-up", seed=98)
            memory["router_before"] = router.rss_bytes()
            results.append(run_load(rcaller, clients, duration_s, image, "router"))
            memory["router_after"] = router.rss_bytes()
        memory["server_after"] = server.rss_bytes()
    return results, memory


def figures_of(results: list[LoadResult], memory: dict) -> dict[str, float]:
    """The named figures of a run (see benchmarks/figures.py)."""
    base = results[0].throughput or float("nan")
    out: dict[str, float] = {}
    for r in results:
        key = r.target.replace("-", "_")
        out.update({f"{key}.calls": r.calls, f"{key}.calls_per_s": r.throughput, f"{key}.ratio": r.throughput / base,
                    f"{key}.p50_ms": r.percentile(0.5) * 1e3, f"{key}.p99_ms": r.percentile(0.99) * 1e3,
                    f"{key}.errors": r.errors})
    out["calls_total"] = sum(r.calls for r in results)
    out["errors_total"] = sum(r.errors for r in results)
    mb = 1024 * 1024
    for name in ("server", "router"):
        if f"{name}_before" in memory:
            out[f"{name}.rss_before_mib"] = memory[f"{name}_before"] / mb
            out[f"{name}.rss_after_mib"] = memory[f"{name}_after"] / mb
            out[f"{name}.rss_growth_mib"] = (memory[f"{name}_after"] - memory[f"{name}_before"]) / mb
    return out


def to_markdown(results: list[LoadResult], memory: dict, command: str, clients: int, duration_s: float) -> str:
    base = results[0].throughput or float("nan")
    lines = [
        "## Tool server under load",
        "",
        f"`{command}`",
        "",
        f"{clients} concurrent clients per target for {duration_s:g} s each (after a warm-up), real HTTP on "
        f"loopback, `segment` and `image_zoom_in` with random boxes on a 256x256 image, server cache off, "
        f"`--max-concurrency 4`, {os.cpu_count()} CPU cores shared by clients and servers.",
        "",
        "| target | calls | calls/s | vs in-process | p50 ms | p99 ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r.target} | {r.calls} | {r.throughput:.0f} | {r.throughput / base:.2f}x | "
                     f"{r.percentile(0.5) * 1e3:.1f} | {r.percentile(0.99) * 1e3:.1f} | {r.errors} |")
    mb = 1024 * 1024
    lines += [
        "",
        "| process | RSS after warm-up MiB | RSS at end MiB | growth MiB |",
        "|---|---:|---:|---:|",
    ]
    for name in ("server", "router"):
        if f"{name}_before" in memory:
            b, a = memory[f"{name}_before"] / mb, memory[f"{name}_after"] / mb
            lines.append(f"| {name} | {b:.0f} | {a:.0f} | {a - b:+.1f} |")
    errs = [e for r in results for e in r.first_errors]
    if errs:
        lines += ["", "First errors:", *[f"- `{e[:200]}`" for e in errs]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 clients, 2 s per target")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per target")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--out", default=None, help="also write the Markdown here")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                    "none with --quick)")
    args = p.parse_args(argv)
    clients, duration, warmup = (4, 2.0, 1.0) if args.quick else (args.clients, args.duration, 3.0)
    results, memory = measure(clients, duration, warmup, args.size)
    command = "python benchmarks/bench_load.py" + (" --quick" if args.quick else
                                                   f" --clients {clients} --duration {duration:g}")
    text = to_markdown(results, memory, command, clients, duration)
    record("load", text, figures_of(results, memory), command, results_dir_arg(args.quick, args.results))
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
