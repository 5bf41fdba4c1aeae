"""Tool-use shaping: bonus only for a used tool and a right answer, redundancy, grounding IoU."""

from __future__ import annotations

import pytest

from medvqa_env.records import AnswerType
from rewards.base import RewardInput
from rewards.rule import RuleReward
from rewards.shaping import ToolUseShaping, grounding_iou, redundant_calls

BOX = {"boxes": [{"label": "lesion", "bbox": [10, 10, 30, 30], "image_index": 0}]}


def _zoom(region, index=0, error=None):
    return {"name": "image_zoom_in", "arguments": {"bbox": list(region), "index": index}, "error": error,
            "data": {"region": list(region), "image_index": index}}


def _s(answer, calls=(), annotations=None):
    return RewardInput(rf"\boxed{{{answer}}}", answer, "yes", AnswerType.CLOSED,
                       metadata={"tool_calls": list(calls), "annotations": annotations or {}})


@pytest.fixture
def shaped():
    return ToolUseShaping(RuleReward(), bonus=0.2, redundancy_penalty=0.1, grounding_weight=0.5)


def test_bonus_needs_both_a_tool_and_a_right_answer(shaped):
    tool_right, tool_wrong, no_tool_right, failed_tool_right = shaped([
        _s("yes", [_zoom([0, 0, 5, 5])]), _s("no", [_zoom([0, 0, 5, 5])]), _s("yes"),
        _s("yes", [_zoom([0, 0, 5, 5], error="bad box")]),
    ])
    assert tool_right.total == pytest.approx(1.2) and tool_right.components["tools/bonus"] == 0.2
    assert tool_wrong.total == pytest.approx(-1.0)
    assert no_tool_right.total == pytest.approx(1.0)
    assert failed_tool_right.total == pytest.approx(1.0) and failed_tool_right.components["tools/used"] == 0.0


def test_redundant_identical_calls_are_penalised(shaped):
    calls = [_zoom([0, 0, 5, 5]), _zoom([0, 0, 5, 5]), _zoom([0, 0, 5, 5]), _zoom([1, 0, 5, 5])]
    assert redundant_calls(calls) == 2
    out = shaped([_s("yes", calls)])[0]
    assert out.components["tools/penalty"] == pytest.approx(0.2) and out.total == pytest.approx(1.0)


def test_grounding_reward_is_iou_with_annotation(shaped):
    # region [20, 10, 40, 30] vs box [10, 10, 30, 30]: inter 200, union 600
    out = shaped([_s("yes", [_zoom([20, 10, 40, 30])], BOX)])[0]
    assert out.components["tools/grounding_iou"] == pytest.approx(1 / 3)
    assert out.total == pytest.approx(1.0 + 0.2 + 0.5 / 3)
    assert grounding_iou([_zoom([10, 10, 30, 30], index=1)], BOX) == 0.0   # another image
    assert grounding_iou([_zoom([10, 10, 30, 30])], {}) is None            # nothing annotated
    assert "tools/grounding" not in shaped([_s("yes", [_zoom([1, 1, 2, 2])])])[0].components


def test_malformed_tool_records_do_not_crash(shaped):
    calls = [{"name": "segment", "arguments": None, "data": {"region": "everywhere"}}, "not a dict",
             {"name": "x", "arguments": {"a": {1, 2}}, "data": None}]
    out = shaped([_s("yes", calls, BOX)])[0]
    assert out.components["tools/grounding_iou"] == 0.0 and out.total == pytest.approx(1.2)


def test_abstaining_base_stays_abstained():
    class Abstain(RuleReward):
        def __call__(self, batch):
            return [type(o)(None, o.components) for o in super().__call__(batch)]

    assert ToolUseShaping(Abstain())([_s("yes", [_zoom([0, 0, 5, 5])])])[0].total is None


def test_negative_weights_are_rejected():
    with pytest.raises(ValueError, match="bonus"):
        ToolUseShaping(RuleReward(), bonus=-1)
