"""One suite, every backend: each tool runs in-process and through a real server on loopback, with
the classical and the oracle engines, and must behave -- and answer -- the same way."""

from __future__ import annotations

import os

import numpy as np
import pytest

from medvqa_env.parser import ToolCall
from tool_backends.base import ToolContext
from tool_backends.geometry import box_iou
from tool_backends.masks import rle_to_mask
from tool_backends.toolbox import Toolbox

PROFILES = {
    "classical": {"segment": {"engine": "classical"}, "ground": {"engine": "classical"},
                  "classify": {"engine": "oracle"}, "hires_render": {}, "image_zoom_in": {},
                  "segment_text": {"engine": "classical"}, "medsam2": {"engine": "classical"}},
    "oracle": {"segment": {"engine": "oracle"}, "ground": {"engine": "oracle"}, "classify": {"engine": "oracle"},
               "segment_text": {"engine": "oracle"}},
}


def _serve_args(profile: dict, root) -> list[str]:
    engines = ",".join(f"{t}={o['engine']}" for t, o in profile.items() if "engine" in o)
    return ["serve", "--tools", ",".join(profile), "--engine", engines, "--image-root", str(root),
            "--image-root", os.environ["MEDVQA_CACHE"]]  # where the embedded dataset keeps its masks


@pytest.fixture(scope="module")
def servers(start_server, scene):
    procs = {name: start_server(_serve_args(p, scene.root), wait=False) for name, p in PROFILES.items()}
    return {name: proc.wait().url for name, proc in procs.items()}


@pytest.fixture(scope="module")
def toolboxes(servers):
    """(backend, profile) -> Toolbox without a cache, so every call really runs."""
    boxes = {}
    for profile, tools in PROFILES.items():
        boxes["local", profile] = Toolbox.from_config({t: {"backend": "local", **o} for t, o in tools.items()},
                                                      cache=False)
        boxes["remote", profile] = Toolbox.from_config({t: {"url": servers[profile], "timeout_s": 30}
                                                        for t in tools}, cache=False)
    yield boxes
    for box in boxes.values():
        box.close()


BACKENDS = ["local", "remote"]


def call(toolboxes, backend, profile, scene, name, arguments, images=None):
    ctx = ToolContext(record_id=scene.record.id, dataset="scene", annotations=scene.record.annotations)
    return toolboxes[backend, profile].call(ToolCall(name, arguments), images or [scene.image], ctx).result


# ---- behaviour, per backend -----------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_classical_segment_box_finds_the_disc(toolboxes, backend, scene):
    r = call(toolboxes, backend, "classical", scene, "segment", {"bbox": scene.disc_box, "label": "nodule"})
    assert r.ok, r.text
    mask = rle_to_mask(r.data["mask_rle"])
    iou = (mask & scene.disc_mask).sum() / (mask | scene.disc_mask).sum()
    assert iou > 0.85
    assert r.data["n_components"] == 1 and "1 connected component" in r.text
    assert f"{r.data['area_px']} px" in r.text and "% of the image" in r.text
    assert r.data["region"] == r.data["bbox"] and len(r.images) == 1 and r.images[0].size == scene.image.size


@pytest.mark.parametrize("backend", BACKENDS)
def test_classical_segment_point_grows_into_the_square(toolboxes, backend, scene):
    r = call(toolboxes, backend, "classical", scene, "segment", {"point": [115, 55]})
    mask = rle_to_mask(r.data["mask_rle"])
    iou = (mask & scene.square_mask).sum() / (mask | scene.square_mask).sum()
    assert r.ok and iou > 0.8


@pytest.mark.parametrize("backend", BACKENDS)
def test_oracle_segment_returns_the_annotated_mask(toolboxes, backend, scene):
    r = call(toolboxes, backend, "oracle", scene, "segment", {"point": [105, 45]})
    assert np.array_equal(rle_to_mask(r.data["mask_rle"]), scene.square_mask)
    r = call(toolboxes, backend, "oracle", scene, "segment", {"bbox": [0.2, 0.3, 0.45, 0.7], "coordinates": "normalized"})
    assert np.array_equal(rle_to_mask(r.data["mask_rle"]), scene.disc_mask)
    r = call(toolboxes, backend, "oracle", scene, "segment", {"point": [5, 5]})
    assert r.ok and r.data["area_px"] == 0 and "No structure found" in r.text and not r.images


