"""``medvqa-tools mcp``: the tools through the ``mcp`` SDK's own client, over stdio and over
streamable HTTP on loopback (real subprocesses), each tool's result compared with the same tool
run in this process: the text, the structured data and the images pixel for pixel."""

from __future__ import annotations

import base64
import io

import anyio
import gymnasium as gym
import httpx
import numpy as np
import pytest
from PIL import Image

pytest.importorskip("mcp")

import medvqa_env  # noqa: F401,E402  (registers MedVQA-v0)
from mcp import Client, StdioServerParameters, stdio_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from integration_helpers import Served, free_port, subprocess_env  # noqa: E402
from tool_backends.base import ToolContext  # noqa: E402
from tool_backends.mcp_server import MCPTools, from_mcp, input_schema, jsonable  # noqa: E402
from tool_backends.registry import build_tool  # noqa: E402
from tool_backends.server import ServerSettings  # noqa: E402
from tool_backends.toolbox import LocalBackend  # noqa: E402

ENGINES = {"segment": "classical", "ground": "oracle", "classify": "oracle", "hires_render": "classical"}
TOOLS = ["image_zoom_in", *ENGINES]
CLI = ["-m", "tool_backends.cli", "mcp", "--tools", ",".join(TOOLS),
       "--engine", ",".join(f"{k}={v}" for k, v in ENGINES.items())]
CALLS = [  # one call per tool, on the embedded default's record 1 (a CT phantom, 256 x 256)
    ("image_zoom_in", {"bbox": [40, 60, 140, 160]}),
    ("segment", {"point": [90, 120]}),
    ("ground", {"text": "liver"}),
    ("classify", {"labels": ["CT", "MRI", "X-ray"]}),
    ("hires_render", {"bbox": [40, 60, 140, 160]}),
]


@pytest.fixture(scope="module")
def episode():
    """The record's image as the env shows it, its tool context, and that image as a data URL."""
    env = gym.make("MedVQA-v0", tools=[]).unwrapped
    env.reset(seed=0, options={"index": 1})
    r = env.record
    context = ToolContext(record_id=r.id, dataset=r.dataset, annotations=env.annotations, question=r.question)
    buf = io.BytesIO()
    env.images[0].save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return env.images[0], context, url


@pytest.fixture(scope="module")
def local_tools():
    return {name: build_tool(name, **({"engine": ENGINES[name]} if name in ENGINES else {})) for name in TOOLS}


def mcp_arguments(arguments, url, context):
    context = {"record_id": context.record_id, "dataset": context.dataset, "question": context.question,
               "annotations": context.annotations.to_dict()}
    return {**arguments, "images": [url], "context": context}


async def call_every_tool(client: Client, url: str, context: ToolContext):
    listed = (await client.list_tools()).tools
    results = {name: await client.call_tool(name, mcp_arguments(args, url, context)) for name, args in CALLS}
    return listed, results


def assert_same_as_in_process(listed, results, episode, local_tools):
    image, context, _ = episode
    assert {t.name: t.input_schema for t in listed} == {n: input_schema(t.spec.parameters) for n, t in local_tools.items()}
    for name, arguments in CALLS:
        got = results[name]
        want = local_tools[name]([image], arguments, context)
        assert want.ok and not got.is_error, (name, got.content[0].text)
        images = [b for b in got.content if b.type == "image"]
        assert [b.mime_type for b in images] == ["image/png"] * len(want.images), name
        assert got.content[0].text == want.text, name
        assert got.structured_content == jsonable(want.data), name
        decoded = from_mcp(got)
        assert len(decoded.images) == len(want.images) >= (1 if name in ("image_zoom_in", "segment", "hires_render") else 0)
        for a, b in zip(decoded.images, want.images):  # pixel equality across the boundary
            assert a.size == b.size and np.array_equal(np.asarray(a), np.asarray(b.convert("RGB"))), name
    assert results["classify"].structured_content["scores"]  # probabilities
    assert results["segment"].structured_content["area_px"] > 0  # areas
    assert results["ground"].structured_content["boxes"]  # boxes


@pytest.mark.timeout(120)
def test_every_tool_over_stdio_matches_the_in_process_tool(episode, local_tools):
    _, context, url = episode
    params = StdioServerParameters(command=__import__("sys").executable, args=CLI, env=subprocess_env(),
                                   cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))

    async def main():
        async with Client(stdio_client(params)) as client:  # the SDK's stdio transport (mcp 2.0 and 2.3)
            return await call_every_tool(client, url, context)

    listed, results = anyio.run(main)
    assert_same_as_in_process(listed, results, episode, local_tools)


