"""Tools as Ray Serve deployments (``tool_backends.ray_serve``), on a real local Ray and Serve.

One Serve instance for the module: ``segment`` (the tiny SAM, 2 replicas, dynamic batching) and
``image_zoom_in`` behind one HTTP address, with a token, a 1 MB body limit and 4 calls a batch.
The same calls over HTTP (the plain client against Serve's front), by handle (the ``ray_serve``
tool-config backend) and in-process give the same results; the limits and the token hold on both
paths; concurrent distinct calls run as batches with each call's own mask; a group of identical
calls runs once per replica at most; a replica killed under load loses no call.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import socket
import time

import httpx
import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from medvqa_env.errors import ConfigError  # noqa: E402
from medvqa_env.parser import ToolCall  # noqa: E402
from tool_backends.base import ToolContext  # noqa: E402
from tool_backends.masks import rle_to_mask  # noqa: E402
from tool_backends.ray_serve import load_serve_config  # noqa: E402
from tool_backends.toolbox import Toolbox  # noqa: E402

TOKEN_ENV = "MEDVQA_RAY_SERVE_TEST_TOKEN"
APP = "medvqa-tools-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(scene):
    from tool_backends.ray_serve_deploy import deploy

    os.environ[TOKEN_ENV] = "ray-serve-test-token"  # before ray.init: the replicas' processes inherit it
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    config = load_serve_config({
        "tools": {"segment": {"engine": "sam", "ray": {"replicas": 2, "num_cpus": 0.5, "max_batch_size": 8,
                                                       "batch_wait_timeout_s": 0.05, "torch_threads": 1}},
                  "image_zoom_in": {"ray": {"num_cpus": 0.25}}},
        "settings": {"max_body_mb": 1, "max_batch_calls": 4, "image_roots": [str(scene.root)]},
        "token_env": TOKEN_ENV, "app": APP, "port": _free_port()})
    try:
        deploy(config)
        yield config
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            os.environ.pop(TOKEN_ENV, None)


@pytest.fixture()
def http(served):
    with httpx.Client(base_url=f"http://127.0.0.1:{served.port}", timeout=60,
                      headers={"Authorization": f"Bearer {os.environ[TOKEN_ENV]}"}) as client:
        yield client


def by_handle(**options) -> Toolbox:
    return Toolbox.from_config({"segment": {"backend": "ray_serve", "app": APP, "token_env": TOKEN_ENV, **options},
                                "image_zoom_in": {"backend": "ray_serve", "app": APP, "token_env": TOKEN_ENV}},
                               cache=False)


def box_call(x0: int = 30, y0: int = 40) -> ToolCall:
    return ToolCall("segment", {"bbox": [x0, y0, x0 + 50, y0 + 45]})


# ---- config ---------------------------------------------------------------------------------------
def test_the_config_names_what_is_wrong():
    with pytest.raises(ConfigError, match="Did you mean 'max_batch_size'"):
        load_serve_config({"tools": {"segment": {"ray": {"max_batch": 4}}}})
    with pytest.raises(ConfigError, match="a local backend"):
        load_serve_config({"tools": {"segment": "http://127.0.0.1:7660"}})
    with pytest.raises(ConfigError, match="Did you mean 'max_queue'"):
        load_serve_config({"tools": {"segment": "classical"}, "settings": {"max_queu": 3}})
    with pytest.raises(ConfigError, match="replicas >= 1"):
        load_serve_config({"tools": {"segment": {"ray": {"replicas": 0}}}})
    from tool_backends.ray_serve_client import RayServeToolBackend

    with pytest.raises(ConfigError, match="one tool"):
        RayServeToolBackend(tools=["segment", "ground"])
    with pytest.raises(ConfigError, match="Did you mean 'timeout_s'"):
        Toolbox.from_config({"segment": {"backend": "ray_serve", "timeout": 3}})


def test_the_command_line_and_the_replica_settings():
    from tool_backends.cli import ServeCommandArgs
    from tool_backends.ray_serve import config_from_cli, server_settings

    args = ServeCommandArgs(tools="segment,image_zoom_in", engine="segment=classical", ray=True, port=8123,
                            ray_opt=["segment.replicas=2", "segment.max_batch_size=16"], max_body_mb=2)
    config = config_from_cli(args, ["segment", "image_zoom_in"])
    assert config.tools == {"segment": {"engine": "classical"}, "image_zoom_in": {}} and config.port == 8123
    assert (config.ray["segment"].replicas, config.ray["segment"].max_batch_size) == (2, 16)
    assert config.ray["image_zoom_in"].replicas == 1
    segment, zoom, front = (server_settings(config, "segment"), server_settings(config, "image_zoom_in"),
                            server_settings(config))
    assert segment.max_body_bytes == zoom.max_body_bytes == front.max_body_bytes == 2 << 20
    assert segment.max_concurrency == 16 and zoom.max_concurrency == 4   # a batch can fill
    assert front.max_concurrency >= 2 * 16 + 4
    # a group's refs may reach another replica than its upload: no waiting there for it
    assert segment.upload_wait_s == 0 and zoom.upload_wait_s == front.upload_wait_s > 0
    with pytest.raises(ConfigError, match="--ray-opt"):
        config_from_cli(ServeCommandArgs(tools="segment", ray=True, ray_opt=["ground.replicas=2"]), ["segment"])
    with pytest.raises(ConfigError, match="token_env 'NO_SUCH_TOKEN_VAR' is empty"):
        server_settings(load_serve_config({"tools": {"segment": "classical"}, "token_env": "NO_SUCH_TOKEN_VAR"}))


# ---- the same wire, limits and auth ---------------------------------------------------------------
def test_http_front_speaks_the_plain_server_wire(served, http, scene):
    assert http.get("/health").json()["status"] == "ok"
    assert httpx.get(f"http://127.0.0.1:{served.port}/tools").status_code == 401        # no token
    names = sorted(t["function"]["name"] for t in http.get("/tools").json()["tools"])
    assert names == ["image_zoom_in", "segment"]
    local = Toolbox.from_config({"segment": {"engine": "sam"}, "image_zoom_in": "local"}, cache=False)
    from tool_backends.http_client import HTTPToolBackend

    client = HTTPToolBackend(url=f"http://127.0.0.1:{served.port}", token_env=TOKEN_ENV)
    over_http = Toolbox({"segment": client, "image_zoom_in": client}, cache=None)
    for call in (box_call(), ToolCall("image_zoom_in", {"bbox": [10, 10, 90, 80]})):
        want = local.call(call, [scene.image]).result
        got = over_http.call(call, [scene.image]).result
        assert got.ok and got.text == want.text and got.data == want.data
        assert np.array_equal(np.asarray(got.images[0]), np.asarray(want.images[0]))
    # /call_batch and /get_observation go through the same front
    entry = {"raw": base64.b64encode(scene.image.tobytes()).decode(), "size": list(scene.image.size)}
    batch = http.post("/call_batch", json={"calls": [{"tool": "segment", "arguments": {"bbox": [30, 40, 80, 85]},
                                                      "images": [entry]}] * 2})
    assert batch.status_code == 200 and [r["error"] for r in batch.json()["results"]] == [None, None]
    obs = http.post("/get_observation", json={
        "trajectory_ids": ["t1"], "actions": ['<tool_call>{"name": "segment", "arguments": {"bbox": [30, 40, 80, 85]}}'
                                              "</tool_call>"],
        "extra_fields": [{"images": [entry]}]})
    assert obs.status_code == 200 and "Segmented the box" in json.dumps(obs.json()["observations"])
    unknown = http.post("/call", json={"tool": "segmnt", "arguments": {}, "images": []})
    assert unknown.status_code == 404 and "Did you mean 'segment'" in unknown.json()["detail"]


def test_handles_reach_the_same_app_with_its_token_and_limits(served, scene):
    local = Toolbox.from_config({"segment": {"engine": "sam"}}, cache=False)
    box = by_handle()
    want, got = local.call(box_call(), [scene.image]).result, box.call(box_call(), [scene.image]).result
    assert got.ok and got.text == want.text and got.data == want.data
    zoom = box.call(ToolCall("image_zoom_in", {"bbox": [10, 10, 90, 80]}), [scene.image]).result
    assert zoom.ok and zoom.images[0].size[0] > 80
    # the replica checks the token itself: a handle caller without it is refused like an HTTP one
    from tool_backends.ray_serve_client import RayServeToolBackend

    with pytest.raises(ConfigError, match="401"):
        RayServeToolBackend(tools=["segment"], app=APP).specs()
    # the body limit and the per-request call limit are the plain server's, by handle too
    client = RayServeToolBackend(tools=["segment"], app=APP, token_env=TOKEN_ENV)
    status, body, _ = client.forward("/call", b'{"tool": "segment", "pad": "' + b"x" * (2 << 20) + b'"}')
    assert status == 413 and b"over the limit" in body
    five = [("segment", [scene.image], {"bbox": [30, 40, 80, 85], "image_index": 0, "coordinates": "pixel"},
             ToolContext())] * 5
    with pytest.raises(Exception, match="413"):
        client.call_many(five)
    assert [r.ok for r in client.call_many(five[:4])] == [True] * 4


def test_the_front_refuses_oversized_bodies_and_bad_tokens(served, http):
    assert http.post("/call", content=b"x" * (2 << 20)).status_code == 413
    wrong = httpx.post(f"http://127.0.0.1:{served.port}/call", json={"tool": "segment"},
                       headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401 and "wrong" not in wrong.text.replace("missing or wrong", "")


# ---- batching, single-flight, replicas ------------------------------------------------------------
def replica_stats() -> list[dict]:
    from tool_backends.ray_serve_deploy import replica_stats as stats

    return stats("segment", APP, calls=12)


def test_concurrent_distinct_calls_run_in_batches_with_each_calls_own_mask(served, scene):
    from tool_backends.engines.hf_sam import SamSegmenter

    images = [scene.image.resize((150 + 7 * i, 110 + 5 * i)) for i in range(16)]
    before = sum(s["batched_calls"] for s in replica_stats())
    box = by_handle()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda im: box.call(box_call(), [im]).result, images))
    stats = replica_stats()
    assert len(stats) == 2 and len({s["node_id"] for s in stats}) == 1
    assert sum(s["batched_calls"] for s in stats) - before == 16
    assert max(s["largest_batch"] for s in stats) > 1             # calls shared a forward
    alone = SamSegmenter()
    for im, r in zip(images, results):                           # ... and each got its own mask
        assert r.ok
        x0, y0, x1, y1 = r.data["prompt_box"]
        want = alone.segment(im, box=(x0, y0, x1, y1))
        assert np.array_equal(rle_to_mask(r.data["mask_rle"]), want)


def test_a_group_of_identical_calls_runs_at_most_once_per_replica(served, scene):
    image = scene.image.rotate(7)
    before = sum(s["computed"] for s in replica_stats())
    boxes = [by_handle() for _ in range(8)]                        # 8 env copies, 8 clients
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(lambda b: b.call(box_call(41, 33), [image]).result.text, boxes))
    assert len(set(texts)) == 1 and texts[0].startswith("Segmented")
    assert 1 <= sum(s["computed"] for s in replica_stats()) - before <= 2


@pytest.mark.slow
def test_a_replica_killed_under_load_loses_no_call(served, scene):
    images = [scene.image.resize((140 + i % 40, 100 + i // 40)) for i in range(120)]
    box = by_handle(retries=10, timeout_s=120)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(lambda im: box.call(box_call(), [im]).result, im) for im in images]
        deadline = time.monotonic() + 60
        while sum(f.done() for f in futures) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        victims = [a for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["name"].startswith(f"SERVE_REPLICA::{APP}#segment#")]
        assert len(victims) == 2
        ray.kill(ray.get_actor(victims[0]["name"], namespace=victims[0]["namespace"]), no_restart=True)
        done_at_kill = sum(f.done() for f in futures)
        results = [f.result() for f in futures]
    assert done_at_kill < len(images)                              # calls were still in flight
    assert [r.error for r in results] == [None] * len(images)
    assert all(r.text.startswith(("Segmented", "No structure")) for r in results)
