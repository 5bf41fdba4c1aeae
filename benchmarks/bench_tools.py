"""Tool backends side by side: in-process vs a real tool server on loopback, per tool and per image
transport; remote throughput with concurrent clients; a GRPO group of 8 identical calls with and
without the cache. Real VQA-RAD images (the embedded synthetic scan when VQA-RAD is absent).

    python benchmarks/bench_tools.py [--quick] [--vqa-rad ../shared/data/vqa_rad]

Goals: remote overhead on loopback < 3 ms per call over in-process; an 8-copy group ~ one call.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from PIL import Image  # noqa: E402

from medvqa_env.parser import ToolCall  # noqa: E402
from tool_backends.base import ToolContext  # noqa: E402
from tool_backends.toolbox import ToolCache, Toolbox  # noqa: E402

from figures import record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

TOOLS = {"image_zoom_in": {}, "segment": {"engine": "classical"}, "ground": {"engine": "classical"},
         "classify": {"engine": "oracle"}, "hires_render": {}}


def arguments(tool: str, size: tuple[int, int]) -> dict:
    w, h = size
    box = [w // 3, h // 3, w // 3 + w // 6, h // 3 + h // 6]
    return {"image_zoom_in": {"bbox": box}, "segment": {"bbox": box}, "ground": {"text": "bright lesion"},
            "classify": {"labels": ["ct", "mri", "x-ray"]}, "hires_render": {"bbox": box, "scale": 2}}[tool]


def load_images(vqa_rad: str | None, n: int) -> list[Image.Image]:
    root = Path(vqa_rad) / "images" if vqa_rad else None
    if root and root.is_dir():
        paths = sorted(root.glob("*.jpg"))
        step = max(1, len(paths) // n)
        return [Image.open(p).convert("RGB") for p in paths[::step][:n]]
    from medvqa_env.datasets import load_dataset

    ds = load_dataset("embedded")
    return [Image.open(r.image_paths[0]).convert("RGB") for r in list(ds)[:n]]


def start_server(shared: str, cache_size: int) -> tuple[subprocess.Popen, str]:
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engines = ",".join(f"{t}={o['engine']}" for t, o in TOOLS.items() if "engine" in o)
    proc = subprocess.Popen([sys.executable, "-m", "tool_backends.cli", "serve", "--tools", ",".join(TOOLS),
                             "--engine", engines, "--port", str(port), "--image-root", shared,
                             "--cache-size", str(cache_size), "--max-concurrency", "8", "--result-dir", shared],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("tool server did not start")


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def interleaved_ms(fns: dict, repeats: int) -> dict[str, float]:
    """Median ms per call of each of ``fns``, timed call by call in turn (the order rotating every
    round), so a slow spell of this shared machine hits every variant alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    for i in range(repeats):
        for key in keys[i % len(keys):] + keys[:i % len(keys)]:
            t0 = time.perf_counter()
            fns[key]()
            times[key].append(time.perf_counter() - t0)
    return {k: 1000 * statistics.median(v) for k, v in times.items()}


def _forget(box: Toolbox) -> None:
    """Make the next call upload its image again (as a client that never sent it would)."""
    for backend in dict.fromkeys(box._backends.values()):
        backend._sent.clear()
        backend._encoded.clear()


def latency(images, url: str, shared: str, repeats: int) -> list[dict]:
    """Median ms per call: in-process, and remote per transport: *upload* (a fresh image copy the
    client has not sent: hash, encode, transfer, decode) and *repeat* (the server holds it: a ref)."""
    local = Toolbox.from_config({t: {"backend": "local", **o} for t, o in TOOLS.items()}, cache=False)
    remotes = {tr: Toolbox.from_config({t: {"url": url, "transport": tr, "shared_dir": shared, "result_format": tr,
                                            "optimistic_refs": False} for t in TOOLS}, cache=False)
               for tr in ("png", "raw", "path")}
    rows = []
    ctx = ToolContext()

    def read_pixels(box, call, image):
        """A call whose result images are then read (a derived overlay is drawn on first read)."""
        for im in box.call(call, [image], ctx).result.images:
            im.load()

    for tool in TOOLS:
        row = {"tool": tool, "local": [], "local_read": [], "raw_repeat_read": [],
               **{f"{tr}_upload": [] for tr in remotes}, **{f"{tr}_repeat": [] for tr in remotes}}
        for image in images:
            call = ToolCall(tool, arguments(tool, image.size))
            local.call(call, [image], ctx)  # warm-up
            remotes["raw"].call(call, [image], ctx)
            for tr in ("png", "path"):
                remotes[tr].call(call, [image], ctx)  # the server holds the image from here on
            timed = interleaved_ms({
                "local": lambda: local.call(call, [image], ctx),
                "raw_repeat": lambda: remotes["raw"].call(call, [image], ctx),
                "png_repeat": lambda: remotes["png"].call(call, [image], ctx),
                "path_repeat": lambda: remotes["path"].call(call, [image], ctx),
                "local_read": lambda: read_pixels(local, call, image),
                "raw_repeat_read": lambda: read_pixels(remotes["raw"], call, image)}, repeats)
            for key, ms in timed.items():
                row[key].append(ms)
            for tr, box in remotes.items():

                def upload():
                    _forget(box)
                    box.call(call, [image.copy()], ctx)

                row[f"{tr}_upload"].append(median_ms(upload, repeats))
        rows.append({k: (statistics.median(v) if isinstance(v, list) else v) for k, v in row.items()})
    for box in (local, *remotes.values()):
        box.close()
    return rows


