"""The tool server's protocol and defences, against a real server with a token on loopback."""

from __future__ import annotations

import base64
import io
import json
import pickle

import httpx
import numpy as np
import pytest
from PIL import Image

from medvqa_env.errors import ConfigError
from medvqa_env.parser import ToolCall
from tool_backends.base import ToolContext
from tool_backends.cli import main as cli_main
from tool_backends.http_client import HTTPToolBackend
from tool_backends.registry import build_tool
from tool_backends.server import ServerSettings, check_settings
from tool_backends.toolbox import Toolbox
from tool_backends.wire import encode_image

TOKEN = "s3cret-test-token"


@pytest.fixture(scope="module")
def server(start_server, scene, tmp_path_factory):
    shared = tmp_path_factory.mktemp("shared")
    proc = start_server(["serve", "--tools", "segment,ground,image_zoom_in,hires_render", "--engine", "segment=oracle",
                         "--image-root", str(scene.root), "--image-root", str(shared), "--token-env", "TEST_TOOLS_TOKEN",
                         "--max-body-mb", "1", "--max-concurrency", "2"], env={"TEST_TOOLS_TOKEN": TOKEN})
    proc.shared = shared
    return proc


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        yield c


@pytest.fixture()
def token_env(monkeypatch):
    monkeypatch.setenv("TEST_TOOLS_TOKEN", TOKEN)
    return "TEST_TOOLS_TOKEN"


def body_for(scene, tool="segment", arguments=None, **extra):
    return {"tool": tool, "arguments": arguments if arguments is not None else {"bbox": [30, 40, 70, 80]},
            "images": [encode_image(scene.image, "png")], **extra}


