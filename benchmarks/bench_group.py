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

Remote (the seed's deployment: env copies in separate processes, tools behind a server, or behind
the router in front of it): the same three cases with 8 concurrent clients, each its own
``HTTPToolBackend`` (default settings: optimistic image refs, server cache on) and its own copy of
a fresh image, against a real ``medvqa-tools serve`` process (and ``medvqa-tools router``) on
loopback; the baseline is one client making the call on the same path. *Tool ran* is the
server's own count of tool runs (``/health`` ``computed``): identical calls in flight at once run
once (single-flight, :mod:`tool_backends.single_flight`).

    python benchmarks/bench_group.py [--quick] [--reps 5]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
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


class Server:
    """A ``medvqa-tools`` process (``serve`` or ``router``) on a free loopback port."""

    def __init__(self, args: list[str]) -> None:
        import socket

        import httpx

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-m", "tool_backends.cli", *args, "--port", str(port)],
                                     cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(1200):
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError(f"{args[0]} did not start")

    def health(self) -> dict:
        import httpx

        return httpx.get(self.url + "/health", timeout=10).json()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def trained_sam_folder(root: Path) -> str:
    """A SAM folder as ``python -m tool_backends.finetune segment`` writes it (2 steps: the trained
    tool's architecture and cost per call; its answers do not matter here)."""
    out = root / "segment"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "tool_backends.finetune", "segment", "--out", str(out), "--steps", "2",
                    "--max-images", "16", "--torch-threads", "1"], cwd=ROOT, env=env, check=True, capture_output=True,
                   timeout=900)
    return str(out)


