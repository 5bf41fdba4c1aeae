"""Small pure pieces: masks and RLE, engines' registry, oracle matching, caches, CLI options."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from medvqa_env.errors import ConfigError
from medvqa_env.parser import ToolCall
from tool_backends.base import Tool, ToolContext, image_digest
from tool_backends.cli import tool_options
from tool_backends.disk_cache import DiskToolCache
from tool_backends.engines import build_engine
from tool_backends.engines.oracle import OracleClassifier, label_matches
from tool_backends.masks import count_components, mask_bbox, mask_to_rle, rle_to_mask
from tool_backends.registry import build_tool
from tool_backends.toolbox import Toolbox, ToolCache


@settings(max_examples=60, deadline=None)
@given(arrays(bool, st.tuples(st.integers(1, 12), st.integers(1, 12))))
def test_rle_round_trips(mask):
    rle = mask_to_rle(mask)
    assert np.array_equal(rle_to_mask(rle), mask) and sum(rle["counts"]) == mask.size


def test_rle_rejects_inconsistent_counts():
    with pytest.raises(ValueError, match="summing to 6"):
        rle_to_mask({"size": [2, 3], "counts": [1, 2]})


def test_mask_measurements():
    m = np.zeros((10, 10), bool)
    m[1:3, 1:3] = m[6:9, 5:9] = True
    assert count_components(m) == 2 and mask_bbox(m) == [1, 1, 9, 9] and mask_bbox(np.zeros((2, 2))) is None


def test_derived_images_do_not_inherit_the_digest(scene):
    flipped = scene.image.transpose(0)
    assert image_digest(scene.image) != image_digest(flipped)
    assert image_digest(scene.image.copy()) == image_digest(scene.image)


def test_unknown_engines_suggest_a_name():
    with pytest.raises(ConfigError, match="Did you mean 'classical'"):
        build_tool("segment", engine="clasical")
    with pytest.raises(ConfigError, match="segment engine 'classical' has no option 'wrong'"):
        build_engine("segment", "classical", wrong=1)


def test_oracle_label_matching_and_classifier():
    assert label_matches("left kidney", "kidney") and not label_matches("liver", "lung")
    from medvqa_env.records import Annotations

    ctx = ToolContext(annotations=Annotations(labels=("pneumonia",)))
    probs = OracleClassifier(epsilon=0.1).classify(None, ["normal", "pneumonia", "effusion"], context=ctx)
    assert probs["pneumonia"] == pytest.approx(0.9) and sum(probs.values()) == pytest.approx(1.0)
    assert OracleClassifier().classify(None, ["a", "b"]) == {"a": 0.5, "b": 0.5}


def test_classical_grounding_on_real_vqa_rad(vqa_rad_root):
    from PIL import Image

    image = Image.open(min((vqa_rad_root / "images").glob("*.jpg"), key=lambda p: p.stat().st_size)).convert("RGB")
    r = build_tool("ground")([image], {"text": "bright lesion", "max_boxes": 3})
    assert r.ok and 1 <= len(r.data["boxes"]) <= 3
    scores = [b["score"] for b in r.data["boxes"]]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)


class CountingTool(Tool):
    """A real segment tool that counts how often it actually runs."""

    def __init__(self):
        self.inner = build_tool("segment")
        self.spec = self.inner.spec
        self.runs = 0

    def run(self, images, arguments, context):
        self.runs += 1
        return self.inner.run(images, arguments, context)


def test_a_grpo_group_of_identical_calls_pays_once(scene, tmp_path):
    tool = CountingTool()
    box = Toolbox.local([tool], cache=ToolCache())
    call = ToolCall("segment", {"bbox": [30, 40, 70, 80]})
    records = [box.call(call, [scene.image], ToolContext(record_id="r1")) for _ in range(8)]
    assert tool.runs == 1 and [r.cached for r in records] == [False] + [True] * 7
    assert len({r.result.text for r in records}) == 1


def test_disk_cache_is_shared_across_toolboxes(scene, tmp_path):
    tools = [CountingTool(), CountingTool()]
    call = ToolCall("segment", {"point": [50, 60]})
    texts = []
    for tool in tools:  # two "processes" pointing at one directory
        box = Toolbox.local([tool], cache=DiskToolCache(tmp_path / "cache"))
        texts.append(box.call(call, [scene.image.copy()], ToolContext(record_id="r1")).result.text)
    assert [t.runs for t in tools] == [1, 0] and texts[0] == texts[1]
    (next((tmp_path / "cache").glob("*.npz"))).write_bytes(b"garbage")
    assert DiskToolCache(tmp_path / "cache").get("anything") is None


def test_cli_tool_options():
    assert tool_options(["segment", "ground"], "segment=sam", ["ground.max_boxes=3"]) == \
        {"segment": {"engine": "sam"}, "ground": {"max_boxes": 3}}
    with pytest.raises(ConfigError, match="no tool in"):
        tool_options(["image_zoom_in"], "sam", [])
    with pytest.raises(ConfigError, match="tool.key=value"):
        tool_options(["segment"], None, ["engine=sam"])


def test_cli_list_prints_tools_and_engines(capsys):
    from tool_backends.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert ("segment  engines: classical, medsam2, medsam3, medsam_lite, oracle, sam, sam2, sam3, segment_anything, trained, "
            "transformers"
            in out and "hires_render" in out and "segment_text  engines: biomedparse, classical" in out)
    assert "medsam3  engines: classical, medsam2, medsam3" in out  # the seed's names are listed with their engines


def test_disk_cache_pickles_to_the_same_directory(tmp_path):
    import pickle

    from tool_backends.base import ToolResult

    cache = DiskToolCache(tmp_path, max_entries=5, max_bytes=10_000)
    cache.put("k", ToolResult("v"))
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.max_entries, copy.max_bytes) == (5, 10_000) and copy.get("k").text == "v" and copy.disk_hits == 1


@pytest.mark.parametrize("name,engine,arguments", [
    ("segment", "classical", {"bbox": [30, 40, 70, 80]}),
    ("segment_text", "classical", {"text": "bright nodule"}),
    ("ground", "classical", {"text": "bright lesion"}),
])
def test_result_overlays_are_drawn_only_when_read_and_equal_the_eager_drawing(scene, name, engine, arguments):
    from medvqa_env.images import LazyImage
    from tool_backends.masks import draw_boxes, overlay_mask

    result = Toolbox.from_config({name: {"engine": engine}}, cache=False).call(
        ToolCall(name, arguments), [scene.image], ToolContext()).result
    assert result.ok and len(result.images) == 1, result.text
    overlay = result.images[0]
    assert isinstance(overlay, LazyImage) and not overlay.drawn and overlay.size == scene.image.size
    if "mask_rle" in result.data:
        eager = overlay_mask(scene.image, rle_to_mask(result.data["mask_rle"]))
    else:
        eager = draw_boxes(scene.image, result.data["boxes"])
    assert overlay.tobytes() == eager.tobytes() and overlay.drawn


def test_cli_list_describes_every_tool_and_prints_no_warning():
    """``medvqa-tools list`` in a fresh process: every tool (classify and its seed alias included)
    has its description under it, and nothing is printed on stderr (no tiny-model warning, no
    model loaded to read a description)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tool_backends.registry import available_tools

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tool_backends.cli", "list"], cwd=repo, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    for name in available_tools():
        head = next(i for i, line in enumerate(lines) if line.split()[0] == name)
        assert lines[head + 1].startswith("    ") and len(lines[head + 1].strip()) > 20, (name, lines[head + 1])
    for name in ("classify", "biomedclip"):
        head = next(i for i, line in enumerate(lines) if line.split()[0] == name)
        assert lines[head + 1].strip().startswith("Zero-shot classification: give 2 or more candidate labels")
