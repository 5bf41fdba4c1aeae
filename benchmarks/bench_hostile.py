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
limits), recorded as ``before.*`` figures.

``--attacks`` measures issue 40's attacks on the request path instead (results ``hostile_attacks``):
body bytes read before an unauthenticated ``/call`` gets its 401 and what an unauthenticated
``Expect: 100-continue`` gets; ``/health`` p99 while 255 requests wait on refs (lock-out), while
255 bodies drip, and while a 1.2 M-ref body is posted; the client's wall time for a ``timeout_s=3``
call against a dripping server. ``--cost``: the server's and the client's CPU per cached ``/call``.
``--before`` runs each on the other checkout's server and client. ::

    python benchmarks/bench_hostile.py [--quick] [--attacks | --cost] [--before /path/to/checkout/before/the/limits]
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


# ---- issue 40: the attacks on the request path -------------------------------------------------
ATTACK_ARGS = ["--tools", "image_zoom_in"]  # default limits otherwise: the "at default settings"
TOKEN_ENV = "MEDVQA_BENCH_HOSTILE_TOKEN"
N_CONNECTIONS = 255
"""Connections a lock-out or drip attack holds (the default --max-connections is 256)."""


def _head(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


def _health_once(port: int) -> tuple[float, bool]:
    """One ``GET /health`` on a fresh loopback connection, as a health checker makes it: its latency
    (s, connect to the end of the body) and whether it was a 200. A raw socket, so the probe's own
    CPU (an ``httpx`` client per call costs milliseconds) is not what is measured."""
    import socket

    start = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        ok = data.startswith(b"HTTP/1.1 200")
    except OSError:
        ok = False
    return time.perf_counter() - start, ok


def _health_during(url: str, seconds: float) -> dict:
    """``/health`` sampled every 20 ms for ``seconds``: p99 and slowest latency (ms), non-200 count,
    and the 1-minute load average when sampling ended (the box's other work is part of the tail)."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    lat, bad = [], 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        took, ok = _health_once(port)
        bad += not ok
        lat.append(took)
        time.sleep(0.02)
    lat.sort()
    return {"p50_ms": lat[len(lat) // 2] * 1000, "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1000,
            "max_ms": lat[-1] * 1000, "not_200": bad, "samples": len(lat), "load_1m": round(os.getloadavg()[0], 2)}


def bytes_before_401(port: int, path: str = "/call", claimed: int = 16 << 20) -> tuple[int, str]:
    """Body bytes the server let in before answering an unauthenticated request; and the first
    status line an unauthenticated ``Expect: 100-continue`` gets."""
    import select
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(_head(path, claimed))
        sent, piece = 0, b" " * 65536
        while sent < claimed:
            if select.select([s], [], [], 0.3 if sent == 0 else 0)[0]:
                break
            try:
                s.sendall(piece)
            except OSError:
                break
            sent += len(piece)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(_head(path, claimed, "Expect: 100-continue\r\n"))
        first = s.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
    return sent, first


def _hold(port: int, n: int, request: bytes, drip: bool, seconds: float, url: str) -> dict:
    """``n`` connections sending ``request`` (its last byte, then one byte a second, when ``drip``),
    with ``/health`` sampled meanwhile."""
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(request[:-1] if drip else request)
            socks.append(s)
        stop = threading.Event()

        def dripper():
            while not stop.wait(1.0):
                for s in socks:
                    try:
                        s.send(b" ")
                    except OSError:
                        pass

        if drip:
            threading.Thread(target=dripper, daemon=True).start()
        time.sleep(0.3)
        out = _health_during(url, seconds)
        stop.set()
        return out
    finally:
        for s in socks:
            s.close()


def client_worst_call_s(code: Path, timeout_s: float = 3.0) -> float:
    """The wall time of one ``HTTPToolBackend.call`` (``timeout_s``, no retries) against a server
    that drips its body one byte every 0.5 s, with the client of the checkout at ``code``."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    tools = json.dumps({"tools": [{"type": "function", "function": {"name": "echo", "parameters": {}}}]}).encode()

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    def one(conn):
        with conn:
            try:
                data = conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n")
                for _ in range(120):  # a minute of drip at most
                    time.sleep(0.5)
                    conn.sendall(b" ")
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    probe = ("import time\nfrom PIL import Image\nfrom tool_backends.base import ToolContext\n"
             "from tool_backends.http_client import HTTPToolBackend\n"
             f"b = HTTPToolBackend(url='http://127.0.0.1:{port}', timeout_s={timeout_s}, retries=0)\n"
             "t = time.monotonic()\ntry:\n    b.call('echo', [Image.new('RGB', (4, 4))], {}, ToolContext())\n"
             "except Exception as e:\n    pass\nprint(time.monotonic() - t)\n")
    try:
        out = subprocess.run([sys.executable, "-c", probe], cwd=code, env={**os.environ, "PYTHONPATH": str(code)},
                             capture_output=True, text=True, timeout=120)
        return float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else float("nan")
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return 120.0
    finally:
        srv.close()


def measure_attacks(make, code: Path, seconds: float) -> dict:
    """Attacks 2, 3, 4, 5 and 9 of issue 40 on servers from ``make(args, env)``."""
    import httpx

    out = {}
    with make(ATTACK_ARGS + ["--token-env", TOKEN_ENV], {TOKEN_ENV: "bench-token"}) as server:
        out["bytes_before_401"], out["expect_100_answer"] = bytes_before_401(server.port)
    with make(ATTACK_ARGS, {}) as server:
        out["health_idle"] = _health_during(server.url, seconds)  # the baseline: this server, this run, no attack
        digest = "ab" * 16
        httpx.post(server.url + "/call", json={"tool": "image_zoom_in", "images": [{"ref": digest}]}, timeout=30)
        body = json.dumps({"tool": "image_zoom_in", "arguments": {}, "images": [{"ref": digest}] * 30}).encode()
        out["lockout"] = _hold(server.port, N_CONNECTIONS, _head("/call", len(body)) + body, False, seconds, server.url)
    with make(ATTACK_ARGS, {}) as server:
        out["drip_idle"] = _health_during(server.url, seconds)
        out["drip"] = _hold(server.port, N_CONNECTIONS, _head("/call", 1000) + b"{", True, seconds, server.url)
    with make(ATTACK_ARGS, {}) as server:
        flood = json.dumps({"tool": "image_zoom_in", "images": [{"ref": f"{i:x}"} for i in range(1_200_000)]}).encode()
        result = {}

        def send():
            start = time.perf_counter()
            try:
                r = httpx.post(server.url + "/call", content=flood, headers={"content-type": "application/json"},
                               timeout=120)
                result["status"] = r.status_code
            except httpx.HTTPError as e:
                result["status"] = type(e).__name__
            result["s"] = time.perf_counter() - start

        out["ref_flood_idle"] = _health_during(server.url, seconds)
        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        out["ref_flood_health"] = _health_during(server.url, seconds)
        thread.join(130)
        out["ref_flood_status"], out["ref_flood_s"] = result.get("status"), result.get("s")
    out["client_worst_call_s"] = client_worst_call_s(code)
    return out


def attacks_main(args, results) -> int:
    seconds = 3.0 if args.quick else 8.0

    def now(extra, env):
        return ServerProcess("serve", extra, env=env)

    runs = {"": measure_attacks(now, REPO, seconds)}
    if args.before:
        runs["before."] = measure_attacks(lambda extra, env: CheckoutServer(args.before, "serve", extra, env=env),
                                          Path(args.before), seconds)
    for run in runs.values():
        phases = [run[k] for k in ("health_idle", "lockout", "drip", "ref_flood_health")]
        run["p50s"] = " / ".join(f"{p['p50_ms']:.1f}" for p in phases)
        run["loads"] = " / ".join(f"{p['load_1m']:.1f}" for p in phases)
        run["niceness"] = os.nice(0)
    label = args.before_label or (_commit(Path(args.before)) if args.before else None)
    rows = [("Unauthenticated `/call`: body bytes read before the 401 (16 MiB offered)", "bytes_before_401", "{:.0f}"),
            ("Unauthenticated `Expect: 100-continue`: first answer", "expect_100_answer", "{}"),
            (f"`/health` p99 (ms), {N_CONNECTIONS} requests each waiting on 30 refs (lock-out)", "lockout.p99_ms", "{:.1f}"),
            ("  ... `/health` answers that were not 200", "lockout.not_200", "{:.0f}"),
            (f"`/health` p99 (ms), {N_CONNECTIONS} bodies dripping 1 byte/s", "drip.p99_ms", "{:.1f}"),
            ("  ... `/health` answers that were not 200", "drip.not_200", "{:.0f}"),
            ("`/health` p99 (ms) while a 1.2 M-ref body is posted", "ref_flood_health.p99_ms", "{:.1f}"),
            ("  ... that request's answer", "ref_flood_status", "{}"),
            ("  ... and its time (s)", "ref_flood_s", "{:.2f}"),
            ("Client call with `timeout_s=3` against a 2 byte/s drip (s)", "client_worst_call_s", "{:.1f}"),
            ("`/health` p99 (ms), idle server (before the lock-out, same server)", "health_idle.p99_ms", "{:.1f}"),
            ("  ... idle before the drip, same server", "drip_idle.p99_ms", "{:.1f}"),
            ("  ... idle before the ref flood, same server", "ref_flood_idle.p99_ms", "{:.1f}"),
            ("`/health` p50 (ms): idle / lock-out / drip / ref flood", "p50s", "{}"),
            ("1-min load average: idle / lock-out / drip / ref flood", "loads", "{}"),
            ("Niceness of the bench, its servers and probes", "niceness", "{}")]

    def get(run, key):
        value = run
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    lines = ["## Issue 40: the request path under attack", "",
             f"`medvqa-tools serve {' '.join(ATTACK_ARGS)}` at default limits; `/health` sampled every 20 ms for "
             f"{seconds:g} s during each attack and for as long on the same server, idle, just before it (fresh "
             "loopback connection per probe, raw socket)" + (f"; \"before\" is `{label}`" if args.before else "") +
             f". The whole run (bench, servers, probes) at niceness {os.nice(0)}"
             + (" (`nice -n -10`, above the box's other jobs)" if os.nice(0) < 0 else "") + ".", "",
             "| Attack | Now |" + (" Before |" if args.before else ""), "|---|---|" + ("---|" if args.before else "")]
    figures = {}
    for text, key, fmt in rows:
        cells = []
        for prefix, run in runs.items():
            value = get(run, key)
            cells.append("n/a" if value is None else fmt.format(value))
            figures[f"{prefix}attacks.{key}".replace("..", ".")] = value
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
    lines.append("")
    command = "python benchmarks/bench_hostile.py --attacks" + (" --before <checkout before issue 40>" if args.before else "")
    record("hostile_attacks", "\n".join(lines), figures, command, results)
    return 0


COST_PROBE = """
import json, sys, time
from tool_backends.http_client import ConnectionPool
url, n, body = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
pool = ConnectionPool(url, 1, 5)
headers = {"content-type": "application/json", "accept": "application/json"}
assert pool.request("POST", "/call", body, headers, 30).status_code == 200
start = time.process_time()
for _ in range(n):
    pool.request("POST", "/call", body, headers, 30)
print((time.process_time() - start) / n)
"""


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request_cost(make, code: Path, n: int) -> dict:
    """Per cached ``/call`` (the rest of a GRPO group: its image and result held by the server):
    the server's CPU, and the client's CPU with the connection of the checkout at ``code``."""
    import httpx

    from tool_backends.wire import encode_image

    image = Image.radial_gradient("L").resize((128, 128)).convert("RGB")
    entry = encode_image(image, "raw")
    call = {"tool": "image_zoom_in", "arguments": {"bbox": [0, 0, 64, 64]}, "image_format": "raw", "derived_ok": True}
    with make(ATTACK_ARGS, {}) as server:
        assert httpx.post(server.url + "/call", json={**call, "images": [entry]}, timeout=30).status_code == 200
        body = json.dumps({**call, "images": [{"ref": entry["digest"]}]})
        before = _cpu_s(server.pid)
        out = subprocess.run([sys.executable, "-c", COST_PROBE, server.url, str(n), body], cwd=code,
                             env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True, timeout=600)
        server_s = (_cpu_s(server.pid) - before) / (n + 1)
    return {"server_us": server_s * 1e6, "client_us": float(out.stdout.strip().splitlines()[-1]) * 1e6}


def cost_main(args, results) -> int:
    n = 300 if args.quick else 2000
    runs = {"": request_cost(lambda extra, env: ServerProcess("serve", extra, env=env), REPO, n)}
    if args.before:
        runs["before."] = request_cost(lambda extra, env: CheckoutServer(args.before, "serve", extra, env=env),
                                       Path(args.before), n)
    label = args.before_label or (_commit(Path(args.before)) if args.before else None)
    now, before = runs[""], runs.get("before.")
    lines = ["## Issue 40: what the checks cost a cached call", "",
             f"{n} cached `/call`s by ref (`image_zoom_in`, the rest of a GRPO group) on one keep-alive connection, "
             "each server and client from its own checkout" + (f" (before: `{label}`)" if label else "") + ".", "",
             "| CPU per request (us) | Now |" + (" Before | Now / before |" if before else ""),
             "|---|---|" + ("---|---|" if before else "")]
    figures = {}
    for key, text in (("server_us", "server (RequestGate, JSON bounds, disconnect watch)"),
                      ("client_us", "client (`Connection` on h11 vs the hand-written one)")):
        row = f"| {text} | {now[key]:.0f} |"
        figures[f"cost.{key}"] = now[key]
        if before:
            row += f" {before[key]:.0f} | {now[key] / before[key]:.2f} |"
            figures[f"before.cost.{key}"] = before[key]
            figures[f"cost.{key}_ratio"] = now[key] / before[key]
        lines.append(row)
    lines.append("")
    command = "python benchmarks/bench_hostile.py --cost" + (" --before <checkout before issue 40>" if args.before else "")
    record("hostile_cost", "\n".join(lines), figures, command, results)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter liveness phases; results not recorded")
    parser.add_argument("--before", default=None,
                        help="also measure a server run from this checkout (the code before the limits)")
    parser.add_argument("--before-label", default=None,
                        help="what --before is, for the report (default: its git commit)")
    parser.add_argument("--results", default=None, help="directory for the results (default benchmarks/results)")
    parser.add_argument("--attacks", action="store_true",
                        help="measure issue 40's attacks on the request path instead (results: hostile_attacks)")
    parser.add_argument("--cost", action="store_true",
                        help="measure what issue 40's checks cost a cached call instead (results: hostile_cost)")
    args = parser.parse_args(argv)
    if args.cost:
        return cost_main(args, results_dir_arg(args.quick, args.results))
    if args.attacks:
        return attacks_main(args, results_dir_arg(args.quick, args.results))
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