def measure_remote(reps: int, fresh, via_router: bool, engine: str = "classical",
                   model: str | None = None) -> dict[str, float]:
    """One client vs 8 concurrent clients (same call / 8 questions) against a real server (or the
    router in front of one); each client its own backend and its own copy of a fresh image."""
    from PIL import Image

    from medvqa_env.datasets import load_dataset
    from medvqa_env.images import ImageCache
    from tool_backends.base import ToolContext
    from tool_backends.http_client import HTTPToolBackend

    records = list(load_dataset("embedded", split="test"))
    tmp = tempfile.TemporaryDirectory(prefix="medvqa-group-images-")
    base_images = {r.image_paths[0]: Image.open(r.image_paths[0]).convert("RGB") for r in records}
    arguments = {"bbox": [60, 60, 200, 200]}
    server = Server(["serve", "--tools", "segment", "--engine", f"segment={engine}"]
                    + (["--tool-opt", f"segment.model={model}"] if model else []))
    front = Server(["router", "--upstream", f"segment={server.url}"]) if via_router else server
    clients = [HTTPToolBackend(tools=["segment"], url=front.url) for _ in range(GROUP)]

    def question(n: int):
        """Record n's context and a never-sent image (its pixels changed in one corner), saved as a file."""
        record = records[n % len(records)]
        image = base_images[record.image_paths[0]].copy()
        image.putpixel((0, 0), (n % 256, (n // 256) % 256, 99))
        path = Path(tmp.name) / f"q{n}.png"
        image.save(path)
        return path, ToolContext(record_id=f"{record.id}-{n}", dataset=record.dataset, question=record.question)

    def loaded(path: Path, copies: int) -> list:
        """The image as each of ``copies`` env copies holds it at its step: each copy (a process of
        its own) loads the file through its own :class:`ImageCache` at reset, outside the timing."""
        return [ImageCache().load(path) for _ in range(copies)]

    def run(calls) -> float:
        """``calls``: (client, image, context) per thread, started together; wall seconds to the last answer."""
        start = threading.Barrier(len(calls) + 1)
        errors: list = []

        def one(client, image, ctx):
            start.wait()
            result = client.call("segment", [image], arguments, ctx)
            if not result.ok:
                errors.append(result.error)

        threads = [threading.Thread(target=one, args=c) for c in calls]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"tool errors: {errors[:2]}")
        return elapsed

    cases = ("one", "group", "served", "distinct")
    rows: dict[str, list[float]] = {case: [] for case in cases}
    ran: dict[str, list[int]] = {case: [] for case in cases}
    try:
        for rep in range(reps + 1):  # rep 0 warms up (connections, imports, first decode)
            for case in cases:
                if case == "distinct":
                    calls = [(c, loaded(path, 1)[0], ctx) for c, (path, ctx) in
                             zip(clients, (question(next(fresh)) for _ in clients))]
                elif case == "served":  # the group's call again: image and result on the server already
                    calls = [(c, image, ctx) for c, image in zip(clients, loaded(path, GROUP))]
                else:
                    path, ctx = question(next(fresh))
                    n = 1 if case == "one" else GROUP
                    calls = [(c, image, ctx) for c, image in zip(clients[:n], loaded(path, n))]
                before = server.health()["computed"]
                elapsed = run(calls)
                if rep:
                    rows[case].append(elapsed)
                    ran[case].append(server.health()["computed"] - before)
    finally:
        tmp.cleanup()
        for c in clients:
            c.close()
        if front is not server:
            front.close()
        server.close()
    out = {f"{case}_s": statistics.median(v) for case, v in rows.items()}
    out.update({f"{case}_calls": statistics.median(v) for case, v in ran.items()})
    out["group_ratio"] = out["group_s"] / out["one_s"]
    out["served_ratio"] = out["served_s"] / out["one_s"]
    out["distinct_ratio"] = out["distinct_s"] / out["one_s"]
    return out


BARE_ASGI = """
import sys, uvicorn
async def app(scope, receive, send):  # reads the body, answers a fixed small JSON: uvicorn's own cost
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = b'{"result": {"text": "ok"}}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_floor(n: int = 2000) -> dict[str, float]:
    """Per request, on one keep-alive connection, one request at a time: the server's CPU for a
    ``/call`` whose image and result it holds (the rest of a GRPO group) against a bare uvicorn
    app's for the same bytes, and the client's CPU with this project's connection against the
    standard library's ``http.client`` (both against the bare app)."""
    import http.client
    import json
    import socket

    from PIL import Image

    from medvqa_env.datasets import load_dataset
    from tool_backends.http_client import ConnectionPool
    from tool_backends.wire import encode_image

    record = next(iter(load_dataset("embedded", split="test")))
    entry = encode_image(Image.open(record.image_paths[0]).convert("RGB"), "raw")
    call = {"tool": "segment", "arguments": {"bbox": [60, 60, 200, 200]}, "context": {"record_id": record.id},
            "image_format": "raw", "derived_ok": True}
    ref_body = json.dumps({**call, "images": [{"ref": entry["digest"]}]}).encode()
    headers = {"content-type": "application/json", "accept": "application/json"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        bare_port = s.getsockname()[1]
    bare = subprocess.Popen([sys.executable, "-c", BARE_ASGI, str(bare_port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ours = Server(["serve", "--tools", "segment", "--engine", "segment=classical"])
    out = {}
    try:
        ours_pool = ConnectionPool(ours.url, 1, 5)
        assert ours_pool.request("POST", "/call", json.dumps({**call, "images": [entry]}).encode(), headers, 30).status_code == 200
        bare_pool = ConnectionPool(f"http://127.0.0.1:{bare_port}", 1, 5)
        for _ in range(300):
            try:
                bare_pool.request("POST", "/call", ref_body, headers, 5)
                break
            except OSError:
                time.sleep(0.1)

        def timed(send, pid: int) -> tuple[float, float]:
            send()  # warm
            server0, client0 = process_cpu_s(pid), time.process_time()
            for _ in range(n):
                send()
            return (process_cpu_s(pid) - server0) / n, (time.process_time() - client0) / n

        out["server_ours_s"], out["client_ours_s"] = timed(
            lambda: ours_pool.request("POST", "/call", ref_body, headers, 30), ours.proc.pid)
        out["server_bare_s"], out["client_connection_s"] = timed(
            lambda: bare_pool.request("POST", "/call", ref_body, headers, 30), bare.pid)
        stdlib = http.client.HTTPConnection("127.0.0.1", bare_port, timeout=30)

        def via_http_client():
            stdlib.request("POST", "/call", body=ref_body, headers=headers)
            stdlib.getresponse().read()

        _, out["client_http_client_s"] = timed(via_http_client, bare.pid)
        stdlib.close()
    finally:
        ours.close()
        bare.terminate()
        bare.wait(10)
    out["server_ratio"] = out["server_ours_s"] / out["server_bare_s"]
    out["client_ratio"] = out["client_connection_s"] / out["client_http_client_s"]
    return out


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5, help="repetitions in-process (each on fresh questions: at most 8)")
    p.add_argument("--remote-reps", type=int, default=15,
                   help="repetitions of the remote rows (tens of ms each: more of them steady the median)")
    p.add_argument("--remote-rounds", type=int, default=3,
                   help="rounds of each remote row (servers started afresh; the row is the median round's)")
    p.add_argument("--quick", action="store_true", help="2 repetitions, thread and process only, nothing recorded")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = p.parse_args(argv)
    reps = 2 if args.quick else args.reps
    remote_reps = 2 if args.quick else args.remote_reps
    backends = ("thread", "process") if args.quick else ("thread", "process", "ray")
    fresh = iter(range(10_000))
    results = {b: measure(b, reps, fresh) for b in backends}
    if "ray" in results:
        import ray

        ray.shutdown()
    floor = measure_floor(300 if args.quick else 2000)
    with tempfile.TemporaryDirectory(prefix="medvqa-group-") as tmp:
        sam = trained_sam_folder(Path(tmp))
        for engine, model in (("classical", None), ("sam", sam)):
            for via, name in ((False, f"remote server, {engine}"), (True, f"remote, through the router, {engine}")):
                rounds = [measure_remote(remote_reps, fresh, via, engine, model)
                          for _ in range(1 if args.quick else args.remote_rounds)]
                rounds.sort(key=lambda r: r["group_ratio"])
                results[name] = {**rounds[len(rounds) // 2],  # the median round is the row
                                 "rounds": len(rounds), "group_ratio_min": rounds[0]["group_ratio"],
                                 "group_ratio_max": rounds[-1]["group_ratio"]}
    lines = ["## A GRPO group's identical tool call (`benchmarks/bench_group.py`)", "",
             f"`segment` (classical engine unless named) on fresh embedded questions; median of {reps} repetitions "
             f"in-process, {remote_reps} remote; "
             "ratios against one copy making the call in the same pool.", "",
             "| pool | one copy (s) | group of 8, same call (s) | ratio | tool ran | 8 different questions (s) | ratio | tool ran |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    figures = {}
    names = {f"remote{via}, {e}": f"{name}_{e}" for e in ("classical", "sam")
             for via, name in ((" server", "server"), (", through the router", "router"))}
    for b, r in results.items():
        lines.append(f"| {b} | {r['one_s']:.4f} | {r['group_s']:.4f} | {r['group_ratio']:.2f}× | {r['group_calls']:.0f} | "
                     f"{r['distinct_s']:.4f} | {r['distinct_ratio']:.2f}× | {r['distinct_calls']:.0f} |")
        figures.update({f"{names.get(b, b)}.{k}": v for k, v in r.items()})
    lines += ["", "Remote: the floor under a group's ratio. The group's call made again by the 8 clients, its image "
              "and result already on the server (no upload, no computation: only 8 requests served):", "",
              "| path | one client, fresh call (s) | 8 clients, result on the server (s) | ratio | group of 8, fresh (ratio) "
              "| group ratio over the rounds (min–max) |",
              "|---|---:|---:|---:|---:|---:|"]
    for b, r in results.items():
        if "served_s" in r:
            lines.append(f"| {b} | {r['one_s']:.4f} | {r['served_s']:.4f} | {r['served_ratio']:.2f}× | "
                         f"{r['group_ratio']:.2f}× | {r['group_ratio_min']:.2f}–{r['group_ratio_max']:.2f}× "
                         f"({r['rounds']} rounds) |")
    figures.update({f"floor.{k}": v for k, v in floor.items()})
    lines += ["", "Remote: the per-request floor (`measure_floor`: one keep-alive connection, one request at a time, "
              "CPU per request from `/proc`). The server's CPU for a `/call` whose image and result it holds, against "
              "a bare uvicorn app reading the same body and answering a small JSON; the client's CPU with this "
              "project's connection (`tool_backends.http_client.Connection`) against the standard library's "
              "`http.client`, both against the bare app:", "",
              "| side | this project (µs) | baseline (µs) | ratio |", "|---|---:|---:|---:|",
              f"| server: `medvqa-tools serve`, a served `/call` vs bare uvicorn | {floor['server_ours_s'] * 1e6:.0f} | "
              f"{floor['server_bare_s'] * 1e6:.0f} | {floor['server_ratio']:.2f}× |",
              f"| client: `Connection` vs `http.client` | {floor['client_connection_s'] * 1e6:.0f} | "
              f"{floor['client_http_client_s'] * 1e6:.0f} | {floor['client_ratio']:.2f}× |"]
    lines += ["", "A group of 8 identical calls runs the tool once in every backend (in-process, its copies share a "
              "worker's toolbox; remote, 8 separate clients' identical calls in flight at once share one "
              "computation on the server, and the router forwards them once); 8 different calls run it 8 times. "
              "Remote rows: 8 concurrent clients (threads, each its own `HTTPToolBackend` with optimistic image "
              "refs, so each first sends the image's digest, gets 409 and uploads it; each holds the image as an env "
              "copy in its own process would, loaded from a file through its own `ImageCache` before the timing) against a real "
              "`medvqa-tools serve` process on loopback (`--max-concurrency 4`, cache on), or the router in "
              "front of it; the one-copy baseline is one such client; each remote row is the median of `--remote-rounds` rounds (3), each with servers started afresh. *classical*: the classical engine (~5 ms a "
              "call, so HTTP and image upload, paid by each of the 8 clients, weigh as much as the tool); *sam*: "
              "the trained SAM (a folder from `python -m tool_backends.finetune segment --steps 2`: the trained "
              "tool's architecture and cost per call; two steps leave its masks noisy, hundreds of components whose run "
              "lengths each client decodes, many times the classical mask's). A group's ratio is one call plus 7 more "
              "requests served, so it sits on the floor table's cost; the last column shows how far a row moves "
              "between rounds on this 2-core VM. The server and the router join identical requests by reference on their event loop, before "
              "their slots (one request takes a slot and a thread); a request carrying the image's bytes (the "
              "upload) runs on its own. On the server, a by-reference call whose result and response it holds is "
              "answered on the event loop (no slot, no thread), and so is the 409 for an image it lacks; every "
              "endpoint passes the same RequestGate (token before the body). Goal (issue 31): a remote group of 8 ≤ 1.5× one call.", ""]
    record("group", "\n".join(lines), figures, "python benchmarks/bench_group.py",
           results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
