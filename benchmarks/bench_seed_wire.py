"""The seed's own wire: ``/get_observation`` zoom, this project's server beside verl-tool's crop.

Seed 000 trains with verl-tool: rollout workers post each turn to a tool server's
``/get_observation``. Every server here gets the same requests on loopback: one 256x256 image (a
VQA-RAD scan, resized) as a PNG data URL in ``extra_fields``, and the turn
``<tool_call>{"name": "image_zoom_in", "arguments": {"bbox_2d": [64, 64, 181, 181]}}</tool_call>``
(each request its own box offset and trajectory id unless a group shares them). Servers:

* **ours, today**: ``medvqa-tools serve --tools image_zoom_in``: the crop enlarged to 336 px, PNG;
* **ours, 168 px JPEG**: the same with ``--tool-opt image_zoom_in.observation_image=
  {"max_side": 168, "format": "jpeg", "quality": 75}``: verl-tool's returned size and format;
* **ours, 168 px JPEG + share**: that server answering ``/get_observation`` through
  :meth:`tool_backends.observation_share.ObservationShare.answer`, as the two proposed ``server.py``
  lines would (this benchmark's server process applies them in an ASGI layer, until ``server.py``
  does; the results' ``server_wired`` says which);
* **verl-tool crop (reproduction)**: verl-tool is not on the package index this machine reaches
  (``pip download --no-deps verl-tool`` finds nothing), so this is *not* its server: a FastAPI app
  written here that reproduces what its crop tool (``verl_tool/servers/tools/pixel_reasoner.py``,
  read, not copied) answers and keeps: the box grown by 10 % of the image a side, cropped at its
  own size (168x168 here), JPEG at PIL's default quality, as a data URL, and every trajectory's
  images and observations kept until a ``finish`` request. Its Ray/asyncio serving machinery is
  not reproduced, so its per-call figures are a floor for verl-tool's own, not its figures;
  ``scripts/setup_verltool.sh`` installs the real one where a checkout is at hand;
* **bare FastAPI floor**: a stateless FastAPI endpoint doing each one's pixel work and nothing else
  (decode the data URL, crop / crop+resize, encode), chosen per request.

Measured, in one run: latency (sequential calls, interleaved across servers; wall per call and the
server's own CPU per call from ``/proc``), throughput with 8 and 32 concurrent clients (distinct
calls), a GRPO group (8 concurrent identical turns on a fresh image against one such turn, over
``--rounds`` rounds) and the server's RSS after ``--turns`` turns without ``finish``.

    python benchmarks/bench_seed_wire.py [--quick] [--turns 10000] [--rounds 5]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import base64
import http.client
import io
import json
import os
import re
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

from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

BOX = (64, 64, 181, 181)
JPEG_168 = {"max_side": 168, "format": "jpeg", "quality": 75}
GROUP = 8
SERVERS = ("ours_today", "ours_168", "ours_168_share", "verltool_repro", "floor")
ROWS = {  # row -> (server process, path); the floor's rows do each server's pixel work
    "ours_today": ("ours_today", "/get_observation"),
    "floor_zoom336png": ("floor", "/get_observation?work=zoom336png"),
    "ours_168": ("ours_168", "/get_observation"),
    "ours_168_share": ("ours_168_share", "/get_observation"),
    "floor_zoom168jpeg": ("floor", "/get_observation?work=zoom168jpeg"),
    "verltool_repro": ("verltool_repro", "/get_observation"),
    "floor_crop168jpeg": ("floor", "/get_observation?work=crop168jpeg"),
}
LABELS = {"ours_today": "ours, today", "ours_168": "ours, `observation_image` 168 px JPEG",
          "ours_168_share": "ours, 168 px JPEG + ObservationShare", "verltool_repro": "verl-tool crop (reproduction)",
          "floor_zoom336png": "floor: today's zoom work", "floor_zoom168jpeg": "floor: the 168 px JPEG zoom work",
          "floor_crop168jpeg": "floor: verl-tool's crop work"}
FLOOR_OF = {"ours_today": "floor_zoom336png", "ours_168": "floor_zoom168jpeg", "ours_168_share": "floor_zoom168jpeg",
            "verltool_repro": "floor_crop168jpeg"}
LOAD_ROWS = ("ours_today", "ours_168", "ours_168_share", "verltool_repro", "floor_zoom168jpeg")
"""Rows measured for throughput and the group (the floor once: its 168 px JPEG zoom work)."""


# ---- the images and requests ---------------------------------------------------------------------
def images(vqa_rad: str | None, n: int):
    """``n`` 256x256 RGB images: VQA-RAD scans when the folder is there, else textured synthetic ones."""
    import numpy as np
    from PIL import Image

    files = sorted((Path(vqa_rad) / "images").glob("*")) if vqa_rad and (Path(vqa_rad) / "images").is_dir() else []
    out = []
    for i in range(n):
        if files:
            scan = Image.open(files[(i * 7) % len(files)]).convert("RGB")
            out.append(scan.resize((256, 256), Image.Resampling.LANCZOS))
        else:
            yy, xx = np.mgrid[:256, :256]
            arr = 128 + 60 * np.sin(xx / (5.0 + i)) * np.cos(yy / 9.0)
            out.append(Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).convert("RGB"))
    return out


def png_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def offsets():
    """Box offsets (dx, dy) that keep every server's crop inside the image and at its size."""
    return [(dx, dy) for dx in range(-30, 31, 2) for dy in range(-30, 31, 2)]


