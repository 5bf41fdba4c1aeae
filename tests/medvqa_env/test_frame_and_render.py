"""One coordinate frame (what the agent sees is what the tools measure) on huge and tiny images,
and ``render()`` after tools that report no region."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from medvqa_env.env import MedVQAEnv
from medvqa_env.records import Annotations, AnswerType, Box, VQADataset, VQARecord
from rewards import RuleReward
from tool_backends.masks import rle_to_mask

ALL_TOOLS = {"image_zoom_in": {}, "segment": {"engine": "classical"}, "ground": {"engine": "oracle"},
             "classify": {"engine": "oracle"}, "hires_render": {}, "segment_text": {"engine": "oracle"}}


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def scan(w: int, h: int, lesion: tuple[int, int, int, int]) -> Image.Image:
    """Dark body, a bright square lesion at ``lesion`` = (x0, y0, x1, y1)."""
    arr = np.full((h, w), 50, np.uint8)
    x0, y0, x1, y1 = lesion
    arr[y0:y1, x0:x1] = 220
    return Image.fromarray(arr).convert("RGB")


def one_record_env(tmp_path, size, lesion, **env_options) -> MedVQAEnv:
    path = tmp_path / "scan.png"
    scan(*size, lesion).save(path)
    ann = Annotations(boxes=(Box("lesion", tuple(float(v) for v in lesion)),), labels=("ct",))
    record = VQARecord("r0", (str(path),), "Is there a lesion?", "yes", AnswerType.CLOSED, "frame", annotations=ann)
    return MedVQAEnv(dataset=VQADataset([record]), tools=dict(ALL_TOOLS), reward=RuleReward(),
                     render_mode="rgb_array", **env_options)


@pytest.fixture(scope="module")
def huge_env(tmp_path_factory):
    # 6000x1500 file, lesion at x 3000..3600, y 600..900; shown at 4096x1024 (factor 0.6827)
    env = one_record_env(tmp_path_factory.mktemp("huge"), (6000, 1500), (3000, 600, 3600, 900))
    yield env
    env.close()


def test_huge_image_the_agent_and_the_tools_share_the_shown_frame(huge_env):
    obs, _ = huge_env.reset(options={"index": 0})
    shown = obs["images"][0]
    assert shown.shape == (1024, 4096, 3) and huge_env.images[0].size == (4096, 1024)
    assert huge_env.original_sizes == [(6000, 1500)]
    assert "6000x1500" in obs["text"] and "4096x1024" in obs["text"] and "as shown" in obs["text"]
    # the agent reads the lesion off the image it was given ...
    ys, xs = np.nonzero(shown[..., 0] > 150)
    box = [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]
    _, _, _, _, info = huge_env.step(call("segment", bbox=box) + call("image_zoom_in", bbox=box)
                                     + call("ground", text="lesion"))
    seg, zoom, ground = info["tool_calls"]
    mask = rle_to_mask(seg["data"]["mask_rle"])
    assert mask.shape == (1024, 4096)  # ... and the tool finds it there (edges blur by a pixel when downscaled)
    assert max(abs(a - b) for a, b in zip(seg["data"]["bbox"], box)) <= 2
    crop = huge_env.images[2]
    assert zoom["data"]["region"] == box and np.asarray(crop)[crop.size[1] // 2, crop.size[0] // 2, 0] > 150
    # annotations (file pixels) arrive in the shown frame: the oracle's box is the lesion on screen
    gx0, gy0, gx1, gy1 = ground["data"]["boxes"][0]["bbox"]
    assert abs(gx0 - box[0]) <= 1 and abs(gy1 - box[3]) <= 1 and abs(gx1 - box[2]) <= 1
    assert huge_env.render().ndim == 3


def test_normalized_coordinates_still_work_on_a_downscaled_image(huge_env):
    huge_env.reset(options={"index": 0})
    _, _, _, _, info = huge_env.step(call("image_zoom_in", bbox=[0.5, 0.4, 0.6, 0.6], coordinates="normalized"))
    x0, y0, x1, y1 = info["tool_calls"][0]["data"]["region"]
    assert (x0, y0, x1, y1) == (2048, 410, 2458, 614)  # fractions of the shown 4096x1024, to the nearest pixel


def test_tiny_28px_image_runs_every_tool_and_renders(tmp_path):
    env = one_record_env(tmp_path, (28, 28), (10, 10, 18, 18))
    obs, _ = env.reset(options={"index": 0})
    assert obs["images"][0].shape == (28, 28, 3) and "downscaled" not in obs["text"]
    turn = (call("image_zoom_in", bbox=[10, 10, 18, 18]) + call("segment", point=[14, 14])
            + call("ground", text="lesion") + call("classify", labels=["ct", "mri"])
            + call("hires_render", bbox=[500, 500, 1000, 1000], coordinates="norm1000")
            + call("segment_text", text="lesion"))
    _, _, _, _, info = env.step(turn)
    assert [c["error"] for c in info["tool_calls"]] == [None] * 6
    zoom, seg = info["tool_calls"][:2]
    assert zoom["data"]["region"] == [0, 0, 28, 28]  # grown to the 28-pixel minimum: the whole image
    assert seg["data"]["bbox"] == [10, 10, 18, 18]
    picture = env.render()
    assert picture.dtype == np.uint8 and picture.shape[2] == 3
    env.close()


# ---- render() after tools that report no region (issue 12) ------------------------------------
def test_render_after_classify_without_box_and_an_empty_segment(tmp_path):
    env = one_record_env(tmp_path, (96, 96), (60, 60, 70, 70))
    env.reset(options={"index": 0})
    _, _, _, _, info = env.step(call("classify", labels=["ct", "mri"]) + call("segment", point=[5, 5]))
    assert info["tool_calls"][0]["data"]["region"] is None
    assert info["tool_calls"][1]["data"]["area_px"] == 0 or info["tool_calls"][1]["data"]["region"] is not None
    env.step(call("segment", bbox=[0, 0, 4, 4]))  # a flat corner: nothing to find, region = the prompt box
    assert env.render().shape[2] == 3
    env.close()


def test_render_on_the_embedded_default_after_classify():
    env = MedVQAEnv(dataset="embedded", tools={"classify": {"engine": "oracle"}, "segment": {"engine": "oracle"}},
                    reward=RuleReward(), render_mode="rgb_array")
    env.reset(options={"index": 0})
    env.step(call("classify", labels=["lesion", "normal"]) + call("segment", point=[1, 1]))
    assert env.render().ndim == 3
    env.step(r"\boxed{yes}")
    assert env.render().ndim == 3
    env.close()


def test_draw_overlays_skips_malformed_tool_data():
    from medvqa_env.render import draw_overlays

    trace = [{"tool_calls": [{"name": "t", "data": {"region": None, "boxes": None}},
                             {"name": "t", "data": {"region": [1, 2], "boxes": [{"bbox": None}, "junk"]}},
                             {"name": "t", "data": {"region": [30, 30, 10, 10]}}]}]
    out = draw_overlays(Image.new("RGB", (40, 40)), trace, scale=2.0)
    assert out.size == (80, 80) and np.asarray(out).any()  # the inverted region is drawn, nothing crashed


@pytest.mark.parametrize("bbox", [[80, 80, 120, 120], [80, 0, 120, 40], [0, 0, 200, 200]])
def test_render_puts_labels_beside_their_boxes_not_over_what_they_show(bbox):
    """A ground label drawn inside its box covers the lesion it names: the inside of the box stays
    the image's own pixels (a box at the top edge gets its label below; only a box filling the
    whole image has no side with room), and the label is drawn outside it."""
    from medvqa_env.render import draw_overlays, tool_colour

    GROUNDING = tool_colour("ground", 1)

    trace = [{"tool_calls": [{"name": "ground", "error": None, "data": {
        "image_index": 0, "boxes": [{"bbox": bbox, "label": "lesion", "score": 0.93}]}}]}]
    out = np.asarray(draw_overlays(Image.new("RGB", (200, 200), (90, 90, 90)), trace))
    x0, y0, x1, y1 = bbox
    line = max(2, round(200 / 200))
    inside = out[y0 + line + 1:y1 - line - 1, x0 + line + 1:x1 - line - 1]
    label_pixels = (np.abs(out.astype(int) - GROUNDING).sum(-1) < 60)
    if bbox != [0, 0, 200, 200]:
        assert (inside == 90).all(), "the label (or its background) was drawn over the box's inside"
        outside = label_pixels.copy()
        outside[y0:y1, x0:x1] = False
        assert outside.sum() > 20  # the label's text, beside the box
    else:
        assert label_pixels[line + 1:-line - 1, line + 1:-line - 1].sum() > 20  # no room outside: still shown


# ---- issue 41 item 7: numbered boxes in the tool's colours, no overprinting, MCQ options ------------
def test_ground_boxes_are_numbered_and_drawn_in_the_colours_of_the_tools_own_image(tmp_path):
    """Before: every ground box cyan in the render and red/blue in ground's image, and no number."""
    path = tmp_path / "scan.png"
    scan(200, 200, (30, 30, 80, 80)).save(path)
    ann = Annotations(boxes=(Box("lesion", (30.0, 30.0, 80.0, 80.0)), Box("lesion", (120.0, 110.0, 170.0, 160.0))))
    record = VQARecord("r0", (str(path),), "Is there a lesion?", "yes", AnswerType.CLOSED, "frame", annotations=ann)
    env = MedVQAEnv(dataset=VQADataset([record]), tools={"ground": {"engine": "oracle"}}, reward=RuleReward(),
                    render_mode="rgb_array")
    env.reset(options={"index": 0})
    obs, _, _, _, info = env.step(call("ground", text="lesion"))
    tool_image = np.asarray(obs["images"][0])
    from medvqa_env.render import draw_overlays

    placed = []
    rendered = np.asarray(draw_overlays(env.images[0], env.trace, placed=placed))
    boxes = info["tool_calls"][0]["data"]["boxes"]
    assert len(boxes) == 2
    for number, box in enumerate(boxes, start=1):
        x0, y0, x1, y1 = (int(v) for v in box["bbox"])
        edge = (y0 + (y1 - y0) // 2, x0)  # the middle of the left edge: outline in both pictures
        assert tuple(rendered[edge]) == tuple(tool_image[edge]), (number, rendered[edge], tool_image[edge])
    texts = [(text, colour) for text, colour, _ in placed]
    assert [t for t, _ in texts] == ["1 lesion 1.00", "2 lesion 1.00"]
    assert [c for _, c in texts] == [tuple(tool_image[(y0 + (y1 - y0) // 2, x0)]) for x0, y0, x1, y1 in
                                     ((int(v) for v in b["bbox"]) for b in boxes)]
    env.close()


def test_labels_of_tools_sharing_a_box_never_overprint():
    """Before: zoom's and segment's labels on one box were drawn at the same place."""
    from medvqa_env.render import draw_overlays, tool_colour

    box = [60, 60, 120, 120]
    trace = [{"tool_calls": [
        {"name": "image_zoom_in", "error": None, "data": {"image_index": 0, "region": box}},
        {"name": "segment", "error": None, "data": {"image_index": 0, "region": box}},
        {"name": "ground", "error": None, "data": {"image_index": 0, "boxes": [{"bbox": box, "label": "lesion",
                                                                                 "score": 0.9}]}}]}]
    placed = []
    draw_overlays(Image.new("RGB", (200, 200), (90, 90, 90)), trace, placed=placed)
    rects = [r for _, _, r in placed]
    assert len(rects) == 3
    for i in range(3):
        for j in range(i + 1, 3):
            a, b = rects[i], rects[j]
            assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (placed[i], placed[j])
        x0, y0, x1, y1 = rects[i]
        assert x1 <= box[0] or x0 >= box[2] or y1 <= box[1] or y0 >= box[3], "a label covers the box"
    # one colour per tool: three tools, three colours
    assert len({c for _, c, _ in placed}) == 3 and (placed[0][1], placed[1][1]) == (tool_colour("image_zoom_in"),
                                                                                    tool_colour("segment"))


def test_the_transcript_shows_mcq_options_so_a_letter_answer_can_be_read(tmp_path):
    path = tmp_path / "scan.png"
    scan(64, 64, (10, 10, 30, 30)).save(path)
    record = VQARecord("r0", (str(path),), "Which modality?", "B", AnswerType.MCQ, "frame",
                       options={"A": "CT", "B": "MRI"})
    env = MedVQAEnv(dataset=VQADataset([record]), tools=[], reward=RuleReward(), render_mode="rgb_array")
    env.reset(options={"index": 0})
    env.step("\\boxed{B}")
    from medvqa_env.render import _transcript

    lines = _transcript(record.question, env.trace, None, dict(record.options))
    assert lines[:2] == ["Q: Which modality?", "Options: A) CT   B) MRI"]
    assert env.render().ndim == 3
    env.close()
