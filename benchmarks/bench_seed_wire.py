"""The seed's own wire: ``/get_observation`` crop, this project's server beside verl-tool's own.

Seed 000 trains with verl-tool: rollout workers post each turn to a tool server's
``/get_observation``. Every server here gets the *same* request bytes on loopback: one 256x256
image (a VQA-RAD scan, resized) as a JPEG data URL in ``extra_fields`` (verl-tool's decoder reads
JPEG data URLs only), and verl-tool's own crop turn
``<tool_call>{"name": "crop_image", "arguments": {"bbox_2d": [64, 64, 181, 181], "target_image": 1}}</tool_call>``
(each request its own box offset and trajectory id unless a group shares them). Servers:

* **ours, today**: ``medvqa-tools serve --tools image_zoom_in`` with the zoom named ``crop_image``
  (``--tool-opt image_zoom_in.name=crop_image``; ``target_image`` counts from 1 as verl-tool's does):
  the crop enlarged to 336 px, PNG;
* **ours, 168 px JPEG**: the same with ``--tool-opt image_zoom_in.observation_image=
  {"max_side": 168, "format": "jpeg", "quality": 75}``: verl-tool's returned size and format;
* **verl-tool tool_server** and **verl-tool serve**: verl-tool's own servers, unmodified, from a
  checkout in their own venv (``VERLTOOL_SRC=... scripts/setup_verltool.sh``): its single-process
  ``verl_tool.servers.tool_server`` and the ``verl_tool.servers.serve`` its README starts (a router
  process in front of worker processes), ``--tool_type pixel_reasoner``, their other settings at
  their defaults. Its crop grows the box by 10 % of the image a side and crops at that size (168x168
  here), JPEG at PIL's default quality; it keeps every trajectory's images until a ``finish`` request.
  Run in a scratch folder (its crop tool makes a folder per trajectory under ``tmp/``);
* **verl-tool crop (reproduction)**, only where that venv is missing: a FastAPI app written here
  that answers and keeps what verl-tool's crop does (``verl_tool/servers/tools/pixel_reasoner.py``,
  read, not copied), without its serving machinery: a floor for verl-tool's own figures;
* **bare FastAPI floor**: a stateless FastAPI endpoint doing each one's pixel work and nothing else
  (decode the data URL, crop / crop+resize, encode), chosen per request.

Measured, in one run: latency (sequential calls, interleaved across servers; wall per call and the
CPU per call of the server's processes, all of them, from ``/proc``), throughput with 8 and 32
concurrent clients (distinct calls), a GRPO group (8 concurrent identical turns on a fresh image
against one such turn, over ``--rounds`` rounds) and the servers' RSS after ``--turns`` turns
without ``finish``.

    VERLTOOL_SRC=/path/to/verl-tool scripts/setup_verltool.sh     # once: verl-tool's servers
    python benchmarks/bench_seed_wire.py [--quick] [--turns 10000] [--rounds 9]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import base64
import http.client
import io
import json
import os
import re
import shutil
import socket
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

from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

BOX = (64, 64, 181, 181)
JPEG_168 = {"max_side": 168, "format": "jpeg", "quality": 75}
GROUP = 8
VERLTOOL_PY = ROOT / ".venv-verltool" / "bin" / "python"
VERL_CROP = {"format": "jpeg", "quality": 75}
LABELS = {"ours_today": "ours, today", "ours_168": "ours, `observation_image` 168 px JPEG",
          "ours_verl_crop": "ours, `crop_style=verl_tool`, JPEG",
          "verltool_tool_server": "verl-tool `tool_server`", "verltool_serve": "verl-tool `serve` (router + workers)",
          "verltool_repro": "verl-tool crop (reproduction)",
          "floor_zoom336png": "floor: today's zoom work", "floor_zoom168jpeg": "floor: the 168 px JPEG zoom work",
          "floor_crop168jpeg": "floor: verl-tool's crop work"}
FLOOR_OF = {"ours_today": "floor_zoom336png", "ours_168": "floor_zoom168jpeg", "ours_verl_crop": "floor_crop168jpeg",
            "verltool_tool_server": "floor_crop168jpeg",
            "verltool_serve": "floor_crop168jpeg", "verltool_repro": "floor_crop168jpeg"}


def verltool_rows(real: bool) -> tuple[str, ...]:
    """verl-tool's rows: its two servers when its venv is there, else the reproduction."""
    return ("verltool_tool_server", "verltool_serve") if real else ("verltool_repro",)