def throughput(image, url: str, shared: str, clients: int, seconds: float) -> float:
    """Calls per second from ``clients`` threads, each with its own pooled client (cache off), every
    call a different one (its box moved by a pixel or two), so none joins another in flight: the
    server's throughput, not single-flight's."""
    box = arguments("segment", image.size)["bbox"]

    def call_for(i: int, n: int) -> ToolCall:
        return ToolCall("segment", {"bbox": [box[0] + n % 32, box[1] + i, box[2], box[3]]})

    call = ToolCall("segment", {"bbox": box})
    boxes = [Toolbox.from_config({"segment": {"url": url, "transport": "path", "shared_dir": shared,
                                              "result_format": "path"}}, cache=False) for _ in range(clients)]
    for b in boxes:
        b.call(call, [image], ToolContext())
    counts = [0] * clients
    stop = time.perf_counter() + seconds

    def worker(i):
        while True:  # at least one call, however late the thread starts
            boxes[i].call(call_for(i, counts[i]), [image], ToolContext())
            counts[i] += 1
            if time.perf_counter() >= stop:
                break

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    [t.start() for t in threads]
    [t.join() for t in threads]
    elapsed = time.perf_counter() - t0
    for b in boxes:
        b.close()
    return sum(counts) / elapsed


def grpo_group(image, url_cached: str, n: int = 8) -> dict[str, float]:
    """Wall time of n identical segment calls: no cache, the env-side cache (one process), and n
    cache-less clients against a server with its cache on (n processes of one GRPO group)."""
    call = ToolCall("segment", arguments("segment", image.size))
    ctx = ToolContext(record_id="group")
    out = {}
    plain = Toolbox.from_config({"segment": {"backend": "local"}}, cache=False)
    plain.call(ToolCall("segment", {"bbox": [0, 0, 10, 10]}), [image], ctx)
    t0 = time.perf_counter()
    for _ in range(n):
        plain.call(call, [image], ctx)
    out["local, no cache"] = time.perf_counter() - t0
    cached = Toolbox.from_config({"segment": {"backend": "local"}}, cache=ToolCache())
    t0 = time.perf_counter()
    for _ in range(n):
        cached.call(call, [image], ctx)
    out["local, cache"] = time.perf_counter() - t0
    out["one call (median of 5)"] = median_ms(lambda: plain.call(call, [image], ctx), 5) / 1000
    for optimistic in (False, True):
        clients = [Toolbox.from_config({"segment": {"url": url_cached, "transport": "raw", "result_format": "raw",
                                                    "optimistic_refs": optimistic}}, cache=False) for _ in range(n)]
        for box in clients:  # connections open, as in a running rollout
            box.call(ToolCall("segment", {"bbox": [0, 0, 8, 8]}), [Image.new("RGB", (16, 16), optimistic)], ctx)
        copies = [image.rotate(90 * optimistic + 180) for _ in range(n)]  # each env loaded its own copy; a new image per row
        t0 = time.perf_counter()
        for box, im in zip(clients, copies):
            box.call(call, [im], ctx)
        name = "optimistic refs (default)" if optimistic else "each uploads the image"
        out[f"remote, 8 clients, server cache, {name}"] = time.perf_counter() - t0
        for box in clients:
            box.close()
    return out


