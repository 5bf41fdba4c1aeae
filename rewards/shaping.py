"""Tool-use shaping on top of any reward (off by default; ``build_reward("default+tools")``).

    total = base + bonus · [a tool ran ∧ answer right]
                 - redundancy_penalty · (#repeated identical calls)
                 + grounding_weight · max IoU(tool region, annotated box)

* The bonus never pays for a tool call alone: a wrong answer gets nothing, so a policy cannot farm
  it by calling tools and guessing.
* A call is *repeated* when an earlier call of the same episode had the same name and the same
  arguments (compared as canonical JSON).
* Grounding needs ``metadata["tool_calls"][i]["data"]["region"]`` (zoom, segment, grounding tools
  report the pixel box they looked at) and ``metadata["annotations"]["boxes"]``; it uses the best
  IoU over calls and boxes on the same image (:func:`tool_backends.geometry.box_iou`). Without
  annotated boxes the term is absent (not 0) from the components.

>>> from medvqa_env.records import AnswerType
>>> from rewards.rule import RuleReward
>>> from rewards.base import RewardInput
>>> call = {"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 10, 10]}, "error": None,
...         "data": {"region": [0, 0, 10, 10], "image_index": 0}}
>>> s = RewardInput(r"\\boxed{yes}", "yes", "yes", AnswerType.CLOSED, metadata={
...     "tool_calls": [call, call],
...     "annotations": {"boxes": [{"label": "x", "bbox": [5, 0, 15, 10], "image_index": 0}]}})
>>> out = ToolUseShaping(RuleReward(), bonus=0.2, redundancy_penalty=0.1, grounding_weight=0.3).score(s)
>>> round(out.total, 4)      # 1 + 0.2 - 0.1 + 0.3 * (1/3)
1.2
>>> out.components["tools/redundant_calls"], round(out.components["tools/grounding_iou"], 4)
(1.0, 0.3333)
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from rewards.base import RewardFunction, RewardInput, RewardOutput
from rewards.rule import answer_matches


def _call_key(call: Mapping[str, Any]) -> str:
    try:
        args = json.dumps(call.get("arguments"), sort_keys=True, default=str)
    except (TypeError, ValueError):
        args = repr(call.get("arguments"))
    return f"{call.get('name')}|{args}"


def redundant_calls(calls: Sequence[Mapping[str, Any]]) -> int:
    """How many calls repeat an earlier identical (name, arguments) call."""
    seen: set[str] = set()
    repeats = 0
    for call in calls:
        key = _call_key(call)
        repeats += key in seen
        seen.add(key)
    return repeats


def grounding_iou(calls: Sequence[Mapping[str, Any]], annotations: Mapping[str, Any] | None) -> float | None:
    """Best IoU between a tool's ``data.region`` and an annotated box on the same image;
    ``None`` when there are no annotated boxes."""
    from tool_backends.geometry import box_iou

    boxes = list((annotations or {}).get("boxes") or [])
    if not boxes:
        return None
    best = 0.0
    for call in calls:
        data = call.get("data") or {}
        region = data.get("region") if isinstance(data, Mapping) else None
        if call.get("error") or not _is_box(region):
            continue
        index = int(data.get("image_index", 0) or 0)
        for box in boxes:
            if int(box.get("image_index", 0)) == index and _is_box(box.get("bbox")):
                best = max(best, box_iou([float(v) for v in region], [float(v) for v in box["bbox"]]))
    return best


def _is_box(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 4 and all(isinstance(v, (int, float)) for v in value)


class ToolUseShaping(RewardFunction):
    """Adds tool bonus, redundancy penalty and grounding reward to ``base`` (see module doc).

    Components are the base's plus ``tools/used``, ``tools/bonus``, ``tools/redundant_calls``,
    ``tools/penalty`` and, with annotated boxes, ``tools/grounding_iou`` and ``tools/grounding``.
    A sample the base abstains on stays abstained.
    """

    def __init__(self, base: RewardFunction, bonus: float = 0.2, redundancy_penalty: float = 0.1,
                 grounding_weight: float = 0.2) -> None:
        for label, v in (("bonus", bonus), ("redundancy_penalty", redundancy_penalty),
                         ("grounding_weight", grounding_weight)):
            if v < 0:
                raise ValueError(f"expected {label} >= 0, got {v!r}")
        self.base = base
        self.bonus, self.redundancy_penalty, self.grounding_weight = float(bonus), float(redundancy_penalty), float(grounding_weight)
        self.name = f"{base.name}+tools"

    @staticmethod
    def _correct(sample: RewardInput, base_out: RewardOutput) -> bool:
        if "accuracy" in base_out.components:
            return base_out.components["accuracy"] >= 1.0
        return answer_matches(sample)

    def __call__(self, batch: Sequence[RewardInput]) -> list[RewardOutput]:
        base_out = self.base(batch)
        out = []
        for s, r in zip(batch, base_out):
            calls = [c for c in (s.metadata.get("tool_calls") or []) if isinstance(c, Mapping)]
            used = any(not c.get("error") for c in calls)
            bonus = self.bonus if used and self._correct(s, r) else 0.0
            repeats = redundant_calls(calls)
            penalty = self.redundancy_penalty * repeats
            comps = dict(r.components)
            comps.update({"tools/used": float(used), "tools/bonus": bonus,
                          "tools/redundant_calls": float(repeats), "tools/penalty": penalty})
            iou = grounding_iou(calls, s.metadata.get("annotations"))
            grounding = 0.0
            if iou is not None:
                grounding = self.grounding_weight * iou
                comps.update({"tools/grounding_iou": iou, "tools/grounding": grounding})
            total = None if r.total is None else r.total + bonus - penalty + grounding
            out.append(RewardOutput(total, comps))
        return out

    def end_batch(self, batch_id: Any = None) -> dict[str, Any]:
        return self.base.end_batch(batch_id)

    def state_dict(self) -> dict[str, Any]:
        return self.base.state_dict()

    def close(self) -> None:
        getattr(self.base, "close", lambda: None)()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.base.load_state_dict(state)
