"""Hostile requests against a real tool server: memory and liveness under the issue-28 mix.

Two measurements, one server subprocess (``medvqa-tools serve`` on loopback, ``--max-pixels``
scaled down to 4 M so the run fits a shared 2-core box; every per-request limit scales with it):

* **memory mix** -- the requests that each took hundreds of MB to GB before the per-request limits
  (:data:`MIX`): 30 ``hires_render`` calls in one ``/call_batch`` (raw results), 8 full-size PNGs in
  one call that reads one of them, a 16-bit PNG at the pixel limit, three small gzipped NIfTIs
  that declare 256 MB of voxels, six distinct full-size images zoomed (cached results keep their
  source). Reported: the server's peak RSS (``VmHWM``) above its RSS after warm-up, against
  :data:`CEILING_MIB` (what ``tests/hardening/test_request_limits.py`` asserts).
* **liveness** -- ``/health`` latency while the worst turns of item 1 (``"<think>" * 15000``,
  nested ``\\boxed{``) are posted to ``/get_observation`` in a loop, as a ratio of its latency on an
  idle server.

``--before DIR`` measures the same on a server run from another checkout (the commit before the
limits), recorded as ``before.*`` figures. ::

    python benchmarks/bench_hostile.py [--quick] [--before /path/to/checkout/before/the/limits]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import base64
import functools
import gzip
import io
import json
import os
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from bench_load import ServerProcess  # noqa: E402
from figures import record, results_dir_arg  # noqa: E402

MAX_PIXELS = 4_000_000
SERVER_ARGS = ["--tools", "image_zoom_in,hires_render", "--max-pixels", str(MAX_PIXELS), "--max-body-mb", "64"]
CEILING_MIB = 400
"""The mix must stay under this much peak RSS above the warmed-up server (at ``MAX_PIXELS``)."""
MiB = 1 << 20


def _png(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _gradient(size: int, seed: int = 0) -> Image.Image:
    ramp = (np.add.outer(np.arange(size), np.arange(size)) * 255 // (2 * size) + seed) % 256
    return Image.fromarray(ramp.astype(np.uint8)).convert("RGB")


def nifti_gz_bomb(shape=(512, 512, 256)) -> bytes:
    """A gzipped NIfTI-1 of float32 zeros: ~250 KB that declares ``prod(shape) * 4`` bytes (256 MB)."""
    header = bytearray(352)
    header[0:4] = struct.pack("<i", 348)
    header[40:56] = struct.pack("<8h", 3, *shape, 1, 1, 1, 1)
    header[70:74] = struct.pack("<hh", 16, 32)  # datatype FLOAT32, bitpix
    header[76:108] = struct.pack("<8f", 1, 1, 1, 1, 1, 1, 1, 1)
    header[108:112] = struct.pack("<f", 352.0)
    header[344:348] = b"n+1\x00"
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1) as f:
        f.write(bytes(header))
        chunk = bytes(1 << 22)
        left = int(np.prod(shape)) * 4
        while left > 0:
            f.write(chunk[:min(left, len(chunk))])
            left -= len(chunk)
    return out.getvalue()


def _call(tool: str, images: list, arguments: dict | None = None, **extra) -> dict:
    return {"tool": tool, "arguments": arguments or {}, "images": images, **extra}


@functools.lru_cache(maxsize=1)
def mix() -> tuple[tuple[str, str, dict], ...]:
    """``(part, endpoint, body)`` of the memory mix (module docstring); built once, never modified."""
    side = int(MAX_PIXELS ** 0.5)  # 2000: each image at the pixel limit
    from medvqa_env.images import image_digest

    source = _gradient(1024)
    small = {"png": _png(source), "digest": image_digest(source)}  # sent once, then referred to (as clients do)
    big = {"png": _png(_gradient(side))}
    grey16 = np.add.outer(np.arange(side), np.arange(side)).astype(np.uint16) * 16
    buf = io.BytesIO()
    Image.fromarray(grey16).save(buf, format="PNG")
    nifti = {"png": base64.b64encode(nifti_gz_bomb()).decode("ascii")}
    zoom = {"bbox": [0, 0, 400, 400]}
    parts = [("30 hires_render in one batch", "/call_batch",
              {"calls": [_call("hires_render", [small if i == 0 else {"ref": small["digest"]}], {"scale": 4},
                               image_format="raw") for i in range(30)]}),
             ("8 full-size images, one read", "/call", _call("image_zoom_in", [big] * 8, zoom)),
             ("16-bit image at the limit", "/call",
              _call("image_zoom_in", [{"png": base64.b64encode(buf.getvalue()).decode("ascii")}], zoom))]
    parts += [(f"gzipped NIfTI declaring 256 MB ({i + 1})", "/call", _call("image_zoom_in", [nifti], zoom))
              for i in range(3)]
    parts += [(f"distinct full-size image zoomed ({i + 1})", "/call",
               _call("image_zoom_in", [{"png": _png(_gradient(side, seed=17 * i + 1))}], zoom)) for i in range(6)]
    return tuple(parts)


def part(name: str) -> dict:
    """The body of one part of :func:`mix`."""
    return {p: body for p, _, body in mix()}[name]


def vm_hwm(pid: int) -> int:
    """Peak resident memory of ``pid`` in bytes (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/<pid>/status")


def run_mix(server: ServerProcess) -> dict:
    """Send the mix (one request at a time) and measure the peak RSS above the warmed-up server."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=300) as client:
        warm = client.post("/call", json=_call("image_zoom_in", [{"png": _png(_gradient(256))}], {"bbox": [0, 0, 64, 64]}))
        warm.raise_for_status()
        time.sleep(0.2)
        base = server.rss_bytes()
        statuses, refused = [], []
        for part, path, body in mix():
            r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
            statuses.append((part, r.status_code))
            if path == "/call_batch" and r.status_code == 200:
                refused.append(sum(1 for x in r.json()["results"] if x["error"]))
        peak = vm_hwm(server.pid)
    return {"base_rss_mib": base / MiB, "peak_growth_mib": max(0, peak - base) / MiB, "statuses": statuses,
            "batch_calls_refused": refused[0] if refused else None}


HEALTH_TIMEOUT_S = 180.0
WORST_TURNS = ["<think>" * 15000, "<think>" * 9000, "\\boxed{" * 4096 + "}" * 4096]


def health_latencies(server: ServerProcess, seconds: float, hostile: bool) -> tuple[list[float], int]:
    """``/health`` latencies (s) over ``seconds``, with the worst turns posted in a loop when
    ``hostile``; and how many hostile requests completed."""
    import httpx

    stop = threading.Event()
    done = [0]

    def attack() -> None:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            while not stop.is_set():
                try:
                    c.post("/get_observation", json={"actions": WORST_TURNS}).raise_for_status()
                except httpx.HTTPError:  # the server before the limits: a timeout
                    return
                done[0] += 1

    thread = threading.Thread(target=attack, daemon=True)
    if hostile:
        thread.start()
        time.sleep(0.2)
    out = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=server.url, timeout=HEALTH_TIMEOUT_S) as c:
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                c.get("/health").raise_for_status()
            except httpx.TimeoutException:  # counted as the timeout: a lower bound of the stall
                pass
            out.append(time.perf_counter() - start)
            time.sleep(0.02)
    stop.set()
    if hostile:
        thread.join(HEALTH_TIMEOUT_S)
    return out, done[0]


class CheckoutServer(ServerProcess):
    """A :class:`ServerProcess` run from another checkout's code (``--before``)."""

    def __init__(self, code: Path, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.code = Path(code)
        self.env = {**self.env, "PYTHONPATH": str(self.code)}

    def start(self, wait_s: float = 60.0) -> "ServerProcess":
        cmd = [sys.executable, "-m", "tool_backends.cli", self.command, "--port", str(self.port), *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=self.code, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.wait_healthy(wait_s)
        return self


def measure(make, seconds: float) -> dict:
    """The memory mix and the liveness phases on servers from ``make()``."""
    with make() as server:
        memory = run_mix(server)
    with make() as server:
        idle, _ = health_latencies(server, seconds, hostile=False)
        busy, attacks = health_latencies(server, seconds, hostile=True)
    return {**memory, "health_idle_p50_ms": statistics.median(idle) * 1000,
            "health_busy_p99_ms": sorted(busy)[int(0.99 * (len(busy) - 1))] * 1000,
            "health_busy_max_ms": max(busy) * 1000, "hostile_requests": attacks}


def _commit(path: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _recorded_before(results: Path) -> dict:
    """The ``before.*`` figures of the recorded run, if any."""
    try:
        recorded = json.loads((Path(results) / "hostile.json").read_text())["figures"]
    except (OSError, ValueError, KeyError):
        return {}
    return {k: v for k, v in recorded.items() if k.startswith("before.")}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter liveness phases; results not recorded")
    parser.add_argument("--before", default=None,
                        help="also measure a server run from this checkout (the code before the limits)")
    parser.add_argument("--before-label", default=None,
                        help="what --before is, for the report (default: its git commit)")
    parser.add_argument("--results", default=None, help="directory for the results (default benchmarks/results)")
    args = parser.parse_args(argv)
    seconds = 2.0 if args.quick else 6.0
    runs = {"": measure(lambda: ServerProcess("serve", SERVER_ARGS), seconds)}
    if args.before:
        runs["before."] = measure(lambda: CheckoutServer(args.before, "serve", SERVER_ARGS), seconds)
    now = runs[""]
    lines = [
        "## Hostile requests (issue 28)", "",
        f"Server: `medvqa-tools serve {' '.join(SERVER_ARGS)}` (every per-request limit scales with "
        f"`--max-pixels`). Memory mix, one request at a time; peak RSS (`VmHWM`) above the warmed-up "
        f"server (RSS {now['base_rss_mib']:.0f} MiB)"
        + (f"; \"before\" is the same run on `{args.before_label or _commit(Path(args.before))}`" if args.before else "") + ".", "",
        "| Request | Status | Status before |" if args.before else "| Request | Status |",
        "|---|---|---|" if args.before else "|---|---|",
    ]
    before = dict(runs["before."]["statuses"]) if args.before else {}
    for part, status in now["statuses"]:
        lines.append(f"| {part} | {status} |" + (f" {before.get(part)} |" if args.before else ""))
    lines.append("")
    for prefix, run in runs.items():
        label = "before" if prefix else "now"
        lines += [
            f"**{label}**: peak RSS growth over the mix **{run['peak_growth_mib']:.0f} MiB** (ceiling {CEILING_MIB} "
            f"MiB); calls of the 30-call batch answered with the response-size error: {run['batch_calls_refused']}. "
            f"`/health` while the worst turns of item 1 were posted in a loop ({run['hostile_requests']} requests of "
            f"{len(WORST_TURNS)} turns in {seconds:g} s): p99 {run['health_busy_p99_ms']:.1f} ms, slowest "
            f"{run['health_busy_max_ms']:.0f} ms, vs p50 {run['health_idle_p50_ms']:.1f} ms idle.", ""]
    figures = {"ceiling_mib": CEILING_MIB, "max_pixels": MAX_PIXELS, "mix_requests": len(now["statuses"])}
    for prefix, run in runs.items():
        figures.update({prefix + k: run[k] for k in ("peak_growth_mib", "batch_calls_refused", "health_idle_p50_ms",
                                                      "health_busy_p99_ms", "health_busy_max_ms", "hostile_requests")})
        figures[prefix + "health_ratio_p99"] = run["health_busy_p99_ms"] / run["health_idle_p50_ms"]
    results = results_dir_arg(args.quick, args.results)
    if not args.before and results is not None:  # keep the one-time measurement of the old code
        kept = _recorded_before(results)
        if kept:
            figures.update(kept)
            lines += [f"**before** (carried over from the recorded `--before` run; pass `--before` to remeasure): "
                      f"peak RSS growth {kept['before.peak_growth_mib']:.0f} MiB, `/health` slowest "
                      f"{kept['before.health_busy_max_ms']:.0f} ms.", ""]
    command = "python benchmarks/bench_hostile.py" + (" --before <checkout before the limits>" if args.before else "")
    record("hostile", "\n".join(lines), figures, command, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