def rows_of(real: bool) -> dict[str, tuple[str, str]]:
    """row -> (server process, path); the floor's rows do each server's pixel work."""
    rows = {"ours_today": ("ours_today", "/get_observation"),
            "floor_zoom336png": ("floor", "/get_observation?work=zoom336png"),
            "ours_168": ("ours_168", "/get_observation"),
            "floor_zoom168jpeg": ("floor", "/get_observation?work=zoom168jpeg"),
            "ours_verl_crop": ("ours_verl_crop", "/get_observation")}
    rows.update({row: (row, "/get_observation") for row in verltool_rows(real)})
    rows["floor_crop168jpeg"] = ("floor", "/get_observation?work=crop168jpeg")
    return rows


def load_rows(real: bool) -> tuple[str, ...]:
    """Rows measured for throughput, the group and memory (the floor once: its 168 px JPEG zoom work)."""
    return ("ours_today", "ours_168", "ours_verl_crop", *verltool_rows(real))


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


def upload_url(image) -> str:
    """The scan as every server receives it: a JPEG data URL (quality 95), the one kind of data URL
    verl-tool's crop decodes (it strips only a ``data:image/jpeg;base64,`` prefix)."""
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=95)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def offsets():
    """Box offsets (dx, dy) that keep every server's crop inside the image and at its size."""
    return [(dx, dy) for dx in range(-30, 31, 2) for dy in range(-30, 31, 2)]


def action(dx: int = 0, dy: int = 0) -> str:
    """verl-tool's crop turn (``target_image`` 1: the trajectory's first image)."""
    box = [BOX[0] + dx, BOX[1] + dy, BOX[2] + dx, BOX[3] + dy]
    return ('<tool_call>{"name": "crop_image", "arguments": {"bbox_2d": %s, "target_image": 1}}</tool_call>'
            % json.dumps(box))


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


# ---- running and measuring servers -------------------------------------------------------------------
class Proc:
    """One server under test: its process (and any it starts: verl-tool's ``serve`` runs a router in
    front of worker processes), CPU and RSS summed over all of them."""

    def __init__(self, name: str, args: list[str], python: str = sys.executable, cwd: Path = ROOT,
                 env: dict | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.name = name
        self.proc = subprocess.Popen([python, *args, "--port", str(self.port)], cwd=cwd,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    def wait(self) -> "Proc":
        for _ in range(1800):
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

    def pids(self) -> list[int]:
        """This server's process and its descendants (as ``/proc`` lists them now)."""
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*/children"):
                try:
                    todo += [int(c) for c in task.read_text().split()]
                except OSError:
                    pass
        return out

    def cpu_s(self) -> float:
        total = 0.0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def rss_mb(self) -> float:
        total = 0.0
        for pid in self.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0.0)
        return total

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, 15)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self.proc.stderr.close()


def start(name: str, scratch: Path) -> Proc:
    """Start server ``name``; verl-tool's in its own venv, in ``scratch`` (it writes a folder per trajectory)."""
    me = str(Path(__file__).resolve())
    serve = ["-m", "tool_backends.cli", "serve", "--tools", "image_zoom_in", "--tool-opt", "image_zoom_in.name=crop_image"]
    ours_env = {"PYTHONPATH": str(ROOT)}
    if name == "ours_today":
        return Proc(name, serve, env=ours_env)
    if name == "ours_168":
        return Proc(name, serve + ["--tool-opt", f"image_zoom_in.observation_image={json.dumps(JPEG_168)}"], env=ours_env)
    if name == "ours_verl_crop":
        return Proc(name, serve + ["--tool-opt", "image_zoom_in.crop_style=verl_tool",
                                   "--tool-opt", f"image_zoom_in.observation_image={json.dumps(VERL_CROP)}"], env=ours_env)
    if name in ("verltool_tool_server", "verltool_serve"):
        module = "verl_tool.servers.tool_server" if name == "verltool_tool_server" else "verl_tool.servers.serve"
        folder = scratch / name
        folder.mkdir(parents=True, exist_ok=True)
        return Proc(name, ["-m", module, "--host", "127.0.0.1", "--tool_type", "pixel_reasoner", "--log_level", "warning"],
                    python=str(VERLTOOL_PY), cwd=folder, env={"PYTHONPATH": ""})
    return Proc(name, [me, "--serve", "verltool-repro" if name == "verltool_repro" else "floor"], env=ours_env)


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
    return {"size": f"{im.width}x{im.height}", "format": im.format, "bytes": len(data), "pixels": im.convert("RGB")}


