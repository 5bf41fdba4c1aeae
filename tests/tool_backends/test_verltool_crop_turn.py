"""verl-tool's own crop turn on our ``/get_observation``: a rollout worker trained against verl-tool's
``pixel_reasoner`` server writes ``{"name": "crop_image", "arguments": {"bbox_2d": [...],
"target_image": 1}}``, ``target_image`` counting the trajectory's images from 1. Our zoom answers it
when named ``crop_image`` (``--tool-opt image_zoom_in.name=crop_image``, which crashed ``serve``
with a TypeError before) and reads ``target_image`` k as ``image_index`` k - 1."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image

from tool_backends.base import ToolError, ToolSpec, canonical_arguments, validate_arguments
from tool_backends.registry import build_tool


def _turn(box, target) -> str:
    return ('<tool_call>{"name": "crop_image", "arguments": {"bbox_2d": %s, "target_image": %s}}</tool_call>'
            % (json.dumps(box), json.dumps(target)))


def _upload() -> str:
    yy, xx = np.mgrid[:256, :256]
    arr = (128 + 60 * np.sin(xx / 7.0) * np.cos(yy / 9.0)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).convert("RGB").save(buf, format="JPEG", quality=95)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def test_target_image_counts_from_one():
    spec = build_tool("image_zoom_in").spec
    assert validate_arguments(spec, {"bbox_2d": [1, 2, 30, 40], "target_image": 1})["image_index"] == 0
    assert validate_arguments(spec, {"bbox_2d": [1, 2, 30, 40], "target_image": 3})["image_index"] == 2
    with pytest.raises(ToolError, match="counts the trajectory's images from 1"):
        validate_arguments(spec, {"bbox_2d": [1, 2, 30, 40], "target_image": 0})  # not -1, the last image
    with pytest.raises(ToolError, match="not both"):
        validate_arguments(spec, {"bbox_2d": [1, 2, 30, 40], "target_image": 1, "image_index": 0})
    # not an integer: passed on unshifted, for the schema check to name
    assert canonical_arguments(spec, {"target_image": True})["image_index"] is True
    with pytest.raises(ToolError, match="image_index"):
        validate_arguments(spec, {"bbox_2d": [1, 2, 30, 40], "target_image": "1"})
    # a tool whose schema has no image_index keeps the argument as it came (and its check refuses it)
    plain = ToolSpec("t", "", {"type": "object", "properties": {"bbox": {"type": "array"}}})
    assert canonical_arguments(plain, {"target_image": 1}) == {"target_image": 1}


@pytest.fixture(scope="module")
def crop_server(start_server):
    return start_server(["serve", "--tools", "image_zoom_in", "--tool-opt", "image_zoom_in.name=crop_image",
                         "--tool-opt", 'image_zoom_in.observation_image={"max_side": 168, "format": "jpeg"}'])


def test_serve_renames_a_tool_and_answers_verl_tool_s_crop_turn(crop_server):
    tools = httpx.get(crop_server.url + "/tools", timeout=10).json()["tools"]
    assert [t["function"]["name"] for t in tools] == ["crop_image"]
    upload = _upload()
    turn1 = httpx.post(crop_server.url + "/get_observation", timeout=30, json={
        "trajectory_ids": ["vt-1"], "actions": [_turn([64, 64, 181, 181], 1)], "finish": [False],
        "extra_fields": [{"images": [upload]}]}).json()
    first = turn1["observations"][0]
    assert turn1["valids"] == [True] and "of image 0" in first["obs"]
    crop = Image.open(io.BytesIO(base64.b64decode(first["image"][0].split(",", 1)[1])))
    assert crop.format == "JPEG" and crop.size == (168, 168)
    # target_image 2 is the crop the first turn returned (image 1 here)
    turn2 = httpx.post(crop_server.url + "/get_observation", timeout=30, json={
        "trajectory_ids": ["vt-1"], "actions": [_turn([0, 0, 84, 84], 2)], "finish": [False],
        "extra_fields": [{}]}).json()
    assert turn2["valids"] == [True] and "of image 1" in turn2["observations"][0]["obs"]
    # target_image 0 does not exist in verl-tool's counting: an observation that says so, not a crash
    turn3 = httpx.post(crop_server.url + "/get_observation", timeout=30, json={
        "trajectory_ids": ["vt-1"], "actions": [_turn([0, 0, 84, 84], 0)], "finish": [False],
        "extra_fields": [{}]}).json()
    assert turn3["valids"] == [False] and "from 1" in json.dumps(turn3["observations"][0])


# ---- crop_style="verl_tool": the pixels a checkpoint trained against verl-tool's crop saw ---------------
def _scan(w=256, h=256):
    yy, xx = np.mgrid[:h, :w]
    return Image.fromarray((128 + 60 * np.sin(xx / 5.0) * np.cos(yy / 9.0)).astype(np.uint8)).convert("RGB")


def test_verl_tool_crop_style_pads_the_box_and_keeps_its_size_when_it_is_a_multiple_of_28():
    image = _scan()
    tool = build_tool("image_zoom_in", crop_style="verl_tool")
    result = tool([image], {"bbox_2d": [64, 64, 181, 181]})
    assert result.data["region"] == [38, 38, 206, 206]  # grown by 25.6 px a side, ends truncated
    assert result.images[0].size == (168, 168)
    assert result.images[0].tobytes() == image.crop((38, 38, 206, 206)).tobytes()  # no resample at all


def test_verl_tool_crop_style_rounds_other_sizes_to_multiples_of_28():
    image = _scan()
    result = build_tool("image_zoom_in", crop_style="verl_tool")([image], {"bbox_2d": [100, 100, 130, 110]})
    (x0, y0, x1, y1), size = result.data["region"], result.images[0].size
    assert (x0, y0, x1, y1) == (74, 74, 155, 135) and size == (84, 56)  # 81x61 -> the nearest multiples of 28
    want = image.crop((x0, y0, x1, y1)).resize(size, Image.Resampling.BICUBIC)
    assert result.images[0].tobytes() == want.tobytes()
    # the zoom's own style is unchanged: the box grown to min_size and enlarged to a short side of 336
    assert build_tool("image_zoom_in")([image], {"bbox_2d": [64, 64, 181, 181]}).images[0].size == (336, 336)


def test_an_unknown_crop_style_is_refused_with_the_choices():
    from medvqa_env.errors import ConfigError

    with pytest.raises(ConfigError, match="verl_tool"):
        build_tool("image_zoom_in", crop_style="verltool")


def test_our_multiple_of_28_size_is_transformers_smart_resize():
    """The Qwen-VL processor's own function, with verl-tool's pixel bounds (``qwen_vl_size`` keeps a
    classical server from importing transformers and torch for it)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    from tool_backends.zoom import qwen_vl_size

    for w, h in [(168, 168), (150, 100), (20, 14), (27, 29), (4000, 3000), (6000, 6000), (81, 61), (700, 15)]:
        assert qwen_vl_size(w, h) == smart_resize(h, w, 28, 4 * 28 * 28, 5120 * 28 * 28)[::-1], (w, h)
    # a side of 14 px or less: verl-tool's copy keeps one multiple where transformers' rounds it to 0 and rescales
    assert qwen_vl_size(500, 3) == (504, 28) != smart_resize(3, 500, 28, 4 * 28 * 28, 5120 * 28 * 28)[::-1]
