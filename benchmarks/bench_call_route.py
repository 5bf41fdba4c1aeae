"""What routing ``POST /call`` through FastAPI costs, beside what a real tool call costs (issue 40).

Two tool servers, identical but for one thing: in one (``--gate-direct DIR``, a checkout where the
request gate hands ``POST /call`` straight to its handler) the gate answers ``/call`` itself; in
the other (this checkout) ``/call`` goes through FastAPI's routing, request object, response and
exception handler like every other endpoint. Both run the same checks (the gate before the body;
JSON bounds, image entries and limits in the handler). Measured in the same run, alternating the
two servers over ``--rounds`` rounds (median of the rounds), with one h11 keep-alive client (this
checkout's ``ConnectionPool``) for both:

* **cached call** -- ``image_zoom_in`` by ref with its result cached (the rest of a GRPO group: the
  cheapest call a server answers, where routing weighs most): wall time per call on the client and
  the server's CPU per call (``/proc/PID/stat``);
* **classical segment** -- ``segment`` (classical engine) on an image it has not seen, uploaded;
* **LiteMedSAM segment** -- ``segment`` (``medsam_lite``, the real-image default) on an image it
  has not seen (its embedding not cached: the first box on an image).

Reported: the routed server's extra time per call over the gate-direct one, and that extra as a
share of each real tool call. ::

    python benchmarks/bench_call_route.py --gate-direct /path/to/checkout [--quick] [--results DIR]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from bench_hostile import CheckoutServer, _commit, _cpu_s  # noqa: E402
from bench_load import ServerProcess  # noqa: E402
from figures import record, results_dir_arg  # noqa: E402

HEADERS = {"content-type": "application/json", "accept": "application/json"}


def fresh_images(n: int, seed: int) -> list[Image.Image]:
    """Embedded test images with a little noise: no server has seen them (nothing cached)."""
    from medvqa_env.datasets import load_dataset
    from medvqa_env.images import load_image

    rng = np.random.default_rng(seed)
    paths = sorted({r.image_paths[0] for r in load_dataset("embedded", split="test")})
    out = []
    for i in range(n):
        a = np.asarray(load_image(paths[i % len(paths)]).convert("RGB"), dtype=np.int16)
        a = a + rng.integers(-3, 4, a.shape)
        out.append(Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)))
    return out


def cached_calls(pool, server, n: int) -> dict:
    from tool_backends.wire import encode_image

    image = Image.radial_gradient("L").resize((128, 128)).convert("RGB")
    entry = encode_image(image, "raw")
    call = {"tool": "image_zoom_in", "arguments": {"bbox": [0, 0, 64, 64]}, "image_format": "raw", "derived_ok": True}
    assert pool.request("POST", "/call", json.dumps({**call, "images": [entry]}).encode(), HEADERS, 30).status_code == 200
    body = json.dumps({**call, "images": [{"ref": entry["digest"]}]}).encode()
    for _ in range(50):  # warm
        pool.request("POST", "/call", body, HEADERS, 30)
    walls = []
    cpu0 = _cpu_s(server.pid)
    for _ in range(n):
        t = time.perf_counter()
        r = pool.request("POST", "/call", body, HEADERS, 30)
        walls.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text[:200]
    return {"wall_us": statistics.median(walls) * 1e6, "server_cpu_us": (_cpu_s(server.pid) - cpu0) / n * 1e6}


def segment_calls(pool, images: list[Image.Image]) -> float:
    """Median ms of one ``segment`` call per (unseen) image, its image uploaded with the call."""
    from tool_backends.wire import encode_image

    walls = []
    for image in images:
        w, h = image.size
        body = json.dumps({"tool": "segment", "arguments": {"bbox": [w // 4, h // 4, 3 * w // 4, 3 * h // 4]},
                           "images": [encode_image(image, "raw")], "image_format": "png"}).encode()
        t = time.perf_counter()
        r = pool.request("POST", "/call", body, HEADERS, 600)
        walls.append(time.perf_counter() - t)
        assert r.status_code == 200 and r.json()["result"]["error"] is None, r.text[:300]
    return statistics.median(walls) * 1000


def measure(make, n_cached: int, n_segment: int, seed: int) -> dict:
    from tool_backends.http_client import ConnectionPool

    out = {}
    with make(["--tools", "image_zoom_in,segment", "--engine", "segment=classical"]) as server:
        pool = ConnectionPool(server.url, 1, 5)
        out.update(cached_calls(pool, server, n_cached))
        segment_calls(pool, fresh_images(2, seed + 99))  # warm
        out["classical_ms"] = segment_calls(pool, fresh_images(n_segment, seed))
        pool.close()
    with make(["--tools", "segment", "--engine", "segment=medsam_lite"]) as server:
        pool = ConnectionPool(server.url, 1, 5)
        segment_calls(pool, fresh_images(1, seed + 98))  # load the model
        out["medsam_ms"] = segment_calls(pool, fresh_images(max(3, n_segment // 4), seed + 1))
        pool.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gate-direct", required=True, help="a checkout whose gate answers POST /call itself")
    parser.add_argument("--label", default=None, help="what --gate-direct is, for the report (default: its commit)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--results", default=None, help="results folder (default benchmarks/results; --quick: none)")
    args = parser.parse_args(argv)
    results = results_dir_arg(args.quick, args.results)
    n_cached, n_segment = (300, 6) if args.quick else (2000, 16)
    direct = Path(args.gate_direct)
    makers = {"direct": lambda extra: CheckoutServer(direct, "serve", extra),
              "routed": lambda extra: ServerProcess("serve", extra)}
    rounds: dict[str, list[dict]] = {k: [] for k in makers}
    for r in range(args.rounds):
        for name in (("direct", "routed") if r % 2 == 0 else ("routed", "direct")):
            rounds[name].append(measure(makers[name], n_cached, n_segment, seed=r))
    med = {name: {k: statistics.median(run[k] for run in runs) for k in runs[0]} for name, runs in rounds.items()}
    d, f = med["direct"], med["routed"]
    extra_us = f["wall_us"] - d["wall_us"]
    figures = {f"{name}.{k}": v for name, m in med.items() for k, v in m.items()}
    figures.update({"extra_wall_us": extra_us, "extra_server_cpu_us": f["server_cpu_us"] - d["server_cpu_us"],
                    "cached_ratio": f["wall_us"] / d["wall_us"],
                    "extra_share_classical": extra_us / 1000 / d["classical_ms"],
                    "extra_share_medsam": extra_us / 1000 / d["medsam_ms"],
                    "load_1m": os.getloadavg()[0], "niceness": os.nice(0), "rounds": args.rounds})
    label = args.label or _commit(direct)
    lines = ["## Issue 40: `/call` through FastAPI's routing vs the gate answering it", "",
             f"Gate-direct: `{label}`; routed: this checkout. Same checks in both. Median of {args.rounds} "
             f"alternating rounds, each with servers started afresh; {n_cached} cached calls, {n_segment} classical "
             f"and {max(3, n_segment // 4)} LiteMedSAM segment calls on unseen images per round; one h11 "
             f"keep-alive client; niceness {os.nice(0)}, 1-min load {os.getloadavg()[0]:.1f} at the end.", "",
             "| Per call | Gate-direct | Routed | Routed - direct |", "|---|---|---|---|",
             f"| cached `image_zoom_in` by ref, client wall (us) | {d['wall_us']:.0f} | {f['wall_us']:.0f} | "
             f"{extra_us:+.0f} ({f['wall_us'] / d['wall_us']:.2f}x) |",
             f"| cached `image_zoom_in` by ref, server CPU (us) | {d['server_cpu_us']:.0f} | {f['server_cpu_us']:.0f} | "
             f"{f['server_cpu_us'] - d['server_cpu_us']:+.0f} |",
             f"| `segment`, classical, unseen image (ms) | {d['classical_ms']:.1f} | {f['classical_ms']:.1f} | "
             f"{f['classical_ms'] - d['classical_ms']:+.1f} |",
             f"| `segment`, LiteMedSAM, unseen image (ms) | {d['medsam_ms']:.0f} | {f['medsam_ms']:.0f} | "
             f"{f['medsam_ms'] - d['medsam_ms']:+.0f} |", "",
             f"Routing's extra per call ({extra_us:.0f} us, from the cached call) is "
             f"{100 * extra_us / 1000 / d['classical_ms']:.1f}% of a classical segment call and "
             f"{100 * extra_us / 1000 / d['medsam_ms']:.2f}% of a LiteMedSAM one.", ""]
    from figures import command_line

    record("call_route", "\n".join(lines), figures, command_line("bench_call_route.py", argv).replace(
        str(direct), "<checkout with the gate answering /call>"), results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