@pytest.mark.parametrize("backend", BACKENDS)
def test_ground(toolboxes, backend, scene):
    r = call(toolboxes, backend, "classical", scene, "ground", {"text": "bright nodule"})
    assert r.ok and r.images
    assert box_iou(r.data["boxes"][0]["bbox"], scene.disc_box) > 0.5
    dark = call(toolboxes, backend, "classical", scene, "ground", {"text": "dark cyst"})
    assert any(box_iou(b["bbox"], [100, 40, 130, 70]) > 0.5 for b in dark.data["boxes"])
    # the classical engine reads only bright/dark, and says so (text and data), found or not
    assert "ignores the query's words except bright/dark: it returned bright regions" in r.text
    assert "whatever 'bright nodule' names" in r.text and r.data["query_used"] == "polarity only"
    assert dark.data["polarity"] == "dark" and r.data["polarity"] == "bright"
    o = call(toolboxes, backend, "oracle", scene, "ground", {"text": "nodules"})
    assert [b["bbox"] for b in o.data["boxes"]] == [[36.0, 46.0, 65.0, 75.0]] and o.data["boxes"][0]["score"] == 1.0
    none = call(toolboxes, backend, "oracle", scene, "ground", {"text": "kidney"})
    assert none.ok and none.data["boxes"] == [] and "Found nothing" in none.text


@pytest.mark.parametrize("backend", BACKENDS)
def test_classify_oracle_puts_mass_on_annotated_labels(toolboxes, backend, scene):
    r = call(toolboxes, backend, "oracle", scene, "classify", {"labels": ["mri", "ct", "x-ray"]})
    assert r.data["top"] == "ct" and r.data["scores"]["ct"] > 0.9
    assert sum(r.data["scores"].values()) == pytest.approx(1.0)
    assert r.text.startswith("Classification of image 0: ct 0.980")


@pytest.mark.parametrize("backend", BACKENDS)
def test_hires_and_zoom(toolboxes, backend, scene):
    r = call(toolboxes, backend, "classical", scene, "hires_render", {"bbox": [40, 50, 60, 70], "scale": 4})
    assert r.ok and r.images[0].size == (80, 80) and "no detail beyond the source pixels" in r.text
    z = call(toolboxes, backend, "classical", scene, "image_zoom_in", {"bbox": [40, 50, 60, 70]})
    assert z.ok and z.images and z.data["region"] == [36, 46, 64, 74]


@pytest.mark.parametrize("backend", BACKENDS)
def test_segment_text(toolboxes, backend, scene):
    r = call(toolboxes, backend, "classical", scene, "segment_text", {"text": "bright nodule"})
    mask = rle_to_mask(r.data["mask_rle"])
    assert r.ok and r.images and (mask & scene.disc_mask).sum() / (mask | scene.disc_mask).sum() > 0.85
    assert "instance" in r.text and r.data["bbox"] == r.data["boxes"][0]["bbox"]
    o = call(toolboxes, backend, "oracle", scene, "segment_text", {"text": "the cyst"})
    assert np.array_equal(rle_to_mask(o.data["mask_rle"]), scene.square_mask) and o.data["boxes"][0]["label"] == "cyst"
    none = call(toolboxes, backend, "oracle", scene, "segment_text", {"text": "kidney"})
    assert none.ok and none.data["area_px"] == 0 and "Found nothing" in none.text and not none.images


@pytest.mark.parametrize("backend", BACKENDS)
def test_seed_name_and_qwen_box_key_over_every_backend(toolboxes, backend, scene):
    r = call(toolboxes, backend, "classical", scene, "medsam2", {"bbox_2d": scene.disc_box})
    mask = rle_to_mask(r.data["mask_rle"])
    assert r.ok and (mask & scene.disc_mask).sum() / (mask | scene.disc_mask).sum() > 0.85