def latency(procs, rows, url, n):
    """Sequential distinct calls, interleaved across rows: wall and server CPU per call."""
    clients = {name: Client(proc.port) for name, proc in procs.items()}
    walls, cpus, shapes = {r: [] for r in rows}, {r: [] for r in rows}, {}
    for i, (dx, dy) in enumerate(offsets()[: n + 1]):
        for row, (name, path) in rows.items():
            proc, data = procs[name], body(f"lat-{row}-{i}", action(dx, dy), url)
            c0, t0 = proc.cpu_s(), time.perf_counter()
            raw = clients[name].post(path, data)
            walls[row].append(time.perf_counter() - t0)
            cpus[row].append(proc.cpu_s() - c0)
            if i == 0:  # a warm-up call, and what each returns
                shapes[row] = returned(raw)
    return {r: {"latency_ms": statistics.median(walls[r][1:]) * 1e3,
                "latency_p10_ms": sorted(walls[r][1:])[len(walls[r][1:]) // 10] * 1e3,
                "cpu_ms": sum(cpus[r][1:]) / n * 1e3, **shapes[r]} for r in rows}


def throughput(proc, path, url, clients: int, per_client: int, offset_base: int, tag: str = "") -> float:
    """Calls per second with ``clients`` concurrent connections, every call distinct: its own box and
    its own trajectory (``tag`` keeps a burst's trajectories apart from another's: a trajectory
    already seen keeps the image it started with, whatever a later request's ``extra_fields`` say)."""
    boxes = offsets()
    bodies = [[body(f"tp{tag}-{clients}-{c}-{k}", action(*boxes[(offset_base + c * per_client + k) % len(boxes)]), url)
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
    urls = [upload_url(im) for im in pictures]
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
    p.add_argument("--serve", default=None, help="(internal) run one benchmark-local server: verltool-repro or floor")
    p.add_argument("--port", type=int, default=0, help="(internal) the port of --serve")
    p.add_argument("--calls", type=int, default=200, help="sequential calls per row for the latency")
    p.add_argument("--per-client", type=int, default=0, help="calls per client for throughput (default: 256 in all)")
    p.add_argument("--bursts", type=int, default=5, help="throughput bursts per row and level (median kept)")
    p.add_argument("--rounds", type=int, default=9, help="group rounds (each on a fresh image)")
    p.add_argument("--turns", type=int, default=2400, help="turns without finish for the memory check (10000: full)")
    p.add_argument("--vqa-rad", default=str(ROOT.parent / "shared" / "data" / "vqa_rad"))
    p.add_argument("--reproduction", action="store_true",
                   help="measure the verl-tool reproduction instead of verl-tool's own servers (without .venv-verltool "
                        "the benchmark exits 1 unless given)")
    p.add_argument("--quick", action="store_true", help="a smoke run: few calls, nothing recorded")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = p.parse_args(argv)
    if args.serve:
        import uvicorn

        app = verltool_repro_app() if args.serve == "verltool-repro" else floor_app()
        return uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    if args.quick:
        args.calls, args.rounds, args.turns, args.bursts = 10, 2, 200, 1
    real = VERLTOOL_PY.is_file() and not args.reproduction
    if not real and not (args.reproduction or args.quick):  # the recorded figures compare with verl-tool's own
        print(f"bench_seed_wire: {VERLTOOL_PY} is missing (VERLTOOL_SRC=/path/to/verl-tool scripts/setup_verltool.sh "
              "makes it); the previous results are kept. --reproduction measures the reproduction row instead.",
              file=sys.stderr)
        return 1
    if not real:
        print("bench_seed_wire: verl-tool's rows are the reproduction's", file=sys.stderr)
    rows, loaded = rows_of(real), load_rows(real)
    # one image for the latency, a fresh one per throughput burst and per group round, four for memory:
    # no call is answered from a server's cache (ours keeps results by image and box)
    pictures = images(args.vqa_rad, 1 + 2 * args.bursts + args.rounds + 4)
    fresh = iter(pictures[1:-4])
    scratch = Path(tempfile.mkdtemp(prefix="seed_wire-"))
    procs = {}
    results: dict[str, dict] = {row: {} for row in rows}
    try:
        for name in dict.fromkeys(name for name, _ in rows.values()):
            procs[name] = start(name, scratch)
        for proc in procs.values():
            proc.wait()
        for row, r in latency(procs, rows, upload_url(pictures[0]), args.calls).items():
            results[row].update(r)
        import numpy as np  # the first call's returned pixels: does our verl-tool-style crop show what verl-tool's does?

        pixels = {row: np.asarray(results[row].pop("pixels"), dtype=np.int16) for row in rows}
        for vrow in verltool_rows(real):
            a, b = pixels["ours_verl_crop"], pixels[vrow]
            results["ours_verl_crop"][f"max_pixel_diff_vs_{vrow.removeprefix('verltool_')}"] = (
                int(np.abs(a - b).max()) if a.shape == b.shape else -1)
        for k, clients in enumerate((8, 32)):
            per = 2 if args.quick else (args.per_client or max(2, 256 // clients))
            bursts: dict[str, list[float]] = {}
            for burst in range(args.bursts):  # rows interleaved, so a slow spell of the VM hits them all
                url = upload_url(next(fresh))
                for i, row in enumerate((*loaded, "floor_zoom168jpeg")):
                    name, path = rows[row]
                    bursts.setdefault(row, []).append(throughput(procs[name], path, url, clients, per, 97 * i, f"b{burst}"))
            for row, rates in bursts.items():
                results[row].update({f"throughput_{clients}": statistics.median(rates),
                                     f"throughput_{clients}_min": min(rates), f"throughput_{clients}_max": max(rates)})
        ratios = {row: [] for row in loaded}
        for r in range(args.rounds):
            url = upload_url(next(fresh))
            for row in loaded:
                name, path = rows[row]
                one_s, group_s = group(procs[name], path, url, f"round{r}-{row}")
                ratios[row].append((group_s / one_s, one_s, group_s))
        for row, runs in ratios.items():
            runs.sort()
            mid = runs[len(runs) // 2]
            results[row].update(group_ratio=mid[0], group_one_ms=mid[1] * 1e3, group_8_ms=mid[2] * 1e3,
                                group_ratio_min=runs[0][0], group_ratio_max=runs[-1][0])
        for name in loaded:
            results[name].update({f"memory_{k}": v for k, v in memory(procs[name], pictures[-4:], args.turns).items()},
                                 memory_turns=args.turns)
        health = json.loads(_get(procs["ours_168"].port, "/health"))
        results["ours_168"].update(observations_shared=health.get("observations_shared"),
                                   threads=(health.get("threads") or {}).get("threads"))
    finally:
        for proc in procs.values():
            proc.close()
        shutil.rmtree(scratch, ignore_errors=True)
    report(results, rows, real, args)


def _get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    return conn.getresponse().read()


def report(results: dict, rows: dict, real: bool, args) -> None:
    verl_rows = verltool_rows(real)
    lines = ["## The seed's wire: `/get_observation` crop, this project's server beside verl-tool's "
             "(`benchmarks/bench_seed_wire.py`)", "",
             "One 256x256 VQA-RAD image as a JPEG data URL (quality 95), one verl-tool `crop_image` turn per request, "
             f"the same bytes to every server. Latency: median of {args.calls} sequential distinct calls, interleaved "
             "across rows; CPU: the server's processes' own (`/proc`, a server's child processes included) per call, "
             "and over the bare FastAPI floor doing the same pixel work (decode, crop, resize, encode; nothing else); "
             f"throughput: distinct calls, median of {args.bursts} bursts (rows interleaved); group: {GROUP} concurrent identical turns on a fresh image against one such "
             f"turn, median (min–max) of {args.rounds} rounds; memory: the server's RSS at half and at all of the "
             "turns shown, none finished.", "",
             "| row | returns | latency, median (p10) (ms) | server CPU (ms/call) | CPU over its floor | calls/s, 8 clients "
             "| calls/s, 32 clients | group of 8 (× one turn) | RSS half → end (MB) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    figures: dict = {}
    for row in rows:
        r = results[row]
        floor = results.get(FLOOR_OF.get(row, row))
        mem = (f"{r['memory_half_mb']:.0f} → {r['memory_end_mb']:.0f} ({r['memory_turns']} turns)"
               if "memory_end_mb" in r else "—")
        over = f"{r['cpu_ms'] - floor['cpu_ms']:+.2f}" if row in FLOOR_OF else "—"
        if row in FLOOR_OF:
            r["cpu_over_floor_ms"] = r["cpu_ms"] - floor["cpu_ms"]
        load = (f"{r['throughput_8']:.0f} | {r['throughput_32']:.0f} | {r['group_ratio']:.2f}× "
                f"({r['group_ratio_min']:.2f}–{r['group_ratio_max']:.2f})") if "group_ratio" in r else (
            f"{r['throughput_8']:.0f} | {r['throughput_32']:.0f} | —" if "throughput_8" in r else "— | — | —")
        lines.append(f"| {LABELS[row]} | {r['size']} {r['format']}, {r['bytes'] / 1024:.1f} kB | {r['latency_ms']:.2f} "
                     f"({r['latency_p10_ms']:.2f}) | {r['cpu_ms']:.2f} | {over} | {load} | {mem} |")
        figures.update({f"{row}.{k}": v for k, v in r.items()})
    ours, same = results["ours_168"], results["ours_verl_crop"]
    goals = []
    for mine, label, prefix in ((same, "ours, verl-tool's crop", ""), (ours, "ours, 168 px zoom", "zoom168_")):
        for vrow in verl_rows:
            verl, name = results[vrow], LABELS[vrow]
            tag = prefix + vrow.removeprefix("verltool_")
            goals += [
                (f"per-call latency, {label} / {name}", f"latency_vs_{tag}", mine["latency_ms"] / verl["latency_ms"], "≤ 1.00×"),
                ("the same, p10 of the calls", f"latency_p10_vs_{tag}", mine["latency_p10_ms"] / verl["latency_p10_ms"],
                 "≤ 1.00×"),
                ("server CPU per call, the same", f"cpu_vs_{tag}", mine["cpu_ms"] / max(verl["cpu_ms"], 1e-9), "≤ 1.00×"),
                ("throughput at 8 clients, the same", f"throughput_8_vs_{tag}", mine["throughput_8"] / verl["throughput_8"],
                 "≥ 1.00×"),
                ("throughput at 32 clients, the same", f"throughput_32_vs_{tag}",
                 mine["throughput_32"] / verl["throughput_32"], "≥ 1.00×"),
            ]
    goals.append(("a group of 8 identical turns, ours, verl-tool's crop", "group_ours", same["group_ratio"], "≤ 1.50×"))
    goals.append(("a group of 8 identical turns, ours, 168 px zoom", "group_zoom168", ours["group_ratio"], "≤ 1.50×"))
    figures.update({key: v for _, key, v, _ in goals})
    lines += ["", "| goal (issue 47) | measured | goal |", "|---|---:|---|"]
    lines += [f"| {what} | {v:.2f}× | {goal} |" for what, _, v, goal in goals]
    for row in ("ours_verl_crop", "ours_168", *verl_rows):
        r = results[row]
        lines.append(f"| RSS growth from {r['memory_turns'] // 2} to {r['memory_turns']} turns without `finish`, "
                     f"{LABELS[row]} | {r['memory_growth_half_to_end_mb']:+.1f} MB | "
                     f"{'flat' if row.startswith('ours') else '—'} |")
    verl_note = (
        "*verl-tool*: its own servers, unmodified (a checkout's `verl_tool/servers`, installed with "
        "`scripts/setup_verltool.sh` in `.venv-verltool`), `--tool_type pixel_reasoner`, other settings at their "
        "defaults; its crop grows the box by 10 % of the image a side and crops at that size, JPEG at PIL's default "
        "quality, and keeps every trajectory's images until `finish`." if real else
        "*verl-tool crop (reproduction)*: not verl-tool's server (`.venv-verltool` missing): a FastAPI app written for "
        "this benchmark that returns what its crop tool returns and keeps every trajectory's images until `finish`; "
        "verl-tool's serving machinery is not reproduced, so its figures are a floor for verl-tool's own.")
    diffs = ", ".join(f"{v} against {LABELS['verltool_' + k.removeprefix('max_pixel_diff_vs_')]}"
                      for k, v in same.items() if k.startswith("max_pixel_diff_vs_"))
    lines += ["", verl_note + " *ours, `crop_style=verl_tool`*: our zoom cropping as verl-tool's does (the box grown "
              "by 10 % of the image a side, sides rounded to multiples of 28; `--tool-opt image_zoom_in.crop_style="
              f"verl_tool`), JPEG quality 75: the same work and image; largest pixel difference of the first call's "
              f"returned image: {diffs or '—'}. *ours, 168 px zoom*: our own zoom, which enlarges the 117 px box to "
              "168 px. Our server answers a group's identical turns once (`ObservationShare`: "
              f"{ours.get('observations_shared')} turns shared in this run) and keeps at most 1,024 live trajectories "
              "(`TrajectoryObserver`, LRU), so its RSS stops growing past them. Wall times on this shared 2-core VM "
              "move with its load (recorded with the results); the server-CPU column moves less. "
              f"Kept connections a server had closed and the client opened again: {Client.reconnects}.", ""]
    figures["verltool_real"] = real
    figures["client_reconnects"] = Client.reconnects
    record("seed_wire", "\n".join(lines), figures, command_line("bench_seed_wire.py"),
           results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    sys.exit(main())