def action(dx: int = 0, dy: int = 0) -> str:
    box = [BOX[0] + dx, BOX[1] + dy, BOX[2] + dx, BOX[3] + dy]
    return '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox_2d": %s}}</tool_call>' % json.dumps(box)


def body(tid: str, turn: str, url: str) -> bytes:
    return json.dumps({"trajectory_ids": [tid], "actions": [turn], "finish": [False],
                       "extra_fields": [{"images": [url]}]}).encode()


# ---- the two benchmark-local servers ---------------------------------------------------------------
def _parse_box(turn: str):
    m = re.search(r"<tool_call>(.*?)</tool_call>", turn, re.S)
    call = json.loads(m.group(1)) if m else {}
    return (call.get("arguments") or {}).get("bbox_2d")


def _decode(url: str):
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    image.load()
    return image.convert("RGB")


def _jpeg_url(image, **options) -> str:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", **options)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def padded_crop(image, box):
    """verl-tool's crop, as its code reads: the box grown by 10 % of the image a side (at most 600 px), clipped."""
    w, h = image.size
    px, py = min(0.1, 600.0 / w), min(0.1, 600.0 / h)
    x0, y0 = max(0.0, box[0] / w - px), max(0.0, box[1] / h - py)
    x1, y1 = min(1.0, box[2] / w + px), min(1.0, box[3] / h + py)
    return image.crop((int(x0 * w), int(y0 * h), int(x1 * w), int(y1 * h)))


