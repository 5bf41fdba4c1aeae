"""The router: one address for several real tool servers, dispatching by tool name."""

from __future__ import annotations

import httpx
import pytest

from medvqa_env.errors import ConfigError
from medvqa_env.parser import ToolCall
from tool_backends.base import ToolContext
from tool_backends.router import parse_upstreams
from tool_backends.toolbox import Toolbox
from tool_backends.wire import encode_image


@pytest.fixture(scope="module")
def stack(start_server):
    a = start_server(["serve", "--tools", "segment"], wait=False)
    b = start_server(["serve", "--tools", "ground,image_zoom_in"], wait=False)
    router = start_server(["router", "--upstream",
                           f"segment={a.url},ground={b.url},image_zoom_in={b.url}", "--timeout-s", "5"], wait=False)
    return {"segment": a.wait(), "ground": b.wait(), "router": router.wait()}


CALLS = [ToolCall("segment", {"bbox": [30, 40, 70, 80]}), ToolCall("ground", {"text": "bright"}),
         ToolCall("image_zoom_in", {"bbox": [0, 0, 40, 40]}), ToolCall("segment", {"point": [999, 1]})]


def test_router_results_equal_local_ones(stack, scene):
    names = ["segment", "ground", "image_zoom_in"]
    routed = Toolbox.from_config({n: stack["router"].url for n in names}, cache=False)
    local = Toolbox.from_config(names, cache=False)
    for call in CALLS:
        r, l = (box.call(call, [scene.image], ToolContext()).result for box in (routed, local))
        assert (r.text, r.data, r.error) == (l.text, l.data, l.error)
        assert [im.tobytes() for im in r.images] == [im.tobytes() for im in l.images]
    tools = httpx.get(stack["router"].url + "/tools").json()["tools"]
    assert sorted(t["function"]["name"] for t in tools) == sorted(names)
    routed.close(), local.close()


def test_router_get_observation_dispatches_each_call(stack, scene):
    turn = ('<tool_call>{"name": "segment", "arguments": {"bbox": [30, 40, 70, 80]}}</tool_call>'
            '<tool_call>{"name": "ground", "arguments": {"text": "bright"}}</tool_call>')
    out = httpx.post(stack["router"].url + "/get_observation", timeout=30,
                     json={"trajectory_ids": [7], "actions": [turn],
                           "extra_fields": [{"images": [encode_image(scene.image, "png")]}]}).json()
    obs = out["observations"][0]
    assert obs["obs"].startswith("[segment] Segmented") and "\n[ground] Found" in obs["obs"]
    assert len(obs["image"]) == 2 and out["valids"] == [True] and out["dones"] == [False]


def test_a_dead_upstream_fails_only_its_tools(stack, scene):
    routed = Toolbox.from_config({"segment": stack["router"].url, "ground": stack["router"].url}, cache=False)
    healthy = httpx.get(stack["router"].url + "/health", timeout=10)
    assert healthy.status_code == 200 and healthy.json()["status"] == "ok"
    stack["ground"].stop()
    # the router's /health reflects its upstreams: degraded (503) and which tools are gone
    health = httpx.get(stack["router"].url + "/health", timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "degraded"
    assert health.json()["unavailable_tools"] == ["ground", "image_zoom_in"]
    dead = routed.call(CALLS[1], [scene.image], ToolContext()).result
    assert not dead.ok and "ground" in dead.error and "502" in dead.error
    assert routed.call(CALLS[0], [scene.image], ToolContext()).result.ok
    routed.close()


def test_parse_upstreams_rejects_garbage():
    with pytest.raises(ConfigError, match="tool=http"):
        parse_upstreams("segment:7660")


def test_serve_without_tools_serves_every_tool(start_server):
    from tool_backends.registry import available_tools

    server = start_server(["serve", "--engine", "classify=oracle"])
    served = httpx.get(server.url + "/tools", timeout=10).json()["tools"]
    assert sorted(t["function"]["name"] for t in served) == available_tools()


def test_a_tool_named_twice_is_refused_with_exit_2(capsys):
    """``--upstream segment=A,segment=B`` used to keep only B, silently (issue 47)."""
    from tool_backends.cli import main

    with pytest.raises(ConfigError, match="names tool 'segment' twice"):
        parse_upstreams("segment=http://127.0.0.1:1,segment=http://127.0.0.1:2")
    assert main(["router", "--upstream", "segment=http://127.0.0.1:1,segment=http://127.0.0.1:2"]) == 2
    assert "names tool 'segment' twice" in capsys.readouterr().err


def test_an_upstream_going_down_and_coming_back_is_logged_once_each(caplog):
    """Issue 41: one log line when an upstream stops answering, one when it is back."""
    import logging
    import sys
    import threading
    import time
    from pathlib import Path

    import uvicorn

    sys.path.insert(0, str(Path(__file__).parent))
    from test_server_sharing import Served, SlowEcho

    from tool_backends.router import create_router_app
    from tool_backends.server import ServerSettings, create_app

    upstream = Served(create_app({"echo": SlowEcho(0.0)}, ServerSettings()))
    router = Served(create_router_app({"echo": upstream.url}, timeout_s=2.0, retries=0))
    call = {"tool": "echo", "images": []}
    caplog.set_level(logging.WARNING, logger="tool_backends.router")
    again = None
    try:
        assert httpx.post(router.url + "/call", json=call, timeout=10).status_code == 200
        upstream.close()
        assert [httpx.post(router.url + "/call", json=call, timeout=10).status_code for _ in range(3)] == [502] * 3
        assert httpx.get(router.url + "/health", timeout=10).status_code == 503
        down = [r.getMessage() for r in caplog.records if "is down" in r.getMessage()]
        assert len(down) == 1 and upstream.url in down[0]
        app = create_app({"echo": SlowEcho(0.0)}, ServerSettings())  # back, on the same port
        again = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=upstream.port, log_level="warning"))
        threading.Thread(target=again.run, daemon=True).start()
        deadline = time.monotonic() + 20
        while not again.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [httpx.post(router.url + "/call", json=call, timeout=10).status_code for _ in range(2)] == [200] * 2
        back = [r.getMessage() for r in caplog.records if "is back" in r.getMessage()]
        assert len(back) == 1 and upstream.url in back[0]
    finally:
        router.close()
        if again is not None:
            again.should_exit = True
