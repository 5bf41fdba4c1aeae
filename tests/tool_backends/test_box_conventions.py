"""The box conventions models already speak, with the exact calls each family emits: Qwen2.5-VL
(and verl's / DeepEyes' ``image_zoom_in_tool``) write ``bbox_2d`` in pixels, Qwen3-VL on a 0-1000
grid; seed 000's checkpoint calls its servers by name."""

from __future__ import annotations

import pytest

from medvqa_env.env import MedVQAEnv
from medvqa_env.errors import ConfigError
from medvqa_env.parser import ToolCall
from medvqa_env.records import VQADataset
from rewards import RuleReward
from tool_backends.base import validate_arguments
from tool_backends.builtin import seed000_tools
from tool_backends.geometry import box_iou
from tool_backends.registry import build_tool
from tool_backends.toolbox import Toolbox

# the disc of the scene (160x120) is the box [36, 46, 65, 75]; on Qwen3-VL's grid:
DISC_GRID = [225, 383, 406, 625]  # round(x * 1000 / 160), round(y * 1000 / 120)

QWEN25_ZOOM = ('<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [36, 46, 65, 75], '
               '"label": "nodule"}}\n</tool_call>')
QWEN3_ZOOM = ('<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [225, 383, 406, 625], '
              '"label": "nodule"}}\n</tool_call>')
SEED_MEDSAM2 = '<tool_call>{"name": "medsam2", "arguments": {"bbox_2d": [225, 383, 406, 625]}}</tool_call>'


def episode(scene, tools, turn: str) -> dict:
    env = MedVQAEnv(dataset=VQADataset([scene.record]), tools=tools, reward=RuleReward())
    env.reset(options={"index": 0})
    _, _, _, _, info = env.step(turn)
    env.close()
    assert len(info["tool_calls"]) == 1
    return info["tool_calls"][0]


def test_qwen25_vl_zoom_call_in_pixels(scene):
    """Today this answered "Missing required argument 'bbox'"."""
    out = episode(scene, {"image_zoom_in_tool": {}}, QWEN25_ZOOM)
    assert out["error"] is None and out["data"]["region"] == [36, 46, 65, 75]


def test_qwen3_vl_zoom_call_on_the_grid(scene):
    out = episode(scene, {"image_zoom_in_tool": {"box_convention": "qwen3_grid"}}, QWEN3_ZOOM)
    assert out["error"] is None and box_iou(out["data"]["region"], [36, 46, 65, 75]) > 0.95
    assert "(0-1000 grid)" in out["text"]


def test_seed_checkpoint_calls_its_segmentation_server_by_name(scene):
    out = episode(scene, seed000_tools(), SEED_MEDSAM2)
    assert out["error"] is None and box_iou(out["data"]["bbox"], scene.disc_box) > 0.8


@pytest.mark.parametrize("name", ["image_zoom_in", "segment", "classify", "hires_render", "medsam3",
                                  "agent4k_resolution"])
@pytest.mark.parametrize("convention, box", [("pixels", [36, 46, 65, 75]), ("qwen3_grid", DISC_GRID),
                                             ("normalized", [0.225, 0.383, 0.406, 0.625])])
def test_every_box_tool_takes_bbox_2d_in_every_convention(scene, name, convention, box):
    options = {"engine": "oracle"} if name == "classify" else {}
    tool = build_tool(name, box_convention=convention, **options)
    extra = {"labels": ["ct", "mri"]} if name == "classify" else {}
    r = tool([scene.image], {"bbox_2d": box, **extra})
    assert r.ok, r.text
    region = r.data.get("prompt_box") or r.data["region"]
    assert box_iou(region, [36, 46, 65, 75]) > 0.9 or name == "image_zoom_in" and region == [36, 46, 65, 75]


def test_tools_report_boxes_in_the_callers_convention_so_they_can_be_reused(scene):
    box = Toolbox.from_config({"ground": {"engine": "oracle", "box_convention": "qwen3_grid"},
                               "image_zoom_in": {"box_convention": "qwen3_grid"}}, cache=False)
    from tool_backends.base import ToolContext

    ctx = ToolContext(record_id="s", annotations=scene.record.annotations)
    found = box.call(ToolCall("ground", {"text": "nodule"}), [scene.image], ctx).result
    assert str(DISC_GRID) in found.text and found.data["boxes"][0]["bbox"] == [36.0, 46.0, 65.0, 75.0]  # data stays pixels
    zoom = box.call(ToolCall("image_zoom_in", {"bbox_2d": DISC_GRID}), [scene.image], ctx).result
    assert zoom.data["region"] == [36, 46, 65, 75]  # the grid box read back points at the same pixels
    box.close()


def test_schema_states_the_convention_and_validators_accept_the_aliases():
    spec = build_tool("segment", box_convention="qwen3_grid").spec
    coords = spec.parameters["properties"]["coordinates"]
    assert coords["default"] == "norm1000" and "0-1000 grid" in coords["description"]
    assert validate_arguments(spec, {"bbox_2d": [1, 2, 3, 4], "img_idx": 0})["bbox"] == [1, 2, 3, 4]
    assert validate_arguments(spec, {"point_2d": "[5, 6]"})["point"] == [5, 6]
    with pytest.raises(ConfigError, match="expected box_convention in"):
        build_tool("image_zoom_in", box_convention="qwen4")
