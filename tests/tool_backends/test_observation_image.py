"""The ``observation_image`` setting: the image a tool returns is sized and encoded for the policy,
and the env, ``/call`` and ``/get_observation`` give the policy the same pixels (and the same
bytes where bytes travel), against a real ``medvqa-tools serve`` on loopback."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image

from medvqa_env.errors import ConfigError
from medvqa_env.parser import ToolCall
from tool_backends import observation_image as oi
from tool_backends.base import ToolContext
from tool_backends.identity import describe_tools, tool_differences
from tool_backends.toolbox import Toolbox

JPEG_168 = {"max_side": 168, "format": "jpeg", "quality": 75}
ZOOM = {"bbox": [20, 10, 140, 110]}


def _scan() -> Image.Image:
    """A 256x256 textured image (JPEG must have something to lose)."""
    yy, xx = np.mgrid[:256, :256]
    arr = (128 + 60 * np.sin(xx / 7.0) * np.cos(yy / 11.0) + np.random.default_rng(0).integers(-20, 21, (256, 256)))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).convert("RGB")


def _zoom(config) -> Image.Image:
    box = Toolbox.from_config({"image_zoom_in": config}, cache=False)
    result = box.call(ToolCall("image_zoom_in", ZOOM), [_scan()], ToolContext()).result
    box.close()
    assert result.ok, result.text
    return result


def _url_bytes(url: str) -> tuple[str, bytes]:
    head, _, b64 = url.partition(",")
    return head, base64.b64decode(b64)


# ---- the setting ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value, message", [
    ({"max_sid": 168}, "Did you mean 'max_side'?"),
    ("jpge", "Did you mean 'jpeg'?"),
    ({"quality": 0}, "quality to be an int in 1..100, got 0"),
    ({"max_side": 2}, "max_side to be an int in 8..16384 or None, got 2"),
    (3.5, "got float 3.5"),
])
def test_a_bad_setting_is_a_config_error_that_says_what_came(value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")
                       .replace(".", r"\.")):
        oi.ObservationImage.parse(value)


def test_a_tool_given_a_bad_setting_refuses_to_build():
    with pytest.raises(ConfigError, match="observation_image format"):
        Toolbox.from_config({"image_zoom_in": {"backend": "local", "observation_image": "gif"}})


def test_no_setting_keeps_today_s_crop_and_png_bytes():
    """Without a setting the zoom is what it was: 336 px short side, a crop recipe, PNG at zlib 1."""
    result = _zoom("local")
    crop = result.images[0]
    assert crop.size == (403, 336) and result.data["image_recipe"] == "crop"
    head, data = _url_bytes(oi.data_url(crop))
    buf = io.BytesIO()
    crop.convert("RGB").save(buf, format="PNG", compress_level=1)
    assert head == "data:image/png;base64" and data == buf.getvalue()


def test_a_jpeg_setting_sizes_the_crop_and_the_policy_sees_the_decoded_jpeg():
    result = _zoom({"backend": "local", "observation_image": JPEG_168})
    crop = result.images[0]
    assert max(crop.size) == 168 and crop.size == (168, 140) and "enlarged to 168x140" in result.text
    assert "image_recipe" not in result.data  # a client's redraw would skip the codec: pixels travel
    head, data = _url_bytes(oi.data_url(crop))
    assert head == "data:image/jpeg;base64" and data[:3] == b"\xff\xd8\xff"
    decoded = Image.open(io.BytesIO(data)).convert("RGB")
    assert decoded.tobytes() == crop.tobytes()  # in-process pixels == what the wire's bytes decode to
    clean = _zoom({"backend": "local", "observation_image": {**JPEG_168, "format": "png"}}).images[0]
    assert clean.size == crop.size and clean.tobytes() != crop.tobytes()  # the JPEG really is lossy
    assert len(data) < len(oi.encoded(clean)[0])


def test_the_encoded_bytes_are_made_once(monkeypatch):
    calls = []
    real = oi.encode
    monkeypatch.setattr(oi, "encode", lambda *a, **k: calls.append(1) or real(*a, **k))
    crop = _zoom({"backend": "local", "observation_image": JPEG_168}).images[0]
    urls = {oi.data_url(crop) for _ in range(3)}
    assert len(urls) == 1 and len(calls) == 1 and not crop.drawn  # a wire needs the bytes, not the pixels
    data = base64.b64decode(urls.pop().split(",", 1)[1])
    assert crop.tobytes() == Image.open(io.BytesIO(data)).convert("RGB").tobytes() and len(calls) == 1


@pytest.mark.parametrize("fmt", ["webp", "png"])
def test_other_formats_round_trip(fmt):
    crop = _zoom({"backend": "local", "observation_image": {"max_side": 128, "format": fmt}}).images[0]
    head, data = _url_bytes(oi.data_url(crop))
    assert max(crop.size) == 128 and head == f"data:image/{fmt};base64"
    assert Image.open(io.BytesIO(data)).convert("RGB").tobytes() == crop.tobytes()


def test_an_exact_image_stays_lossless_and_full_size():
    """A mask overlay must stay exact: a JPEG setting neither shrinks nor compresses it."""
    overlay = _scan()
    out = oi.policy_image(overlay, oi.ObservationImage.parse(JPEG_168), exact=True)
    head, data = _url_bytes(oi.data_url(out))
    assert out.size == overlay.size and out.tobytes() == overlay.tobytes() and head == "data:image/png;base64"
    assert Image.open(io.BytesIO(data)).convert("RGB").tobytes() == overlay.tobytes()
    assert not hasattr(overlay, "_medvqa_observation_setting")  # the caller's image is not marked


def test_for_policy_follows_the_policy_s_image_side():
    assert oi.for_policy(448) == oi.ObservationImage(max_side=448, format="png")
    assert oi.for_policy(None) is oi.DEFAULT


def test_run_records_name_the_setting_and_a_changed_one_is_a_difference():
    old = describe_tools({"image_zoom_in": "local"})
    assert old["image_zoom_in"]["observation_image"] == {"max_side": None, "format": "png", "quality": 75}
    new = describe_tools({"image_zoom_in": {"backend": "local", "observation_image": JPEG_168}})
    assert new["image_zoom_in"]["observation_image"] == JPEG_168
    assert any("observation_image" in line and '"jpeg"' in line for line in tool_differences(old, new))
    older = {"image_zoom_in": {k: v for k, v in old["image_zoom_in"].items() if k != "observation_image"}}
    assert tool_differences(older, old) == []  # a record from before the setting: nothing to compare
    assert "observation_image" not in describe_tools({"segment": "classical"})["segment"]


# ---- the env and both wires agree ----------------------------------------------------------------
@pytest.fixture(scope="module", params=[JPEG_168, {"max_side": 168, "format": "png"}], ids=["jpeg", "png"])
def served(request, start_server):
    setting = request.param
    proc = start_server(["serve", "--tools", "image_zoom_in", "--tool-opt",
                         f"image_zoom_in.observation_image={json.dumps(setting)}"])
    return proc, setting


def test_in_process_call_and_get_observation_give_the_same_image(served):
    proc, setting = served
    local = _zoom({"backend": "local", "observation_image": setting}).images[0]
    local_bytes, local_mime = oi.encoded(local)
    # /call through the project's own client (raw transport, derived images as it defaults)
    remote = _zoom({"backend": "http", "url": proc.url, "transport": "raw"}).images[0]
    assert remote.size == local.size and remote.tobytes() == local.tobytes()
    # /get_observation, verl-tool's wire: the data URL carries the very bytes encoded in-process
    buf = io.BytesIO()
    _scan().save(buf, format="PNG")
    action = f'<tool_call>{{"name": "image_zoom_in", "arguments": {json.dumps(ZOOM)}}}</tool_call>'
    out = httpx.post(proc.url + "/get_observation", timeout=30, json={
        "trajectory_ids": ["t"], "actions": [action],
        "extra_fields": [{"images": ["data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()]}]}).json()
    head, data = _url_bytes(out["observations"][0]["image"][0])
    assert head == f"data:{local_mime};base64" and data == local_bytes
    assert Image.open(io.BytesIO(data)).convert("RGB").tobytes() == local.tobytes()


def test_the_env_shows_the_policy_the_same_pixels_and_renders():
    from medvqa_env.env import MedVQAEnv

    env = MedVQAEnv("embedded", tools={"image_zoom_in": {"observation_image": JPEG_168}}, render_mode="rgb_array")
    env.reset(seed=0)
    w, h = env.images[0].size
    turn = ('<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [%d, %d, %d, %d]}}</tool_call>'
            % (w // 8, h // 8, w // 2, h // 2))
    obs, _, _, _, info = env.step(turn)
    assert info["tool_calls"][0]["error"] is None and len(obs["images"]) == 1
    shown = obs["images"][0]
    _, data = _url_bytes(oi.data_url(env.images[-1]))
    assert max(shown.shape[:2]) == 168 and (np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) == shown).all()
    assert env.render().ndim == 3
    env.close()