BAD_CALLS = [
    ("segment", {}, "needs a prompt"),
    ("segment", {"bbox": [10, 10, 5, 5]}, "empty or inverted"),
    ("segment", {"point": [500, 5]}, "outside the image"),
    ("segment", {"bbox": [1, 2, 3]}, "at least 4"),
    ("segment", {"bbox": [0, 0, 9, 9], "image_index": 3}, "out of range"),
    ("segment", {"bbox": [0, 0, 9, 9], "colour": "red"}, "Unknown argument 'colour'"),
    ("ground", {"text": "   "}, "non-empty"),
    ("ground", {"text": "x", "threshold": 2}, "<= 1"),
    ("classify", {"labels": ["ct"]}, "at least 2"),
    ("classify", {"labels": ["ct", "ct"]}, "distinct"),
    ("classify", {"labels": "ct, mri"}, "must be array"),
    ("hires_render", {"scale": 100}, "<= 8"),
    ("segment", {"bbox": [0, 0, 9, 9], "bbox_2d": [0, 0, 9, 9]}, "not both"),
    ("segment_text", {"text": " "}, "non-empty"),
    ("image_zoom_in", {"bbox_2d": "[1, 2]"}, "at least 4"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,arguments,expected", BAD_CALLS)
def test_bad_arguments_become_readable_failures(toolboxes, backend, scene, name, arguments, expected):
    r = call(toolboxes, backend, "classical", scene, name, arguments)
    assert not r.ok and r.text.startswith("Error: ") and expected in r.text


# ---- equality across backends ---------------------------------------------------------------
SAME_CALLS = [
    ("classical", "segment", {"bbox": [30, 40, 70, 80]}),
    ("classical", "segment", {"point": [0.7, 0.45], "coordinates": "normalized", "image_index": 1}),
    ("classical", "ground", {"text": "bright", "max_boxes": 3, "image_index": -1}),
    ("classical", "hires_render", {"scale": 2.5}),
    ("classical", "image_zoom_in", {"bbox": [500, 300, 700, 600], "coordinates": "norm1000"}),
    ("classical", "classify", {"labels": ["a", "b"], "bbox": [0, 0, 50, 50]}),
    ("oracle", "segment", {"bbox": [90, 30, 140, 80], "label": "cyst"}),
    ("oracle", "ground", {"text": "cyst"}),
    ("oracle", "classify", {"labels": ["normal", "nodule"]}),
    ("classical", "segment", {"bbox": "nope"}),
    ("classical", "segment_text", {"text": "dark cyst", "coordinates": "norm1000"}),
    ("oracle", "segment_text", {"text": "nodule"}),
    ("classical", "image_zoom_in", {"bbox_2d": "[500, 300, 700, 600]", "coordinates": "norm1000", "img_idx": 1}),
]


@pytest.mark.parametrize("profile,name,arguments", SAME_CALLS)
def test_local_and_remote_give_equal_results(toolboxes, scene, profile, name, arguments):
    images = [scene.image, scene.image.transpose(0)]
    local = call(toolboxes, "local", profile, scene, name, arguments, images)
    remote = call(toolboxes, "remote", profile, scene, name, arguments, images)
    assert (remote.text, remote.error, remote.data) == (local.text, local.error, local.data)
    assert [im.size for im in remote.images] == [im.size for im in local.images]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(remote.images, local.images))


def test_a_config_swaps_backends_without_code_changes(servers, scene, tmp_path):
    import json

    from medvqa_env.env import MedVQAEnv
    from medvqa_env.records import VQADataset
    from rewards import RuleReward

    path = tmp_path / "tools.json"
    turn = '<tool_call>{"name": "segment", "arguments": {"bbox": [36, 46, 65, 75]}}</tool_call>'
    observations = []
    for config in ({"segment": "local"}, {"segment": servers["classical"]}):
        path.write_text(json.dumps({"tools": config}))
        env = MedVQAEnv(VQADataset([scene.record]), tools=str(path), reward=RuleReward())
        env.reset(options={"index": 0})
        obs, reward, terminated, truncated, info = env.step(turn)
        observations.append(obs["text"])
        assert info["tool_calls"][0]["error"] is None and len(obs["images"]) == 1
        _, reward, terminated, _, _ = env.step("\\boxed{yes}")
        assert terminated and reward == 1.0
        env.close()
    assert observations[0] == observations[1]


def test_oracle_tools_on_the_embedded_dataset(toolboxes, servers):
    from medvqa_env.datasets import load_dataset
    from medvqa_env.images import load_image

    record = next(r for r in load_dataset("embedded") if any(m.label == "left kidney" for m in r.annotations.masks))
    image = load_image(record.image_paths[0])
    ctx = ToolContext(record_id=record.id, annotations=record.annotations)
    kidney = next(b for b in record.annotations.boxes if b.label == "left kidney")
    calls = [ToolCall("ground", {"text": "left kidney"}), ToolCall("segment", {"bbox": list(kidney.bbox)}),
             ToolCall("classify", {"labels": ["MRI", "CT", "X-ray"]})]
    for backend in BACKENDS:
        ground, seg, cls = (toolboxes[backend, "oracle"].call(c, [image], ctx).result for c in calls)
        assert [b["label"] for b in ground.data["boxes"]] == ["left kidney"]
        assert box_iou(seg.data["bbox"], kidney.bbox) > 0.8 and seg.data["n_components"] == 1
        assert cls.data["top"] == "CT"


def test_every_tool_agrees_on_a_real_vqa_rad_image(toolboxes, vqa_rad_root):
    from PIL import Image

    image = Image.open(min((vqa_rad_root / "images").glob("*.jpg"), key=lambda p: p.stat().st_size)).convert("RGB")
    w, h = image.size
    box = [w // 4, h // 4, w // 2, h // 2]
    for name, arguments in [("segment", {"bbox": box}), ("segment", {"point": [w // 2, h // 2]}),
                            ("ground", {"text": "bright lesion"}), ("hires_render", {"bbox": box}),
                            ("image_zoom_in", {"bbox": box}), ("classify", {"labels": ["ct", "mri"]})]:
        local, remote = (toolboxes[b, "classical"].call(ToolCall(name, arguments), [image]).result for b in BACKENDS)
        assert local.ok and (remote.text, remote.data) == (local.text, local.data)
        assert [im.tobytes() for im in remote.images] == [im.tobytes() for im in local.images]
