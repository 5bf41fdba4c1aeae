"""The toolbox's dispatch, validation, failure handling, config forms and cache."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from PIL import Image

from medvqa_env.errors import ConfigError
from medvqa_env.parser import ToolCall
from tool_backends.base import Tool, ToolContext, ToolResult, ToolSpec
from tool_backends.config import load_tool_config
from tool_backends.toolbox import ToolCache, Toolbox
from tool_backends.zoom import ZoomTool


@pytest.fixture
def image():
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (120, 160, 3), dtype=np.uint8))


class Crashing(Tool):
    spec = ToolSpec("crash", "always fails", {"type": "object", "properties": {}, "additionalProperties": False})

    def run(self, images, arguments, context):
        raise ZeroDivisionError("boom")


def test_zoom_crops_the_asked_region_and_enlarges(image):
    result = ZoomTool()([image], {"bbox": [10, 20, 60, 50]})
    crop = result.images[0]
    assert result.ok and result.data == {"region": [10, 20, 60, 50], "image_index": 0, "size": list(crop.size),
                                         "image_recipe": "crop"}  # what a remote client redraws the crop from
    assert min(crop.size) == 336 and crop.size[0] / crop.size[1] == pytest.approx(50 / 30, rel=0.02)
    expected = np.asarray(image.crop((10, 20, 60, 50)).resize(crop.size, Image.Resampling.BICUBIC))
    assert np.array_equal(np.asarray(crop), expected)


def test_zoom_coordinate_systems_agree(image):
    pixel = ZoomTool()([image], {"bbox": [16, 12, 80, 60]}).data["region"]
    norm = ZoomTool()([image], {"bbox": [0.1, 0.1, 0.5, 0.5], "coordinates": "normalized"}).data["region"]
    k = ZoomTool()([image], {"bbox": [100, 100, 500, 500], "coordinates": "norm1000"}).data["region"]
    assert pixel == norm == k


def test_tiny_boxes_grow_to_min_size_inside_the_image(image):
    region = ZoomTool(min_size=28)([image], {"bbox": [0, 0, 2, 2]}).data["region"]
    assert region == [0, 0, 28, 28]
    region = ZoomTool(min_size=28)([image], {"bbox": [158, 118, 160, 120]}).data["region"]
    assert region == [132, 92, 160, 120]


def test_unknown_tool_suggests_and_crash_is_contained(image):
    box = Toolbox.local([ZoomTool(), Crashing()])
    rec = box.call(ToolCall("image_zoom", {"bbox": [0, 0, 5, 5]}), [image])
    assert "Unknown tool 'image_zoom'" in rec.result.text and "Did you mean 'image_zoom_in'" in rec.result.text
    rec = box.call(ToolCall("crash", {}), [image])
    assert rec.error and "ZeroDivisionError: boom" in rec.result.text


def test_cache_serves_identical_calls_once(image):
    calls = []

    class Counting(ZoomTool):
        def run(self, images, arguments, context):
            calls.append(1)
            return super().run(images, arguments, context)

    box = Toolbox.local([Counting()], cache=ToolCache())
    ctx = ToolContext(record_id="r1")
    records = [box.call(ToolCall("image_zoom_in", {"bbox": [0, 0, 50, 50]}), [image], ctx) for _ in range(8)]
    assert len(calls) == 1 and [r.cached for r in records] == [False] + [True] * 7
    # a different image (same arguments) is a different entry
    other = Image.fromarray(np.zeros((120, 160, 3), dtype=np.uint8))
    box.call(ToolCall("image_zoom_in", {"bbox": [0, 0, 50, 50]}), [other], ctx)
    assert len(calls) == 2
    # failures are not cached
    box.call(ToolCall("image_zoom_in", {"bbox": [5, 5, 1, 1]}), [image], ctx)
    box.call(ToolCall("image_zoom_in", {"bbox": [5, 5, 1, 1]}), [image], ctx)
    assert len(calls) == 4


def test_config_forms():
    spec = load_tool_config({"image_zoom_in": "local", "segment": "http://127.0.0.1:7660",
                             "ground": {"engine": "owlvit"}})
    assert spec["image_zoom_in"] == {"backend": "local"}
    assert spec["segment"] == {"backend": "http", "url": "http://127.0.0.1:7660"}
    assert spec["ground"] == {"backend": "local", "engine": "owlvit"}
    assert load_tool_config(["image_zoom_in"]) == {"image_zoom_in": {"backend": "local"}}
    with pytest.raises(ConfigError, match="backend must be one of"):
        load_tool_config({"x": {"backend": "grpc"}})
    with pytest.raises(ConfigError, match="needs a 'url'"):
        load_tool_config({"x": {"backend": "http"}})
    with pytest.raises(ConfigError, match="does not exist"):
        load_tool_config("/no/such/tools.json")


def test_config_file_and_options_reach_the_tool(tmp_path, image):
    path = tmp_path / "tools.json"
    path.write_text('{"tools": {"image_zoom_in": {"backend": "local", "min_size": 64}}}')
    box = Toolbox.from_config(str(path))
    assert box.call(ToolCall("image_zoom_in", {"bbox": [0, 0, 2, 2]}), [image]).result.data["region"] == [0, 0, 64, 64]
    with pytest.raises(ConfigError, match="tool 'image_zoom_in' has no option 'nonsense'"):
        Toolbox.from_config({"image_zoom_in": {"backend": "local", "nonsense": 1}})


def test_toolbox_pickles_with_its_cache_emptied(image):
    box = Toolbox.from_config(["image_zoom_in"])
    box.call(ToolCall("image_zoom_in", {"bbox": [0, 0, 50, 50]}), [image])
    clone = pickle.loads(pickle.dumps(box))
    assert len(clone.cache) == 0 and clone.names == ["image_zoom_in"]