@pytest.mark.timeout(120)
def test_every_tool_over_streamable_http_with_a_token(episode, local_tools):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    _, context, url = episode
    port = free_port()
    server = Served([*CLI, "--transport", "http", "--port", str(port), "--token-env", "MCP_TEST_TOKEN"], port,
                    env=subprocess_env(MCP_TEST_TOKEN="s3cret-token")).wait()
    endpoint = f"http://127.0.0.1:{port}/mcp"
    try:
        async def main():
            http = httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret-token"}, timeout=60)
            async with http, Client(streamable_http_client(endpoint, http_client=http)) as client:
                return await call_every_tool(client, url, context)

        listed, results = anyio.run(main)
        assert_same_as_in_process(listed, results, episode, local_tools)
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        for headers in ({}, {"Authorization": "Bearer wrong"}):  # the HTTP tool server's meaning of a token
            r = httpx.post(endpoint, json=hello, headers={**headers, "Accept": "application/json, text/event-stream"})
            assert r.status_code == 401 and r.json() == {"detail": "missing or wrong bearer token"}
            assert "s3cret" not in r.text
    finally:
        server.stop()


def test_streamable_http_takes_the_tool_server_s_request_gate():
    """Without a token, the MCP HTTP app refuses what the HTTP tool server refuses, before the body:
    a non-loopback Host or Origin (DNS rebinding, a web page) and a body that is not JSON."""
    tools = MCPTools({"image_zoom_in": LocalBackend([build_tool("image_zoom_in")])}, ServerSettings())
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}

    async def main():
        transport = httpx.ASGITransport(app=tools.http_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return [await c.post("/mcp", json=hello, headers={"Host": "evil.example"}),
                    await c.post("/mcp", json=hello, headers={"Origin": "http://evil.example"}),
                    await c.post("/mcp", content=b"{}", headers={"content-type": "text/plain"})]

    host, origin, media = anyio.run(main)
    assert (host.status_code, origin.status_code, media.status_code) == (403, 403, 415)
    assert "not a loopback name" in host.json()["detail"] and "application/json" in media.json()["detail"]


def test_bad_input_is_a_result_the_model_can_read_and_limits_hold(episode):
    image, _, url = episode
    backend = LocalBackend([build_tool("image_zoom_in")])
    tools = MCPTools({"image_zoom_in": backend}, ServerSettings(max_pixels=100 * 100))
    tiny = io.BytesIO()
    image.crop((0, 0, 50, 50)).save(tiny, format="PNG")
    tiny_url = "data:image/png;base64," + base64.b64encode(tiny.getvalue()).decode()

    async def main():
        async with Client(tools.server) as client:
            out = {
                "bad_bbox": await client.call_tool("image_zoom_in", {"bbox": [1, 2], "images": [tiny_url]}),
                "not_base64": await client.call_tool("image_zoom_in", {"bbox": [0, 0, 9, 9],
                                                                       "images": ["data:image/png;base64,@@@"]}),
                "outside_roots": await client.call_tool("image_zoom_in", {"bbox": [0, 0, 9, 9], "images": ["/etc/passwd"]}),
                "too_big": await client.call_tool("image_zoom_in", {"bbox": [0, 0, 9, 9], "images": [url]}),
                "no_image": await client.call_tool("image_zoom_in", {"bbox": [0, 0, 9, 9], "images": []}),
                "ok": await client.call_tool("image_zoom_in", {"bbox": [0, 0, 20, 20], "images": [tiny_url]}),
            }
            with pytest.raises(MCPError, match="Unknown tool 'zoom'.*Did you mean 'image_zoom_in'"):
                await client.call_tool("zoom", {"images": [tiny_url]})
            return out

    out = anyio.run(main)
    text = {k: r.content[0].text for k, r in out.items()}
    assert all(out[k].is_error for k in out if k != "ok") and not out["ok"].is_error
    assert "needs at least 4 items" in text["bad_bbox"]
    assert "not valid base64" in text["not_base64"]
    assert "not under this server's image roots" in text["outside_roots"]
    assert "65536 pixels" in text["too_big"] or "over the limit" in text["too_big"], text["too_big"]
    assert "no image" in text["no_image"].lower() or "not sent" in text["no_image"], text["no_image"]
    assert out["bad_bbox"].structured_content["error"]
