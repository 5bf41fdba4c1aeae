"""Short load tests (the CI cut of ``benchmarks/bench_load.py``): no errors, no unbounded memory
growth, clean back-pressure. No timing assertions: speed is in the benchmark."""

from __future__ import annotations

import concurrent.futures as cf
import json

import httpx
import pytest

from hardening_helpers import bench_load

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def image():
    return bench_load.test_image(128)


def test_concurrent_clients_get_no_errors_and_server_memory_stays_flat(server_factory, image):
    server = server_factory("serve", ["--tools", "segment,image_zoom_in", "--cache-size", "0",
                                      "--max-concurrency", "2"])
    caller = bench_load.http_caller(server.url, image)
    rounds, rss = [], []
    for i in range(4):  # round 0 warms up (imports, pools, allocator); later rounds must not grow
        r = bench_load.run_load(caller, clients=8, duration_s=60, image=image, seed=i, max_calls=10)
        rounds.append(r)
        rss.append(server.rss_bytes())
    assert [r.calls for r in rounds] == [80] * 4
    assert [r.errors for r in rounds] == [0] * 4, [r.first_errors for r in rounds]
    growth = rss[-1] - rss[1]
    assert growth < 30 * MiB, f"server RSS grew {growth / MiB:.1f} MiB over 160 calls: {[x // MiB for x in rss]}"


@pytest.mark.slow
def test_router_under_concurrent_clients(server_factory, image):
    server = server_factory("serve", ["--tools", "segment,image_zoom_in", "--cache-size", "0"])
    upstream = f"segment={server.url},image_zoom_in={server.url}"
    router = server_factory("router", ["--upstream", upstream, "--wait-s", "30"])
    caller = bench_load.http_caller(router.url, image)
    first = bench_load.run_load(caller, clients=8, duration_s=60, image=image, max_calls=8)
    rss = router.rss_bytes()
    second = bench_load.run_load(caller, clients=8, duration_s=60, image=image, seed=1, max_calls=8)
    assert (first.calls, first.errors, second.calls, second.errors) == (64, 0, 64, 0), second.first_errors
    assert router.rss_bytes() - rss < 30 * MiB
    calls = httpx.get(server.url + "/health").json()["calls"]
    assert calls == 128, "every routed call should reach the upstream exactly once"


def test_overload_answers_503_not_500_or_a_dropped_connection(in_thread_server, image):
    """One worker, a queue of 2, 24 simultaneous slow calls: each gets 200 or a clean 503."""
    from tool_backends.registry import build_tool
    from tool_backends.server import ServerSettings, create_app
    from tool_backends.toolbox import LocalBackend
    from tool_backends.wire import encode_image

    backend = LocalBackend([build_tool("segment")])
    app = create_app({"segment": backend}, ServerSettings(max_concurrency=1, max_queue=2, cache_size=0))
    big = encode_image(image.resize((768, 768)))
    # 24 different calls: identical ones would join one computation and never queue
    bodies = [json.dumps({"tool": "segment", "arguments": {"bbox": [i, 0, 700, 700]}, "images": [big]})
              for i in range(24)]
    with in_thread_server(app) as srv, httpx.Client(base_url=srv.url, timeout=60,
                                                    limits=httpx.Limits(max_connections=32)) as client:
        with cf.ThreadPoolExecutor(24) as pool:
            statuses = list(pool.map(lambda b: client.post("/call", content=b, headers={"content-type": "application/json"}).status_code, bodies))
        assert set(statuses) <= {200, 503}, statuses
        assert statuses.count(200) >= 1 and statuses.count(503) >= 1, statuses
        assert client.get("/health").status_code == 200  # and it is still serving
