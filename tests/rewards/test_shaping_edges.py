"""Tool-use shaping where mutation testing found survivors (benchmarks/mutation.py): what makes two
calls identical, which image a region and a box are on, the defaults, and delegation to the base."""

from __future__ import annotations

import pytest

from medvqa_env.records import AnswerType
from rewards.base import RewardInput, RewardOutput
from rewards.rule import RuleReward
from rewards.shaping import ToolUseShaping, grounding_iou, redundant_calls


def _call(name="image_zoom_in", arguments=None, **extra):
    return {"name": name, "arguments": arguments if arguments is not None else {"bbox": [0, 0, 5, 5]}, **extra}


def test_calls_are_identical_by_name_and_arguments_whatever_the_key_order():
    same = [_call(arguments={"bbox": [0, 0, 5, 5], "index": 0}), _call(arguments={"index": 0, "bbox": [0, 0, 5, 5]})]
    assert redundant_calls(same) == 1
    assert redundant_calls([_call(), _call(name="segment")]) == 0                      # another tool
    assert redundant_calls([_call(), _call(arguments={"bbox": [0, 0, 6, 6]})]) == 0    # other arguments
    odd = {(0, 0): 5}                                                                  # not JSON: compared by repr
    assert redundant_calls([_call(arguments=odd), _call(arguments=odd), _call(arguments={(1, 1): 5})]) == 1
    assert redundant_calls([_call(arguments=odd), _call(name="segment", arguments=odd)]) == 0


def _zoom(region, index=None, error=None):
    data = {"region": region} if index is None else {"region": region, "image_index": index}
    return {"name": "image_zoom_in", "arguments": {}, "error": error, "data": data}


def test_grounding_compares_a_region_with_boxes_on_its_own_image():
    boxes = {"boxes": [{"bbox": [0, 0, 10, 10]}, {"bbox": [20, 20, 30, 30], "image_index": 1}]}
    assert grounding_iou([_zoom([0, 0, 10, 10])], boxes) == pytest.approx(1.0)          # no index: image 0
    assert grounding_iou([_zoom([20, 20, 30, 30])], boxes) == 0.0                       # that box is on image 1
    assert grounding_iou([_zoom([20, 20, 30, 30], index=1)], boxes) == pytest.approx(1.0)
    # a failed call's region does not count, and does not stop a later call from counting
    assert grounding_iou([_zoom([0, 0, 10, 10], error="timed out"), _zoom([0, 0, 10, 5])], boxes) == pytest.approx(0.5)
    assert grounding_iou([{"name": "x", "data": "not a mapping"}, _zoom([0, 0, 10, 10])], boxes) == pytest.approx(1.0)


def test_the_defaults_and_the_name():
    shaped = ToolUseShaping(RuleReward())
    assert (shaped.bonus, shaped.redundancy_penalty, shaped.grounding_weight) == (0.2, 0.1, 0.2)
    assert shaped.name == "rule+tools"
    ToolUseShaping(RuleReward(), bonus=0.0, redundancy_penalty=0.0, grounding_weight=0.0)   # zero is allowed
    for label in ("bonus", "redundancy_penalty", "grounding_weight"):
        with pytest.raises(ValueError, match=f"expected {label} >= 0"):
            ToolUseShaping(RuleReward(), **{label: -0.1})


def test_components_are_named_as_documented():
    sample = RewardInput(r"\boxed{yes}", "yes", "yes", AnswerType.CLOSED, metadata={
        "tool_calls": [_zoom([0, 0, 10, 10])], "annotations": {"boxes": [{"bbox": [0, 0, 10, 10]}]}})
    comps = ToolUseShaping(RuleReward()).score(sample).components
    assert {"tools/used", "tools/bonus", "tools/redundant_calls", "tools/penalty", "tools/grounding_iou",
            "tools/grounding"} <= set(comps)


class _NoAccuracy(RuleReward):
    """A base reward without an ``accuracy`` component: shaping judges the answer itself."""

    name = "noacc"

    def __call__(self, batch):
        return [RewardOutput(0.0, {}) for _ in batch]


def test_without_an_accuracy_component_the_answer_is_judged_by_the_rule():
    right = RewardInput(r"\boxed{yes}", "yes", "yes", AnswerType.CLOSED, metadata={"tool_calls": [_zoom([0, 0, 1, 1])]})
    wrong = RewardInput(r"\boxed{no}", "no", "yes", AnswerType.CLOSED, metadata={"tool_calls": [_zoom([0, 0, 1, 1])]})
    a, b = ToolUseShaping(_NoAccuracy(), bonus=0.3)([right, wrong])
    assert a.components["tools/bonus"] == 0.3 and b.components["tools/bonus"] == 0.0


class _Stateful(RuleReward):
    name = "stateful"

    def __init__(self):
        super().__init__()
        self.seen = []

    def end_batch(self, batch_id=None):
        self.seen.append(("end_batch", batch_id))
        return {"moved": batch_id}

    def state_dict(self):
        return {"x": 1}

    def load_state_dict(self, state):
        self.seen.append(("load", state))

    def close(self):
        self.seen.append(("close",))


def test_state_and_batch_ends_go_to_the_base():
    base = _Stateful()
    shaped = ToolUseShaping(base)
    assert shaped.end_batch(4) == {"moved": 4} and shaped.state_dict() == {"x": 1}
    shaped.load_state_dict({"y": 2})
    shaped.close()
    assert base.seen == [("end_batch", 4), ("load", {"y": 2}), ("close",)]
    ToolUseShaping(RuleReward()).close()                                  # a base without close: nothing to do