def floor_work(work: str, image, box) -> str:
    """The pixel work of each server, bare: decode is done; crop (+ resize) and encode."""
    from PIL import Image

    if work == "crop168jpeg":
        return _jpeg_url(padded_crop(image, box))
    crop = image.crop(tuple(box))
    if work == "zoom168jpeg":
        s = 168 / max(crop.size)
        return _jpeg_url(crop.resize((round(crop.width * s), round(crop.height * s)), Image.Resampling.BICUBIC),
                         quality=75)
    s = 336 / min(crop.size)
    crop = crop.resize((round(crop.width * s), round(crop.height * s)), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    crop.save(buf, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def verltool_repro_app():
    """The reproduction of verl-tool's crop *response* and retention (see the module docstring)."""
    from fastapi import Body, FastAPI

    app, envs = FastAPI(), {}

    @app.post("/get_observation")
    def get_observation(payload: dict = Body(...)):
        obs, dones, valids = [], [], []
        for tid, turn, finish, extra in zip(payload["trajectory_ids"], payload["actions"],
                                            payload.get("finish") or [False] * len(payload["actions"]),
                                            payload.get("extra_fields") or [{}] * len(payload["actions"])):
            if finish:
                envs.pop(tid, None)
                obs.append(""), dones.append(True), valids.append(False)
                continue
            env = envs.setdefault(tid, {"images": None, "previous_obs": []})
            if env["images"] is None:
                env["images"] = [_decode(u) for u in extra.get("images", [])]
            url = _jpeg_url(padded_crop(env["images"][0], _parse_box(turn)))
            o = {"obs": "Here is the cropped image.\n<image>", "image": url}
            env["images"].append(url)
            env["previous_obs"].append({"action": turn, "observation": o, "extra_field": extra})
            obs.append(o), dones.append(False), valids.append(True)
        return {"observations": obs, "dones": dones, "valids": valids}

    @app.get("/health")
    def health():
        return {"status": "ok", "trajectories": len(envs)}

    return app


def floor_app():
    from fastapi import Body, FastAPI

    app = FastAPI()

    @app.post("/get_observation")
    def get_observation(work: str, payload: dict = Body(...)):
        image = _decode(payload["extra_fields"][0]["images"][0])
        url = floor_work(work, image, _parse_box(payload["actions"][0]))
        return {"observations": [{"obs": "", "image": [url]}], "dones": [False], "valids": [True]}

    @app.get("/health")
    def health():
        return {"status": "ok"}

    return app


def serve_shared(port: int, serve_args: list[str]) -> None:
    """``medvqa-tools serve`` answering ``/get_observation`` as the two proposed ``server.py`` lines
    would: ``ObservationShare.answer`` on the event loop, ``batch`` under a gate of the server's
    ``--max-concurrency`` in a worker thread, the response serialised as FastAPI serialises the
    handler's dict. Applied here (an ASGI layer in front of the app) until ``server.py`` does it."""
    import asyncio

    import tool_backends.server as server
    from tool_backends.cli import main as cli_main
    from tool_backends.observation_share import ObservationShare
    from tool_backends.trajectories import TrajectoryObserver

    if server_wires_share():  # server.py answers /get_observation through the share itself
        sys.exit(cli_main(["serve", *serve_args, "--port", str(port)]))
    original = server.create_app

    def create_app(backends, settings=None, proxy=None):
        app = original(backends, settings, proxy)
        service = app.state.service
        s = service.settings
        shared = ObservationShare(TrajectoryObserver(service, done_if_invalid=s.done_if_invalid,
                                                     max_action_chars=s.max_action_chars))
        app.add_middleware(_SharedObservations, shared=shared, service=service,
                           gate=asyncio.Semaphore(s.max_concurrency))
        return app

    server.create_app = create_app
    sys.exit(cli_main(["serve", *serve_args, "--port", str(port)]))


def server_wires_share() -> bool:
    """Whether ``tool_backends/server.py`` uses :class:`ObservationShare` itself."""
    return "ObservationShare" in (ROOT / "tool_backends" / "server.py").read_text()


class _SharedObservations:
    """The preview's ASGI layer for ``POST /get_observation`` (see :func:`serve_shared`)."""

    def __init__(self, app, shared, service, gate) -> None:
        self.app, self.shared, self.service, self.gate = app, shared, service, gate

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/get_observation" or scope["method"] != "POST":
            if scope["type"] == "http" and scope["path"] == "/health":
                return await self._json(send, {"status": "ok", "observations_shared": self.shared.shared,
                                               "answered_on_loop": self.shared.answered_on_loop})
            return await self.app(scope, receive, send)
        from fastapi.encoders import jsonable_encoder
        from starlette.concurrency import run_in_threadpool

        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        payload = json.loads(b"".join(chunks))
        n = len(payload["actions"])

        async def slot(*args):
            async with self.gate:
                return await run_in_threadpool(self.shared.batch, *args)

        out = await self.shared.answer(payload.get("trajectory_ids") or list(range(n)), payload["actions"],
                                       payload.get("finish") or [False] * n, payload.get("extra_fields") or [{}] * n,
                                       self.service.budget, slot)
        await self._json(send, jsonable_encoder(out))

    @staticmethod
    async def _json(send, content) -> None:
        body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


# ---- running and measuring servers -------------------------------------------------------------------
class Proc:
    def __init__(self, name: str, args: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        self.name = name
        self.proc = subprocess.Popen([sys.executable, *args, "--port", str(self.port)], cwd=ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait(self) -> "Proc":
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start")

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


def start(name: str) -> Proc:
    me = str(Path(__file__).resolve())
    serve = ["-m", "tool_backends.cli", "serve", "--tools", "image_zoom_in"]
    opt = ["--tool-opt", f"image_zoom_in.observation_image={json.dumps(JPEG_168)}"]
    args = {"ours_today": serve, "ours_168": serve + opt,
            "ours_168_share": [me, "--serve", "ours-shared", "--serve-args", json.dumps(serve[3:] + opt)],
            "verltool_repro": [me, "--serve", "verltool-repro"], "floor": [me, "--serve", "floor"]}[name]
    return Proc(name, args)


class Client:
    """One keep-alive connection with ``TCP_NODELAY``, as urllib3 (``requests``) and aiohttp open
    theirs (``http.client`` alone leaves Nagle on, and a body sent after its headers then waits on
    the server's delayed ACK); ``post`` returns the response body (and checks it is a 200)."""

    reconnects = 0
    """Kept connections a server had closed (idle past its keep-alive), opened again and resent."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._connect()

    def _connect(self) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, path: str, data: bytes) -> bytes:
        try:
            self.conn.request("POST", path, data, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # a kept connection the server closed: open another and send again, as a pooled client does
            Client.reconnects += 1
            self.conn.close()
            self._connect()
            self.conn.request("POST", path, data, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
        out = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{path}: {resp.status} {out[:300]!r}")
        return out


def returned(raw: bytes) -> dict:
    """What a response's observation image is: size, format, bytes."""
    from PIL import Image

    o = json.loads(raw)["observations"][0]
    url = o["image"][0] if isinstance(o["image"], list) else o["image"]
    data = base64.b64decode(url.split(",", 1)[1])
    im = Image.open(io.BytesIO(data))
    return {"size": f"{im.width}x{im.height}", "format": im.format, "bytes": len(data)}


def latency(procs, url, n):
    """Sequential distinct calls, interleaved across rows: wall and server CPU per call."""
    clients = {name: Client(proc.port) for name, proc in procs.items()}
    walls, cpus, shapes = {r: [] for r in ROWS}, {r: [] for r in ROWS}, {}
    for i, (dx, dy) in enumerate(offsets()[: n + 1]):
        for row, (name, path) in ROWS.items():
            proc, data = procs[name], body(f"lat-{row}-{i}", action(dx, dy), url)
            c0, t0 = proc.cpu_s(), time.perf_counter()
            raw = clients[name].post(path, data)
            walls[row].append(time.perf_counter() - t0)
            cpus[row].append(proc.cpu_s() - c0)
            if i == 0:  # a warm-up call, and what each returns
                shapes[row] = returned(raw)
    return {r: {"latency_ms": statistics.median(walls[r][1:]) * 1e3,
                "latency_p10_ms": sorted(walls[r][1:])[len(walls[r][1:]) // 10] * 1e3,
                "cpu_ms": sum(cpus[r][1:]) / n * 1e3, **shapes[r]} for r in ROWS}


def throughput(proc, path, url, clients: int, per_client: int, offset_base: int) -> float:
    """Calls per second with ``clients`` concurrent connections, every call distinct."""
    boxes = offsets()
    bodies = [[body(f"tp{clients}-{c}-{k}", action(*boxes[(offset_base + c * per_client + k) % len(boxes)]), url)
               for k in range(per_client)] for c in range(clients)]
    barrier, errors = threading.Barrier(clients + 1), []

    def run(c):
        client = Client(proc.port)
        barrier.wait()
        try:
            for data in bodies[c]:
                client.post(path, data)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return clients * per_client / (time.perf_counter() - t0)


def group(proc, path, url, tag: str) -> tuple[float, float]:
    """(one turn s, 8 concurrent identical turns s) on the image ``url`` (fresh for this round)."""
    one = body(f"{tag}-one", action(), url)
    t0 = time.perf_counter()
    Client(proc.port).post(path, one)
    one_s = time.perf_counter() - t0
    clients = [Client(proc.port) for _ in range(GROUP)]
    bodies = [body(f"{tag}-g{i}", action(), url) for i in range(GROUP)]
    barrier = threading.Barrier(GROUP + 1)

    def run(i):
        barrier.wait()
        clients[i].post(path, bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(GROUP)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return one_s, time.perf_counter() - t0


def memory(proc, pictures, turns: int) -> dict:
    """RSS after ``turns`` distinct turns without ``finish`` (and at a quarter, half, three quarters)."""
    client, boxes = Client(proc.port), offsets()
    urls = [png_url(im) for im in pictures]
    marks = {turns // 4: "q1", turns // 2: "half", 3 * turns // 4: "q3", turns: "end"}
    out = {"start_mb": proc.rss_mb()}
    for i in range(1, turns + 1):
        url = urls[(i // len(boxes)) % len(urls)]
        client.post("/get_observation", body(f"mem-{i}", action(*boxes[i % len(boxes)]), url))
        if i in marks:
            out[f"{marks[i]}_mb"] = proc.rss_mb()
    out["growth_half_to_end_mb"] = out["end_mb"] - out["half_mb"]
    return out


# ---- the run -------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", default=None, help="(internal) run one benchmark-local server: ours-shared, "
                                                 "verltool-repro or floor")
    p.add_argument("--serve-args", default="[]", help="(internal) JSON list of medvqa-tools serve arguments")
    p.add_argument("--port", type=int, default=0, help="(internal) the port of --serve")
    p.add_argument("--calls", type=int, default=200, help="sequential calls per row for the latency")
    p.add_argument("--per-client", type=int, default=0, help="calls per client for throughput (default: 256 in all)")
    p.add_argument("--rounds", type=int, default=9, help="group rounds (each on a fresh image)")
    p.add_argument("--turns", type=int, default=2400, help="turns without finish for the memory check (10000: full)")
    p.add_argument("--repro-turns", type=int, default=2400,
                   help="at most this many for the verl-tool reproduction (it grows by each turn's images)")
    p.add_argument("--vqa-rad", default=str(ROOT.parent / "shared" / "data" / "vqa_rad"))
    p.add_argument("--quick", action="store_true", help="a smoke run: few calls, nothing recorded")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = p.parse_args(argv)
    if args.serve:
        if args.serve == "ours-shared":
            return serve_shared(args.port, json.loads(args.serve_args))
        import uvicorn

        app = verltool_repro_app() if args.serve == "verltool-repro" else floor_app()
        return uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    if args.quick:
        args.calls, args.rounds, args.turns, args.repro_turns = 10, 2, 200, 200
    pictures = images(args.vqa_rad, 4 + args.rounds + 4)
    procs = {name: start(name) for name in SERVERS}
    results: dict[str, dict] = {row: {} for row in ROWS}
    try:
        for proc in procs.values():
            proc.wait()
        for row, r in latency(procs, png_url(pictures[0]), args.calls).items():
            results[row].update(r)
        for k, clients in enumerate((8, 32)):
            per = 2 if args.quick else (args.per_client or max(2, 256 // clients))
            url = png_url(pictures[1 + k])
            for i, row in enumerate(LOAD_ROWS):
                name, path = ROWS[row]
                results[row][f"throughput_{clients}"] = throughput(procs[name], path, url, clients, per, 97 * i)
        ratios = {row: [] for row in LOAD_ROWS}
        for r in range(args.rounds):
            url = png_url(pictures[4 + r])
            for row in LOAD_ROWS:
                name, path = ROWS[row]
                one_s, group_s = group(procs[name], path, url, f"round{r}-{row}")
                ratios[row].append((group_s / one_s, one_s, group_s))
        for row, rows in ratios.items():
            rows.sort()
            mid = rows[len(rows) // 2]
            results[row].update(group_ratio=mid[0], group_one_ms=mid[1] * 1e3, group_8_ms=mid[2] * 1e3,
                                group_ratio_min=rows[0][0], group_ratio_max=rows[-1][0])
        for name in ("ours_today", "ours_168", "ours_168_share", "verltool_repro"):
            turns = min(args.turns, args.repro_turns) if name == "verltool_repro" else args.turns
            results[name].update({f"memory_{k}": v for k, v in memory(procs[name], pictures[-4:], turns).items()},
                                 memory_turns=turns)
        health = json.loads(_get(procs["ours_168_share"].port, "/health"))
        results["ours_168_share"].update(server_wired=server_wires_share(),
                                         answered_on_loop=health.get("answered_on_loop"),
                                         observations_shared=health.get("observations_shared"))
    finally:
        for proc in procs.values():
            proc.close()
    report(results, args)


def _get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    return conn.getresponse().read()


def report(results: dict, args) -> None:
    lines = ["## The seed's wire: `/get_observation` zoom, this project's server beside verl-tool's crop "
             "(`benchmarks/bench_seed_wire.py`)", "",
             f"One 256x256 VQA-RAD image as a PNG data URL, one `image_zoom_in` turn per request. Latency: median of "
             f"{args.calls} sequential distinct calls, interleaved across rows; CPU: the server process's own "
             "(`/proc`) per call, and over the bare FastAPI floor doing the same pixel work (decode, crop, resize, "
             f"encode; nothing else); throughput: distinct calls; group: {GROUP} concurrent identical turns on a "
             f"fresh image against one such turn, median (min–max) of {args.rounds} rounds; memory: the server's RSS "
             "at half and at all of the turns shown, none finished.", "",
             "| row | returns | latency, median (p10) (ms) | server CPU (ms/call) | CPU over its floor | calls/s, 8 clients "
             "| calls/s, 32 clients | group of 8 (× one turn) | RSS half → end (MB) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    figures = {}
    for row in ROWS:
        r = results[row]
        floor = results.get(FLOOR_OF.get(row, row))
        mem = (f"{r['memory_half_mb']:.0f} → {r['memory_end_mb']:.0f} ({r['memory_turns']} turns)"
               if "memory_end_mb" in r else "—")
        over = f"{r['cpu_ms'] - floor['cpu_ms']:+.2f}" if row in FLOOR_OF else "—"
        if row in FLOOR_OF:
            r["cpu_over_floor_ms"] = r["cpu_ms"] - floor["cpu_ms"]
        load = (f"{r['throughput_8']:.0f} | {r['throughput_32']:.0f} | {r['group_ratio']:.2f}× "
                f"({r['group_ratio_min']:.2f}–{r['group_ratio_max']:.2f})") if row in LOAD_ROWS else "— | — | —"
        lines.append(f"| {LABELS[row]} | {r['size']} {r['format']}, {r['bytes'] / 1024:.1f} kB | {r['latency_ms']:.2f} "
                     f"({r['latency_p10_ms']:.2f}) "
                     f"| {r['cpu_ms']:.2f} | {over} | {load} | {mem} |")
        figures.update({f"{row}.{k}": v for k, v in r.items()})
    ours, share, verl = results["ours_168"], results["ours_168_share"], results["verltool_repro"]
    goals = [
        ("per-call latency, ours 168 px JPEG / the verl-tool reproduction", ours["latency_ms"] / verl["latency_ms"],
         "≤ 1.00×"),
        ("the same, p10 of the calls", ours["latency_p10_ms"] / verl["latency_p10_ms"], "≤ 1.00×"),
        ("server CPU per call, the same", ours["cpu_ms"] / max(verl["cpu_ms"], 1e-9), "≤ 1.00×"),
        ("per-call latency, ours + ObservationShare / the reproduction", share["latency_ms"] / verl["latency_ms"],
         "≤ 1.00×"),
        ("throughput at 8 clients, ours 168 px JPEG / the reproduction", ours["throughput_8"] / verl["throughput_8"],
         "≥ 1.00×"),
        ("throughput at 32 clients, the same", ours["throughput_32"] / verl["throughput_32"], "≥ 1.00×"),
        ("a group of 8 identical turns, ours + ObservationShare", share["group_ratio"], "≤ 1.50×"),
        ("a group of 8 identical turns, ours without it", ours["group_ratio"], "≤ 1.50×"),
    ]
    figures.update(latency_vs_repro=goals[0][1], latency_p10_vs_repro=goals[1][1], cpu_vs_repro=goals[2][1],
                   latency_share_vs_repro=goals[3][1], throughput_8_vs_repro=goals[4][1],
                   throughput_32_vs_repro=goals[5][1], group_share=goals[6][1], group_no_share=goals[7][1])
    lines += ["", "| goal (issue 47) | measured | goal |", "|---|---:|---|"]
    lines += [f"| {what} | {v:.2f}× | {goal} |" for what, v, goal in goals]
    for row in ("ours_168", "ours_168_share", "verltool_repro"):
        r = results[row]
        lines.append(f"| RSS growth from {r['memory_turns'] // 2} to {r['memory_turns']} turns without `finish`, "
                     f"{LABELS[row]} | {r['memory_growth_half_to_end_mb']:+.1f} MB | "
                     f"{'flat' if row != 'verltool_repro' else '—'} |")
    wired = share.get("server_wired")
    lines += ["", "*ours + ObservationShare*: " + (
        "`server.py` wires the share itself." if wired else
        "`server.py` does not wire the share yet; this benchmark's server process answers `/get_observation` "
        "as the two proposed lines would (`ObservationShare.answer` on the event loop, `batch` under a "
        "`--max-concurrency` gate in a worker thread; `tool_backends/observation_share.py`).") +
        " *verl-tool crop (reproduction)*: not verl-tool's server (not installable here): a FastAPI app written for "
        "this benchmark that returns what its crop tool returns (the box grown by 10 % a side, cropped at its own "
        "size, JPEG at PIL's default quality) and keeps every trajectory's images and observations until "
        "`finish`, as its code does; verl-tool's own serving (Ray, asyncio) is not reproduced. "
        "The same request text goes to every server (our zoom enlarges the 117 px box to 168 px; the "
        "reproduction pads it to 168 px and crops). Our server keeps at most 1,024 live trajectories "
        "(`TrajectoryObserver`, LRU), so its RSS stops growing past them. Wall times on this shared 2-core VM move "
        "with its load (recorded with the results); the server-CPU column moves less. "
        f"Kept connections a server had closed and the client opened again: {Client.reconnects}.", ""]
    figures["server_wired"] = bool(wired)
    figures["client_reconnects"] = Client.reconnects
    record("seed_wire", "\n".join(lines), figures, command_line("bench_seed_wire.py"),
           results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
