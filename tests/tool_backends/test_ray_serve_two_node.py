"""A tool's Ray Serve replica on the other node of a real two-node Ray cluster on loopback (the
cluster of ``tests/medvqa_env/test_two_node_ray.py``: ``ray start --head`` plus a second ``ray
start --address``, each with its own resource label). The replica is placed on node b by its
``resources``; an env copy in a Ray task on node a reaches it by handle (the ``ray_serve`` tool
config) and gets the answer the tool gives in-process; the HTTP front on the head answers too."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "medvqa-tools-2node"


def _cluster_module():
    """The loopback cluster the env pool's two-node test starts (one way to start it)."""
    spec = importlib.util.spec_from_file_location("_two_node_ray", REPO / "tests" / "medvqa_env" / "test_two_node_ray.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cluster():
    module = _cluster_module()
    if ray.is_initialized():
        ray.shutdown()
    c = module.LoopbackCluster()
    try:
        c.start()
        env_vars = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
        module.token_auth_driver()
        ray.init(address=c.address, _node_ip_address="127.0.0.1", log_to_driver=False,
                 runtime_env={"env_vars": env_vars})
        c.wait_for_both()
        yield c
    finally:
        try:
            if ray.is_initialized():
                try:
                    serve.shutdown()
                finally:
                    ray.shutdown()
        finally:
            c.stop()
    assert not c.leftovers(), "ray processes outlived the test cluster"


def _node_of(resource: str) -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(resource))


@ray.remote(num_cpus=0.1, resources={"node_a": 0.01})
def _env_copy_on_node_a(image_bytes: bytes, size) -> tuple[str, str]:
    """What an env copy on a rollout worker does: build its tools from the config, call one."""
    from PIL import Image

    from medvqa_env.parser import ToolCall
    from tool_backends.toolbox import Toolbox

    box = Toolbox.from_config({"segment": {"backend": "ray_serve", "app": APP}}, cache=False)
    image = Image.frombytes("RGB", size, image_bytes)
    result = box.call(ToolCall("segment", {"bbox": [30, 40, 80, 85]}), [image]).result
    return ray.get_runtime_context().get_node_id(), result.text


def test_a_replica_on_the_other_node_answers_env_copies_by_handle(cluster, scene):
    import httpx

    from medvqa_env.parser import ToolCall
    from tool_backends.ray_serve import load_serve_config
    from tool_backends.ray_serve_deploy import deploy, replica_stats
    from tool_backends.toolbox import Toolbox

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    deploy(load_serve_config({"tools": {"segment": {"engine": "classical",
                                                    "ray": {"num_cpus": 0.25, "resources": {"node_b": 0.01}}}},
                              "app": APP, "port": port}))
    node_a, node_b = _node_of("node_a"), _node_of("node_b")
    assert node_a != node_b
    assert {s["node_id"] for s in replica_stats("segment", APP, 4)} == {node_b}   # placed by its resources
    call = ToolCall("segment", {"bbox": [30, 40, 80, 85]})
    want = Toolbox.from_config({"segment": "classical"}, cache=False).call(call, [scene.image]).result.text
    where, text = ray.get(_env_copy_on_node_a.remote(scene.image.tobytes(), scene.image.size), timeout=120)
    assert where == node_a and text == want and text.startswith("Segmented")
    from tool_backends.http_client import HTTPToolBackend

    client = HTTPToolBackend(tools=["segment"], url=f"http://127.0.0.1:{port}")
    over_http = Toolbox({"segment": client})
    assert over_http.call(call, [scene.image]).result.text == want
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["status"] == "ok"
    serve.delete(APP)