def test_health_is_open_and_tools_need_the_token(server, http):
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["tools"] == ["ground", "hires_render", "image_zoom_in", "segment"]
    assert httpx.get(server.url + "/tools").status_code == 401
    wrong = httpx.get(server.url + "/tools", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and TOKEN not in wrong.text
    names = [t["function"]["name"] for t in http.get("/tools").json()["tools"]]
    assert sorted(names) == ["ground", "hires_render", "image_zoom_in", "segment"]


def test_call_returns_the_tool_result(http, scene):
    r = http.post("/call", json=body_for(scene, context=ToolContext(annotations=scene.record.annotations).to_dict()))
    assert r.status_code == 200
    result = r.json()["result"]
    assert result["error"] is None and result["data"]["area_px"] == int(scene.disc_mask.sum())
    assert result["data"]["bbox"] == [36, 46, 65, 75]  # the annotated disc mask (mask under the image root)
    assert Image.open(io.BytesIO(base64.b64decode(result["images"][0]["png"]))).size == scene.image.size


@pytest.mark.parametrize("mutate,status,message", [
    (lambda b: "not json", 400, "JSON"),
    (lambda b: {**b, "tool": "zoom"}, 404, "Did you mean 'image_zoom_in'"),
    (lambda b: {**b, "tool": 3}, 400, "'tool' to be a string"),
    (lambda b: {**b, "images": [{"png": "%%%"}]}, 400, "base64"),
    (lambda b: {**b, "images": [{"raw": "AAAA", "size": [10, 10]}]}, 400, "needs 300 bytes"),
    (lambda b: {**b, "images": [{"gif": "x"}]}, 400, "'png', 'raw', 'path' or 'ref'"),
    (lambda b: {**b, "images": [{"path": "/etc/passwd"}]}, 403, "not under this server's image roots"),
    (lambda b: {**b, "context": []}, 400, "'context' to be an object"),
])
def test_malformed_requests_get_4xx_with_a_message(http, scene, mutate, status, message):
    payload = mutate(body_for(scene))
    r = http.post("/call", content=payload if isinstance(payload, str) else json.dumps(payload),
                  headers={"content-type": "application/json"})
    assert r.status_code == status and message in r.json()["detail"]


def test_bad_arguments_are_a_200_with_a_readable_error(http, scene):
    r = http.post("/call", json=body_for(scene, arguments={"bbox": [1, 2]}))
    assert r.status_code == 200 and r.json()["result"]["error"] == "Argument 'bbox' needs at least 4 items, got 2."


def test_oversized_bodies_are_refused(http):
    r = http.post("/call", content=b"{" + b" " * (2 * 1024 * 1024) + b"}", headers={"content-type": "application/json"})
    assert r.status_code == 413 and "over the limit" in r.json()["detail"]


def test_annotation_masks_outside_the_roots_are_never_opened(http, scene, tmp_path):
    from medvqa_env.records import Annotations, Mask

    outside = tmp_path / "mask.png"
    Image.fromarray(scene.disc_mask.astype("uint8") * 255).save(outside)
    ctx = ToolContext(annotations=Annotations(masks=(Mask("nodule", str(outside)),)))
    r = http.post("/call", json=body_for(scene, context=ctx.to_dict())).json()["result"]
    assert r["data"]["area_px"] == 0 and "No structure found" in r["text"]


def test_path_transport_reads_only_under_the_roots(server, token_env, scene):
    client = HTTPToolBackend(["segment"], url=server.url, token_env=token_env, transport="path",
                             shared_dir=str(server.shared), optimistic_refs=False)  # upload even if held
    ctx = ToolContext(annotations=scene.record.annotations)
    result = client.call("segment", [scene.image], {"bbox": [30, 40, 70, 80]}, ctx)
    assert result.data["bbox"] == [36, 46, 65, 75] and len(list(server.shared.iterdir())) == 1
    client.close()


def test_get_observation_speaks_verl_tool(http, scene):
    image = encode_image(scene.image, "png")
    turn = ('<think>look</think><tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 40, 40]}}'
            '</tool_call>')
    payload = {"trajectory_ids": ["a", "b", "c", "d"],
               "actions": [turn, "The answer is \\boxed{yes}", turn,
                           '<tool_call>{"name": "zoom", "arguments": {}}</tool_call>'],
               "finish": [False, False, True, False],
               "extra_fields": [{"images": [image]}, {}, {"images": [image]}, {"images": [image]}]}
    out = http.post("/get_observation", json=payload).json()
    assert out["dones"] == [False, False, True, False] and out["valids"] == [True, False, False, False]
    first = out["observations"][0]
    assert first["obs"].startswith("[image_zoom_in] Zoomed into region") and first["image"][0].startswith("data:image/png")
    assert first["obs"].endswith("New image: image 1.")
    assert out["observations"][1] == "" and "Unknown tool 'zoom'" in out["observations"][3]
    bad = http.post("/get_observation", json={"actions": ["x"], "finish": [False, True]})
    assert bad.status_code == 400


def test_a_group_s_identical_get_observation_turns_step_once_on_the_server(server, http, scene):
    """The server wires ObservationShare in: 8 concurrent identical first turns (one upload each, as
    verl-tool's workers send them) step once; the others get the same observation bytes."""
    from concurrent.futures import ThreadPoolExecutor

    from tool_backends.trajectories import data_url

    image = data_url(scene.image)
    turn = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [5, 5, 45, 45]}}</tool_call>'
    before = httpx.get(server.url + "/health").json()

    def post(i):
        return http.post("/get_observation", json={"trajectory_ids": [f"group-{i}"], "actions": [turn],
                                                   "extra_fields": [{"images": [image]}]}).json()

    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(post, range(8)))
    after = httpx.get(server.url + "/health").json()
    assert all(o["valids"] == [True] for o in outs)
    assert len({json.dumps(o["observations"]) for o in outs}) == 1  # the same bytes for every copy
    assert after["observations_shared"] - before["observations_shared"] == 7
    assert after["threads"]["threads"] >= 1  # what `serve` set at start (tool_backends.threads)


def test_get_observation_keeps_each_trajectory_s_images(http, scene):
    """verl-tool style: images as data URLs or paths; a later turn can use an earlier tool's crop."""
    from tool_backends.trajectories import data_url

    zoom = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [30, 40, 70, 80]}}</tool_call>'
    seg = '<tool_call>{"name": "segment", "arguments": {"point": [10, 10], "image_index": 1}}</tool_call>'
    first = http.post("/get_observation", json={"trajectory_ids": ["t1", "t2"], "actions": [zoom, zoom],
                                                "extra_fields": [{"images": [data_url(scene.image)]},
                                                                 {"images": [str(scene.root / "scan.png")]}]}).json()
    assert first["valids"] == [True, True]
    second = http.post("/get_observation", json={"trajectory_ids": ["t1"], "actions": [seg], "extra_fields": [{}]}).json()
    assert second["valids"] == [True] and "point [10, 10] of image 1" in second["observations"][0]  # oracle: no mask
    http.post("/get_observation", json={"trajectory_ids": ["t1"], "actions": [""], "finish": [True]})
    gone = http.post("/get_observation", json={"trajectory_ids": ["t1"], "actions": [seg], "extra_fields": [{}]}).json()
    assert "no image in this episode" in gone["observations"][0] and gone["valids"] == [False]


