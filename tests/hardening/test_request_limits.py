"""Per-request and per-connection limits of a real tool server and router (issue 28, items 1, 3, 5).

Each test sends what froze or bloated the server before the limits: the worst turns while
``/health`` is polled, batches whose response was hundreds of MB, images a call never reads,
gzipped NIfTIs that unzip to far more than they weigh, a FIFO as a mask, stalled connections,
router calls past its queue; and the memory mix of ``benchmarks/bench_hostile.py`` against its
stated ceiling.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time

import httpx
import pytest
from PIL import Image

from hardening_helpers import REPO, bench_load  # noqa: F401  (bench_load puts benchmarks/ on the path)
from tool_backends.wire import encode_image

import bench_hostile  # noqa: E402  (benchmarks/bench_hostile.py)

GOOD = Image.radial_gradient("L").resize((64, 48)).convert("RGB")


def zoom(images, bbox=(0, 0, 32, 32), **extra) -> dict:
    return {"tool": "image_zoom_in", "arguments": {"bbox": list(bbox)}, "images": images, **extra}


# ---- item 1: the worst turns do not stall the server ------------------------------------------
@pytest.mark.parametrize("command", ["serve", "router"])
def test_health_answers_while_the_worst_turns_are_in_flight(server_factory, command):
    """``"<think>" * 15000`` held every endpoint, ``/health`` included, for 46 s (13.9 s through the
    router). Now the turns are parsed in linear time and ``/health`` answers throughout."""
    server = server_factory("serve", ["--tools", "image_zoom_in"])
    if command == "router":
        server = server_factory("router", ["--upstream", f"image_zoom_in={server.url}"])
    results, errors = [], []

    def attack():
        try:
            with httpx.Client(base_url=server.url, timeout=30) as c:
                for _ in range(5):
                    r = c.post("/get_observation", json={"actions": bench_hostile.WORST_TURNS})
                    results.append((r.status_code, r.json()["observations"]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=attack)
    thread.start()
    healthy = 0
    with httpx.Client(base_url=server.url, timeout=10) as c:
        while thread.is_alive():
            assert c.get("/health").status_code == 200
            healthy += 1
    thread.join()
    assert not errors and len(results) == 5 and all(status == 200 for status, _ in results)
    assert healthy >= 1


# ---- item 3: per-request resource limits ------------------------------------------------------
@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    proc = bench_load.ServerProcess("serve", bench_hostile.SERVER_ARGS + ["--max-batch-calls", "40"],
                                    log_path=tmp_path_factory.mktemp("logs") / "server.log")
    proc.start()
    yield proc
    proc.close()


def test_a_batch_over_the_call_limit_gets_413(limited):
    r = httpx.post(limited.url + "/call_batch", json={"calls": [zoom([encode_image(GOOD)])] * 41}, timeout=60)
    assert r.status_code == 413 and "limit is 40" in r.json()["detail"]


def test_a_batch_response_is_bounded_by_its_result_pixels(limited):
    """30 ``hires_render`` calls in a 4 KB request made a 480 MiB response; past the response's
    pixel budget (``--max-pixels`` by default) a call gets an error result instead."""
    body = bench_hostile.part("30 hires_render in one batch")
    r = httpx.post(limited.url + "/call_batch", json=body, timeout=120)
    assert r.status_code == 200
    results = r.json()["results"]
    ok = [x for x in results if not x["error"]]
    assert len(results) == 30 and 1 <= len(ok) <= 2
    assert sum(im["size"][0] * im["size"][1] for x in ok for im in x["images"]) <= 2 * bench_hostile.MAX_PIXELS
    assert all("over its limit" in x["error"] for x in results if x["error"])


def test_only_the_image_a_call_reads_is_decoded(limited):
    broken = {"png": base64.b64encode(b"\x89PNG\r\n\x1a\n broken").decode()}
    r = httpx.post(limited.url + "/call", json=zoom([encode_image(GOOD)] + [broken] * 7), timeout=60)
    assert r.status_code == 200 and r.json()["result"]["error"] is None  # the seven others were never decoded
    r = httpx.post(limited.url + "/call", json={**zoom([encode_image(GOOD)] + [broken] * 7),
                                                "arguments": {"bbox": [0, 0, 32, 32], "image_index": 3}}, timeout=60)
    assert r.status_code == 400  # the one it reads is


def test_a_request_over_its_decoded_pixels_gets_400(limited):
    side = int(bench_hostile.MAX_PIXELS ** 0.5)
    calls = [zoom([{"png": bench_hostile._png(bench_hostile._gradient(side, seed=i))}]) for i in range(3)]
    r = httpx.post(limited.url + "/call_batch", json={"calls": calls}, timeout=120)
    assert r.status_code == 400 and "pixels in all" in r.json()["detail"]
    r = httpx.post(limited.url + "/call_batch", json={"calls": calls[:2]}, timeout=120)
    assert r.status_code == 200  # two at the pixel limit fit the default budget (twice --max-pixels)


def test_a_gzipped_nifti_is_refused_from_its_header_before_unzipping(limited):
    """A ~250 KB ``.nii.gz`` declaring 256 MB was unzipped whole (and its buffer stayed alive);
    at ``--max-pixels 4000000`` a file may decode to 64 MiB, and this one is refused unread."""
    body = bench_hostile.part("gzipped NIfTI declaring 256 MB (1)")
    before = limited.rss_bytes()
    for _ in range(3):
        r = httpx.post(limited.url + "/call", json=body, timeout=60)
        assert r.status_code == 400 and "refused before decompressing" in r.json()["detail"]
    assert bench_hostile.vm_hwm(limited.pid) - before < 64 * bench_hostile.MiB


def test_the_memory_mix_stays_under_its_ceiling(tmp_path):
    """The request mix that took gigabytes (``benchmarks/bench_hostile.py``, RELIABILITY.md) peaks
    under :data:`bench_hostile.CEILING_MIB` above the warmed-up server."""
    with bench_load.ServerProcess("serve", bench_hostile.SERVER_ARGS, log_path=tmp_path / "server.log") as server:
        out = bench_hostile.run_mix(server)
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    statuses = dict(out["statuses"])
    assert statuses["30 hires_render in one batch"] == 200 and out["batch_calls_refused"] >= 28
    assert all(s == 400 for p, s in out["statuses"] if "NIfTI" in p)
    assert out["peak_growth_mib"] < bench_hostile.CEILING_MIB, out


# ---- item 5: files, router limits, connections, result dir -----------------------------------
def test_a_fifo_mask_path_does_not_block_a_worker(server_factory, tmp_path):
    """With the oracle engine, a FIFO named as an annotation mask blocked the worker thread in
    ``open()`` forever (four of them took every slot while ``/health`` said ok)."""
    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / "mask.png")
    server = server_factory("serve", ["--tools", "segment", "--engine", "segment=oracle", "--image-root", str(root),
                                      "--max-concurrency", "1"])
    ctx = {"annotations": {"masks": [{"label": "lesion", "path": str(root / "mask.png")}]}}
    body = {"tool": "segment", "arguments": {"bbox": [4, 4, 40, 40]}, "images": [encode_image(GOOD)], "context": ctx}
    for _ in range(2):  # one slot: a blocked worker would time the second call out
        r = httpx.post(server.url + "/call", json=body, timeout=20)
        assert r.status_code == 200


def test_the_routers_call_obeys_its_concurrency_and_queue(server_factory):
    """``/call`` through the router forwarded without the gate: a stalled upstream collected every
    request. Now one runs, one waits, the rest get 503 at once. (The calls differ: identical ones
    join the one in flight and share its answer, tests/tool_backends/test_single_flight.py.)"""
    upstream = server_factory("serve", ["--tools", "image_zoom_in"])
    router = server_factory("router", ["--upstream", f"image_zoom_in={upstream.url}", "--max-concurrency", "1",
                                       "--max-queue", "1", "--timeout-s", "1"])
    upstream.stall()
    statuses = []

    def one(i: int):
        body = zoom([encode_image(GOOD)], bbox=(0, 0, 32 + i, 32))
        statuses.append(httpx.post(router.url + "/call", json=body, timeout=30).status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    try:
        for t in threads:
            t.start()
            time.sleep(0.1)
        for t in threads:
            t.join(60)
    finally:
        upstream.resume()
    assert statuses.count(503) >= 3, statuses


@pytest.fixture(scope="module")
def edges(tmp_path_factory):
    """One server for the connection and result-dir limits."""
    out = tmp_path_factory.mktemp("results")
    proc = bench_load.ServerProcess("serve", ["--tools", "image_zoom_in", "--read-timeout-s", "1", "--max-connections",
                                              "3", "--result-dir", str(out), "--result-dir-mb", "1"],
                                    log_path=tmp_path_factory.mktemp("logs") / "server.log")
    proc.start()
    proc.result_dir = out
    yield proc
    proc.close()


def test_a_connection_that_stalls_is_closed(edges):
    server = edges
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /call HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
        start = time.monotonic()
        assert s.recv(1024) == b"" and time.monotonic() - start < 8  # closed by the server
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /call HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_connections_past_the_cap_get_503_but_health_still_answers(edges):
    """A server full of stalled (or waiting) connections refuses work, and still says how it is
    (issue 40: 255 dripping bodies kept /health at 503)."""
    server = edges
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(3)]
    try:
        time.sleep(0.3)
        assert httpx.get(server.url + "/tools", timeout=10).status_code == 503
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_the_result_dir_is_bounded(edges):
    server, out = edges, edges.result_dir
    image = encode_image(Image.radial_gradient("L").resize((256, 256)).convert("RGB"))
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for i in range(12):  # 12 distinct 336x336 crops of ~340 KB each
            r = c.post("/call", json=zoom([image], bbox=(i, 0, 64 + i, 64), image_format="path"))
            assert r.status_code == 200 and r.json()["result"]["error"] is None
            newest = r.json()["result"]["images"][0]["path"]
            assert os.path.isfile(newest)  # the file just named is still there
    total = sum(p.stat().st_size for p in out.iterdir())
    assert total <= (1 << 20) + 400_000 and len(list(out.iterdir())) < 12


# ---- item 2: big integers -------------------------------------------------------------------
@pytest.mark.parametrize("digits", [400, 5000])
def test_a_huge_integer_argument_is_an_error_result_without_a_traceback(limited, digits):
    """5,000 digits: ``/get_observation`` answered 500 (``json.loads`` of the turn raised); 400
    digits reached the tool, which crashed with a logged traceback on every call."""
    number = "9" * digits
    turn = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, %s, 40]}}</tool_call>' % number
    r = httpx.post(limited.url + "/get_observation", timeout=60,
                   json={"actions": [turn], "extra_fields": [{"images": [encode_image(GOOD)]}]})
    assert r.status_code == 200 and r.json()["observations"] == [""]  # no call parsed: an invalid turn
    if digits < 4300:  # a JSON body can carry it to /call directly
        raw = json.dumps(zoom([encode_image(GOOD)])).replace("[0, 0, 32, 32]", f"[0, 0, {number}, 32]")
        r = httpx.post(limited.url + "/call", content=raw, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 200 and "at most 15 digits" in r.json()["result"]["error"]
    assert "Traceback" not in limited.log()