def main(argv: list[str] | None = None) -> str:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vqa-rad", default=str(REPO.parent / "shared" / "data" / "vqa_rad"))
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                    "none with --quick)")
    args = ap.parse_args(argv)
    n_images, repeats, seconds = (3, 3, 1.0) if args.quick else (8, 15, 3.0)
    images = load_images(args.vqa_rad, n_images)
    load_before = os.getloadavg()[0]
    shared = tempfile.mkdtemp(prefix="medvqa-bench-shared-")
    server, url = start_server(shared, cache_size=0)
    cached_server, cached_url = start_server(shared, cache_size=256)
    try:
        rows = latency(images, url, shared, repeats)
        small = min(images, key=lambda im: im.size[0] * im.size[1])
        tput = {c: throughput(small, url, shared, c, seconds) for c in (1, 2, 4, 8)}
        group = grpo_group(small, cached_url)
    finally:
        server.kill(), cached_server.kill()
    sizes = sorted(f"{im.size[0]}x{im.size[1]}" for im in images)
    cmd = f"python benchmarks/bench_tools.py{' --quick' if args.quick else ''}"
    lines = [
        "## Tool backends: in-process vs remote (loopback), transports, throughput, cache",
        "",
        f"`{cmd}` — {len(images)} VQA-RAD images ({', '.join(sizes)}), median ms per call over images "
        f"(each the median of {repeats} calls; the in-process and *repeat* variants are timed call by call in "
        "turn, so a slow spell of the machine hits them alike); server and env caches off. *upload*: an image the client "
        "has not sent (hash + encode + transfer + decode, results back in the same format); *repeat*: the "
        "server holds the image, the client sends its digest (every later turn of an episode). A result image "
        "that is a pure function of the source and the result (segment's overlay, ground's boxes, the zoom's crop, "
        "the classical re-render) travels as a recipe: the server does not draw it and the client draws it when "
        "first read (in-process, the tool's image is drawn when first read too); *images read* times the call "
        "plus reading every result image's pixels. "
        f"Load average during the run: {load_before:.1f} (this machine has {os.cpu_count()} cores, shared).",
        "",
        "| tool | in-process | png upload | raw upload | path upload | png repeat | raw repeat | path repeat "
        "| **overhead** (best repeat) | in-process, images read | raw repeat, images read | overhead, images read |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    figures: dict[str, float] = {"images": len(images), "repeats": repeats}
    for r in rows:
        best = min(r["png_repeat"], r["raw_repeat"], r["path_repeat"]) - r["local"]
        figures.update({f"{r['tool']}.{k}_ms": v for k, v in r.items() if k != "tool"})
        figures[f"{r['tool']}.overhead_ms"] = best
        read = r["raw_repeat_read"] - r["local_read"]
        figures[f"{r['tool']}.overhead_read_ms"] = read
        lines.append(f"| {r['tool']} | {r['local']:.2f} | {r['png_upload']:.2f} | {r['raw_upload']:.2f} | "
                     f"{r['path_upload']:.2f} | {r['png_repeat']:.2f} | {r['raw_repeat']:.2f} | "
                     f"{r['path_repeat']:.2f} | **{best:+.2f}** | {r['local_read']:.2f} | {r['raw_repeat_read']:.2f} | "
                     f"{read:+.2f} |")
    lines += ["", f"Remote throughput, `segment` (classical) on a {small.size[0]}x{small.size[1]} image, "
              f"`path` transport, one pooled client per thread, every call a different box (none shares a computation), "
              f"{seconds:g} s each:", "",
              "| concurrent clients | calls/s | ratio to 1 client |", "|---:|---:|---:|"]
    for c, v in tput.items():
        figures[f"throughput.clients_{c}.calls_per_s"] = v
        figures[f"throughput.clients_{c}.ratio"] = v / tput[1]
        lines.append(f"| {c} | {v:.1f} | {v / tput[1]:.2f} |")
    lines += ["", "A GRPO group of 8 identical `segment` calls (same record, same image):", "",
              "| setting | total ms | ratio to one call |", "|---|---:|---:|"]
    one = group["one call (median of 5)"]
    group_keys = {"local, no cache": "local_no_cache", "local, cache": "local_cache", "one call (median of 5)": "one_call",
                  "remote, 8 clients, server cache, each uploads the image": "remote_uploads",
                  "remote, 8 clients, server cache, optimistic refs (default)": "remote_refs"}
    for k, v in group.items():
        figures[f"group.{group_keys[k]}_ms"] = 1000 * v
        figures[f"group.{group_keys[k]}_ratio"] = v / one
        lines.append(f"| {k} | {1000 * v:.1f} | {v / one:.2f} |")
    figures["overhead_max_ms"] = max(figures[f"{t}.overhead_ms"] for t in TOOLS)
    section = "\n".join(lines) + "\n"
    record("tools", section, figures, cmd, results_dir_arg(args.quick, args.results))
    return section


if __name__ == "__main__":
    main()