def test_batch_calls_and_pickled_clients(server, token_env, scene):
    client = HTTPToolBackend(None, url=server.url, token_env=token_env, transport="raw")
    ctx = ToolContext()
    results = client.call_many([("image_zoom_in", [scene.image], {"bbox": [0, 0, 50, 50]}, ctx),
                                ("ground", [scene.image], {"text": ""}, ctx)])
    assert results[0].ok and results[0].images and "non-empty" in results[1].error
    blob = pickle.dumps(client)
    assert TOKEN.encode() not in blob and b"httpx" not in blob
    copy = pickle.loads(blob)
    assert copy.call("image_zoom_in", [scene.image], {"bbox": [0, 0, 50, 50]}, ctx).text == results[0].text
    client.close(), copy.close()


def test_remote_toolbox_with_token_from_config(server, token_env, scene):
    box = Toolbox.from_config({"segment": {"url": server.url, "token_env": token_env}}, cache=False)
    rec = box.call(ToolCall("segment", {"point": [50, 60]}), [scene.image], ToolContext())
    assert rec.result.ok and rec.result.data["area_px"] == 0  # oracle without annotations finds nothing
    assert "segment" in box.names
    box.close()


def test_settings_refuse_an_open_bind_without_a_token(monkeypatch, capsys):
    with pytest.raises(ConfigError, match="without a token"):
        check_settings(ServerSettings(host="0.0.0.0"))
    check_settings(ServerSettings(host="0.0.0.0", token="t"))
    assert cli_main(["serve", "--tools", "segment", "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "without a token" in capsys.readouterr().err
    monkeypatch.delenv("EMPTY_TOKEN_VAR", raising=False)
    with pytest.raises(ConfigError, match="EMPTY_TOKEN_VAR"):
        HTTPToolBackend(["segment"], url="http://127.0.0.1:1", token_env="EMPTY_TOKEN_VAR")


def test_the_server_cache_serves_a_group_across_clients(server, token_env, scene):
    before = httpx.get(server.url + "/health").json()["cache_hits"]
    clients = [HTTPToolBackend(["image_zoom_in"], url=server.url, token_env=token_env) for _ in range(8)]
    results = [c.call("image_zoom_in", [scene.image], {"bbox": [5, 5, 60, 61]}, ToolContext(record_id="g"))
               for c in clients]
    assert httpx.get(server.url + "/health").json()["cache_hits"] - before == 7
    assert len({r.text for r in results}) == 1 and all(r.images[0].tobytes() == results[0].images[0].tobytes()
                                                       for r in results)
    for c in clients:
        c.close()


def test_images_are_sent_once_then_referred_to_by_digest(server, http, token_env, scene):
    from tool_backends.base import image_digest

    client = HTTPToolBackend(["image_zoom_in"], url=server.url, token_env=token_env, transport="raw",
                             optimistic_refs=False)
    first = client.call("image_zoom_in", [scene.image], {"bbox": [0, 0, 30, 30]}, ToolContext())
    digest = image_digest(scene.image)
    assert digest in client._sent
    ref = http.post("/call", json={"tool": "image_zoom_in", "arguments": {"bbox": [0, 0, 30, 30]},
                                   "images": [{"ref": digest}]})
    assert ref.status_code == 200 and ref.json()["result"]["text"] == first.text
    unknown = http.post("/call", json={"tool": "image_zoom_in", "arguments": {}, "images": [{"ref": "f" * 32}]})
    assert unknown.status_code == 409 and "send the image itself" in unknown.json()["detail"]
    lying = http.post("/call", json={"tool": "image_zoom_in", "arguments": {},
                                     "images": [{**encode_image(scene.image, "png"), "digest": "0" * 32}]})
    assert lying.status_code == 400 and "does not match" in lying.json()["detail"]
    client.close()


def test_a_server_that_forgot_an_image_gets_it_again(start_server, scene, tmp_path):
    forgetful = start_server(["serve", "--tools", "image_zoom_in", "--image-store-mb", "0",
                              "--result-dir", str(tmp_path), "--cache-size", "0"])
    client = HTTPToolBackend(["image_zoom_in"], url=forgetful.url, transport="raw", result_format="path",
                             shared_dir=str(tmp_path), derived_images=False)  # the crop as a file, not a recipe
    results = [client.call("image_zoom_in", [scene.image], {"bbox": [0, 0, 30, 30]}, ToolContext()) for _ in range(2)]
    assert results[0].ok and results[1].text == results[0].text  # the second call got a 409 and resent
    assert results[1].images[0].tobytes() == results[0].images[0].tobytes() and list(tmp_path.glob("*.bmp"))
    client.close()


def test_derived_result_images_travel_as_recipes(http, server, token_env, scene):
    ctx = ToolContext(annotations=scene.record.annotations).to_dict()
    r = http.post("/call", json=body_for(scene, context=ctx, derived_ok=True)).json()["result"]
    assert r["images"] == [{"derived": "mask_overlay"}] and r["data"]["image_recipe"] == "mask_overlay"
    client = HTTPToolBackend(["segment"], url=server.url, token_env=token_env)
    plain = HTTPToolBackend(["segment"], url=server.url, token_env=token_env, derived_images=False)
    args = {"bbox": [30, 40, 70, 80]}
    a, b = (c.call("segment", [scene.image], args, ToolContext(annotations=scene.record.annotations))
            for c in (client, plain))
    assert not a.images[0].drawn and a.images[0].size == scene.image.size  # redrawn only when read
    assert a.images[0].tobytes() == b.images[0].tobytes() and a.data == b.data and a.images[0].drawn
    again = client.call("segment", [scene.image], args, ToolContext(annotations=scene.record.annotations))
    copy = pickle.loads(pickle.dumps(again.images[0]))  # Ray ships observations: a pickle holds the pixels
    assert copy.tobytes() == b.images[0].tobytes() and np.array_equal(np.asarray(again.images[0]), np.asarray(b.images[0]))
    client.close(), plain.close()


def test_a_derived_image_with_a_mask_of_the_wrong_size_is_refused(scene):
    from tool_backends.wire import WireError, result_from_wire

    payload = {"text": "ok", "data": {"image_index": 0, "mask_rle": {"size": [3, 3], "counts": [9]}},
               "images": [{"derived": "mask_overlay"}]}
    with pytest.raises(WireError, match="mask of the source image's size"):
        result_from_wire(payload, images_sent=[scene.image])


def test_raw_result_images_follow_the_json_as_bytes_for_clients_that_accept_them(http, scene):
    from tool_backends.wire import FRAMES, result_from_wire, unpack_frames

    body = body_for(scene, "image_zoom_in", {"bbox": [5, 5, 60, 61]}, image_format="raw")
    plain = http.post("/call", json=body)
    framed = http.post("/call", json=body, headers={"accept": f"{FRAMES}, application/json"})
    assert plain.headers["content-type"].startswith("application/json")
    assert framed.headers["content-type"].startswith(FRAMES) and len(framed.content) < len(plain.content)
    payload, frames = unpack_frames(framed.content)
    entry = payload["result"]["images"][0]
    assert entry["bytes_at"][1] == len(frames) == entry["size"][0] * entry["size"][1] * 3
    a = result_from_wire(plain.json()["result"])
    b = result_from_wire(payload["result"], frames=frames)
    assert a.text == b.text and a.images[0].tobytes() == b.images[0].tobytes()
    batch = http.post("/call_batch", json={"calls": [body, body]}, headers={"accept": FRAMES})
    payload, frames = unpack_frames(batch.content)
    offsets = [r["images"][0]["bytes_at"][0] for r in payload["results"]]
    assert offsets == [0, len(frames) // 2]


@pytest.mark.parametrize("entry,message", [
    ({"bytes_at": [0, 12], "size": [2, 2]}, "does not fit"),     # bytes beyond the response
    ({"bytes_at": [0, 11], "size": [2, 2]}, "does not fit"),     # length is not w*h*3
    ({"bytes_at": [-1, 12], "size": [2, 2]}, "expected 'bytes_at'"),
    ({"bytes_at": [0, 12]}, "expected 'bytes_at'"),
])
def test_a_framed_image_that_does_not_fit_its_response_is_refused(entry, message):
    from tool_backends.wire import WireError, result_from_wire

    with pytest.raises(WireError, match=message):
        result_from_wire({"text": "ok", "images": [entry]}, frames=memoryview(b"\0" * 6))
    with pytest.raises(WireError, match="did not carry"):
        result_from_wire({"text": "ok", "images": [{"bytes_at": [0, 12], "size": [2, 2]}]})


def test_a_kept_connection_the_server_closed_is_replaced_without_a_retry():
    """A keep-alive connection the server dropped while idle is not a failure of the call, even
    with retries=0: the request goes out again on a fresh connection."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tool_backends.http_client import HTTPToolBackend

    class DropsIdleConnections(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, but the socket is closed after each answer

        def do_GET(self):
            body = json.dumps({"tools": [{"function": {"name": "t", "parameters": {}}}]}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), DropsIdleConnections) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        client = HTTPToolBackend(["t"], url=f"http://127.0.0.1:{httpd.server_address[1]}", retries=0)
        for _ in range(3):
            client._specs = None
            assert [s.name for s in client.specs()] == ["t"]
        client.close()
        httpd.shutdown()


def test_a_remote_zoom_travels_as_a_crop_recipe_with_the_same_pixels(server, token_env, scene):
    """The zoom's enlarged crop is a function of the image the client sent and the result's data:
    the server sends the recipe, the client redraws identical pixels when they are first read."""
    client = HTTPToolBackend(["image_zoom_in"], url=server.url, token_env=token_env)
    plain = HTTPToolBackend(["image_zoom_in"], url=server.url, token_env=token_env, derived_images=False)
    args = {"bbox": [5, 7, 40, 61]}
    a, b = (c.call("image_zoom_in", [scene.image], args, ToolContext()) for c in (client, plain))
    assert a.ok and not a.images[0].drawn and a.images[0].size == b.images[0].size == tuple(a.data["size"])
    assert a.images[0].tobytes() == b.images[0].tobytes() and a.text == b.text
    client.close(), plain.close()


def test_a_remote_hires_render_travels_as_a_recipe_with_the_same_pixels(server, token_env, scene):
    """The classical re-render is a pure function of the source and its options: the server sends
    the recipe (with the engine's options), the client redraws the same pixels as an upload would."""
    client = HTTPToolBackend(["hires_render"], url=server.url, token_env=token_env)
    plain = HTTPToolBackend(["hires_render"], url=server.url, token_env=token_env, derived_images=False)
    args = {"bbox": [5, 7, 40, 61], "scale": 3}
    a, b = (c.call("hires_render", [scene.image], args, ToolContext()) for c in (client, plain))
    assert a.ok and a.data["image_recipe"] == "upscale" and a.data["render"]["percent"] == 120
    assert not a.images[0].drawn and a.images[0].size == b.images[0].size == tuple(a.data["size"])
    assert a.images[0].tobytes() == b.images[0].tobytes() and a.text == b.text
    local = build_tool("hires_render")([scene.image], args)
    assert local.images[0].tobytes() == a.images[0].tobytes()
    client.close(), plain.close()


@pytest.mark.parametrize("tool, args", [("image_zoom_in", {"bbox": [5, 7, 40, 61]}),
                                        ("hires_render", {"bbox": [5, 7, 40, 61]}),
                                        ("ground", {"text": "bright lesion"})])
def test_a_server_never_draws_an_image_it_sends_as_a_recipe(scene, tool, args):
    """The tool's image is lazy: encoding the result as a recipe leaves it undrawn, so the server
    spends no time on pixels the client will draw itself (or never read)."""
    from tool_backends.wire import result_to_wire

    result = build_tool(tool)([scene.image], args)
    assert result.ok and result.images and not result.images[0].drawn, result.text
    wire = result_to_wire(result, "raw", derived_ok=True, parts=[])
    assert wire["images"] == [{"derived": result.data["image_recipe"]}] and not result.images[0].drawn
    result_to_wire(result, "raw", derived_ok=False, parts=[])  # a client that wants pixels gets them drawn
    assert result.images[0].drawn


@pytest.mark.parametrize("render", [None, {"radius": 2.0}, {"radius": 2.0, "percent": 120, "threshold": 2,
                                                               "autocontrast": float("inf")}])
def test_an_upscale_recipe_with_bad_options_is_refused(scene, render):
    from tool_backends.wire import WireError, result_from_wire

    data = {"image_index": 0, "region": [0, 0, 5, 5], "size": [10, 10], "render": render}
    with pytest.raises(WireError, match="render options"):
        result_from_wire({"text": "ok", "data": data, "images": [{"derived": "upscale"}]}, images_sent=[scene.image])


@pytest.mark.parametrize("data, match", [({"region": [0, 0, 10**6, 5], "size": [4, 4]}, "inside the source"),
                                         ({"region": [0, 0, 5, 5], "size": [0, 4]}, "positive size"),
                                         ({"region": "0,0,5,5", "size": [4, 4]}, "inside the source")])
def test_a_crop_recipe_outside_the_image_is_refused(scene, data, match):
    from tool_backends.wire import WireError, result_from_wire

    payload = {"text": "ok", "data": {"image_index": 0, **data}, "images": [{"derived": "crop"}]}
    with pytest.raises(WireError, match=match):
        result_from_wire(payload, images_sent=[scene.image])
