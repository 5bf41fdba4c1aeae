"""transformers engines on tiny random models: processor -> forward -> post-processing, the same
code that loads a real checkpoint (tested by saving the tiny model and loading it by path)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from medvqa_env.errors import ConfigError
from tool_backends.engines import build_engine
from tool_backends.registry import build_tool

torch = pytest.importorskip("torch")  # the [vision] extra; always present in the dev venv


@pytest.fixture(scope="module")
def sam_tool():
    return build_tool("segment", engine="sam")


def test_sam_segments_from_box_and_point(sam_tool, scene):
    r = sam_tool([scene.image], {"bbox": scene.disc_box})
    assert r.ok and r.data["engine"] == "sam" and r.data["mask_rle"]["size"] == [120, 160]
    p = sam_tool([scene.image], {"point": [50, 60]})
    assert p.ok and p.data["prompt_point"] == [50, 60]


def test_sam_loads_a_checkpoint_by_path(sam_tool, scene, tmp_path):
    sam_tool.engine.model.save_pretrained(tmp_path)
    sam_tool.engine.processor.save_pretrained(tmp_path)
    loaded = build_tool("segment", engine="sam", model=str(tmp_path))
    a = sam_tool([scene.image], {"bbox": scene.disc_box})
    b = loaded([scene.image], {"bbox": scene.disc_box})
    assert same_answer(a, b)


def same_answer(tiny, loaded) -> bool:
    """A checkpoint loaded by path answers as the tiny model it was saved from; only the tiny one
    carries the random-weights warning (a path is taken for a real checkpoint)."""
    assert tiny.data["random_weights"] and "meaningless" in tiny.text
    assert not loaded.data["random_weights"] and "WARNING" not in loaded.text
    strip = lambda d: {k: v for k, v in d.items() if k != "random_weights"}  # noqa: E731
    return strip(tiny.data) == strip(loaded.data)


@pytest.mark.parametrize("engine", ["owlvit", "grounding_dino"])
def test_detectors_return_boxes_in_image_pixels(engine, scene, tmp_path):
    tool = build_tool("ground", engine=engine)
    r = tool([scene.image], {"text": "nodule", "threshold": 0.0, "max_boxes": 3})
    assert r.ok and 1 <= len(r.data["boxes"]) <= 3
    for b in r.data["boxes"]:
        x0, y0, x1, y1 = b["bbox"]
        assert 0 <= x0 < x1 <= 160 and 0 <= y0 < y1 <= 120 and 0 <= b["score"] <= 1 and b["label"] == "nodule"
    if engine == "grounding_dino":
        return  # same loading code as OWL-ViT below; saving and reloading it costs ~5 s here
    eng = tool.engine
    eng.model.save_pretrained(tmp_path), eng.processor.save_pretrained(tmp_path), eng.tokenizer.save_pretrained(tmp_path)
    again = build_tool("ground", engine=engine, model=str(tmp_path))
    assert same_answer(tool([scene.image], {"text": "nodule", "threshold": 0.0}),
                       again([scene.image], {"text": "nodule", "threshold": 0.0}))


@pytest.mark.parametrize("engine", ["clip", "siglip"])
def test_contrastive_classifiers(engine, scene, tmp_path):
    tool = build_tool("classify", engine=engine)
    r = tool([scene.image], {"labels": ["ct", "mri", "x-ray"]})
    assert r.ok and sum(r.data["scores"].values()) == pytest.approx(1.0, abs=1e-5)
    assert r.data["top"] == max(r.data["scores"], key=r.data["scores"].get)
    eng = tool.engine
    eng.model.save_pretrained(tmp_path), eng.processor.save_pretrained(tmp_path), eng.tokenizer.save_pretrained(tmp_path)
    again = build_tool("classify", engine=engine, model=str(tmp_path))
    assert same_answer(r, again([scene.image], {"labels": ["ct", "mri", "x-ray"]}))


# ---- SAM 2 / SAM 3 (MedSAM2 / MedSAM3 backbones) and SAM 3's text prompts ---------------------
@pytest.mark.parametrize("engine", ["medsam2", "medsam3"])
def test_sam2_and_sam3_tracker_segment_box_and_point_and_reload(engine, scene, tmp_path):
    tool = build_tool("segment", engine=engine)
    box = tool([scene.image], {"bbox": scene.disc_box})
    point = tool([scene.image], {"point_2d": [50, 60]})
    for r in (box, point):
        assert r.ok, r.text
        assert r.data["mask_rle"]["size"] == [120, 160] and r.data["random_weights"]
    tool.engine.save_pretrained(str(tmp_path))
    again = build_tool("segment", engine=engine, model=str(tmp_path))
    assert same_answer(box, again([scene.image], {"bbox": scene.disc_box}))


def test_sam3_text_segmenter_runs_and_reloads(scene, tmp_path):
    tool = build_tool("segment_text", engine="sam3")
    r = tool([scene.image], {"text": "nodule", "threshold": 0.0, "max_instances": 2})
    assert r.ok and r.data["random_weights"] and "meaningless" in r.text
    assert 1 <= len(r.data["boxes"]) <= 2 and r.data["mask_rle"]["size"] == [120, 160]
    tool.engine.save_pretrained(str(tmp_path))
    again = build_tool("segment_text", engine="sam3", model=str(tmp_path))
    assert same_answer(r, again([scene.image], {"text": "nodule", "threshold": 0.0, "max_instances": 2}))


def test_the_default_classifier_says_its_weights_are_random(scene):
    """classify's default engine is a tiny random CLIP: it must not print bare confident numbers."""
    r = build_tool("classify")([scene.image], {"labels": ["ct", "mri"]})
    assert r.ok and "WARNING" in r.text and "randomly-initialised" in r.text and r.data["random_weights"]
    assert not build_tool("classify", engine="oracle")([scene.image], {"labels": ["ct", "mri"]}).data["random_weights"]


def test_tiny_builds_are_reproducible_and_leave_the_global_rng_alone(scene):
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a = build_engine("classify", "clip").classify(scene.image, ["a", "b"])
    b = build_engine("classify", "clip").classify(scene.image, ["a", "b"])
    assert a == b and torch.equal(torch.rand(1), expected)


@pytest.mark.parametrize("engine,kind,package", [
    ("segment_anything", "segment", "segment_anything"),
    ("open_clip", "classify", "open_clip"),
    ("groundingdino", "ground", "groundingdino"),
    ("biomedparse", "segment_text", "inference_utils"),
])
def test_package_adapters_explain_where_they_belong(engine, kind, package):
    with pytest.raises(ConfigError) as e:
        build_engine(kind, engine)
    if importlib.util.find_spec(package) is None:
        assert "own venv" in str(e.value) and "medvqa-tools serve" in str(e.value)
    else:  # installed (a tool server's venv): it still refuses to guess a checkpoint
        assert "needs" in str(e.value)


def test_sam_mask_matches_image_size_on_real_vqa_rad(sam_tool, vqa_rad_root):
    from PIL import Image

    path = min((vqa_rad_root / "images").glob("*.jpg"), key=lambda p: p.stat().st_size)
    image = Image.open(path).convert("RGB")
    w, h = image.size
    r = sam_tool([image], {"bbox": [w * 0.3, h * 0.3, w * 0.6, h * 0.6]})
    assert r.ok and r.data["mask_rle"]["size"] == [h, w] and np.isfinite(r.data["area_fraction"])
