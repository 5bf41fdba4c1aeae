"""eval/scoring.py piece by piece: what one finished episode is worth.

Fast and model-free, so mutation testing (benchmarks/mutation.py) can run them for every mutant;
the real encoders' scores are checked in tests/eval/test_alternatives.py and test_languages.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eval.scoring import OPEN_METRICS, EpisodeScorer, OpenMetrics, is_invalid_call, score_episode, tool_stats
from medvqa_env.records import AnswerType, VQARecord
from tool_backends.base import ToolSpec

ZOOM = ToolSpec("zoom", "crop", {"type": "object", "properties": {"bbox": {"type": "array"}},
                                 "required": ["bbox"], "additionalProperties": False})
SPECS = {"zoom": ZOOM, "anything": None}


def record(answer: str, kind: str, **kw) -> VQARecord:
    return VQARecord("q1", ("x.png",), "What is shown?", answer, AnswerType.parse(kind), "demo", **kw)


# -- invalid calls ----------------------------------------------------------------------------
@pytest.mark.parametrize("call, invalid", [
    ({"name": "zoom", "arguments": {"bbox": [0, 0, 1, 1]}}, False),
    ({"name": "zoom", "arguments": {}}, True),                       # required argument missing
    ({"name": "zoom", "arguments": {"bbox": [0, 0, 1, 1], "x": 1}}, True),  # not in the schema
    ({"name": "zoom", "arguments": "bbox"}, True),                  # not an object
    ({"name": "zoom"}, True),                                       # no arguments at all
    ({"name": "segment", "arguments": {}}, True),                   # unknown tool
    ({"arguments": {}}, True),                                      # no name
    ({"name": "anything", "arguments": {"whatever": 1}}, False),    # a tool without a schema
])
def test_a_call_is_invalid_when_its_tool_is_unknown_or_its_arguments_fail_the_schema(call, invalid):
    assert is_invalid_call(call, SPECS) is invalid


# -- tool statistics --------------------------------------------------------------------------
def test_tool_stats_count_calls_per_tool_and_separate_malformed_invalid_and_failed():
    trace = [
        {"parsed": {"errors": ["Invalid JSON in <tool_call>: x.", "Bad value in the arguments of 'zoom'.",
                               'Missing "arguments" of a call.', "Answer missing.",
                               "Call 3 in <tool_call> not run: turn budget spent."]},
         "tool_calls": [{"name": "zoom", "error": None, "invalid": False},
                        {"name": "zoom", "error": "Unknown tool.", "invalid": True}]},
        {"parsed": None, "tool_calls": [{"name": "segment", "error": "timed out", "invalid": False},
                                        {"name": 7, "invalid": False},
                                        {"name": "segment", "error": "crashed", "invalid": False}]},
        {"tool_calls": None},
        {},
    ]
    s = tool_stats(trace)
    assert s["malformed"] == 3  # the three parse errors of a block; not the answer's, not "not run"
    assert s["calls"] == 5 and s["by_tool"] == {"zoom": 2, "segment": 2, "7": 1}
    assert s["invalid"] == 3 + 1 and s["errors"] == 2  # an invalid call's error is not a tool failure


def test_tool_stats_of_an_episode_without_tools_are_zero():
    assert tool_stats([]) == {"calls": 0, "by_tool": {}, "malformed": 0, "invalid": 0, "errors": 0}
    assert tool_stats([{"parsed": {"errors": []}, "tool_calls": []}])["calls"] == 0


# -- one answer's score -----------------------------------------------------------------------
def test_closed_answers_score_by_the_rule_and_exact_match_separately():
    s = score_episode(record("yes", "CLOSED"), "Yes, it is.", True)
    assert s["correct"] is True and s["exact_match"] is True and s["format_ok"] is True
    assert s["answer"] == "Yes, it is." and s["metrics"] == {} and "needs_open_metrics" not in s
    assert "references" not in s
    wrong = score_episode(record("yes", "CLOSED"), "no", False)
    assert wrong["correct"] is False and wrong["exact_match"] is False and wrong["format_ok"] is False
    missing = score_episode(record("no", "CLOSED"), None, False)
    assert missing["correct"] is False and missing["exact_match"] is False


def test_mcq_answers_score_by_their_letter():
    rec = record("B", "MCQ", options={"A": "CT", "B": "MRI"})
    assert score_episode(rec, "B", True)["correct"] is True
    assert score_episode(rec, "(B) MRI", True)["correct"] is True
    assert score_episode(rec, "A", True)["correct"] is False
    assert score_episode(rec, "CT and MRI", True)["correct"] is False  # two options named: no letter


def test_open_answers_are_correct_on_exact_match_and_ask_for_the_open_metrics():
    rec = record("left lung", "OPEN")
    s = score_episode(rec, "Left lung.", True)
    assert s["correct"] is True and s["exact_match"] is True and s["needs_open_metrics"] is True
    t = score_episode(rec, "the liver", True)
    assert t["correct"] is False and t["exact_match"] is False and t["needs_open_metrics"] is True


def test_alternatives_count_for_correct_and_exact_match_and_are_listed():
    rec = record("lung", "OPEN", metadata={"answer_alternatives": ["lungs", "pulmonary"]})
    s = score_episode(rec, "pulmonary", True)
    assert s["correct"] is True and s["exact_match"] is True and s["references"] == ["lung", "lungs", "pulmonary"]
    one = score_episode(record("lung", "OPEN", metadata={"answer_alternatives": ["lungs"]}), "lungs", True)
    assert one["references"] == ["lung", "lungs"] and one["correct"] is True
    side = record("left", "CLOSED", metadata={"answer_alternatives": ["left side"]})
    assert score_episode(side, "left side", True)["correct"] is True  # by the alternative only
    assert score_episode(side, "right", True)["correct"] is False


# -- the open metrics' combination (the metric functions themselves are the rewards') --------
class FixedScores:
    """Stand-ins for the lexical and semantic metric functions: a score per (prediction, reference)
    pair from a table, recording what they were asked (only the combination is under test here)."""

    def __init__(self, table, semantic_none=()):
        self.table, self.semantic_none, self.asked = table, set(semantic_none), []

    def lexical(self, preds, refs, stem=False):
        self.asked.append(("lexical", list(preds), list(refs), stem))
        return [self.table[p, r][0] for p, r in zip(preds, refs)], [self.table[p, r][1] for p, r in zip(preds, refs)]

    def semantic_scores(self, preds, refs):
        none = [r in self.semantic_none for r in refs]
        return ([None if n else self.table[p, r][2] for p, r, n in zip(preds, refs, none)],
                [None if n else self.table[p, r][3] for p, r, n in zip(preds, refs, none)])


def open_metrics(fixed: FixedScores, **options) -> OpenMetrics:
    metrics = OpenMetrics.__new__(OpenMetrics)  # skip loading the encoders: scores come from ``fixed``
    metrics.options, metrics._lexical, metrics._armed = dict(options), fixed.lexical, fixed
    return metrics


def test_each_open_metric_is_its_best_over_the_alternatives_and_armed_avg_their_mean():
    fixed = FixedScores({("lung", "lungs"): (0.2, 0.9, 0.5, 0.1), ("lung", "lung"): (1.0, 0.3, 0.4, 0.8),
                         ("liver", "lung"): (0.0, 0.0, 0.25, 0.35)})
    rows = open_metrics(fixed, stem=True)(["lung", "liver"], [["lungs", "lung"], "lung"])
    assert rows[0] == {"bleu1": 1.0, "rouge1": 0.9, "bertscore": 0.5, "cossim": 0.8, "armed_avg": 0.8}
    assert rows[1] == {"bleu1": 0.0, "rouge1": 0.0, "bertscore": 0.25, "cossim": 0.35, "armed_avg": 0.15}
    assert fixed.asked == [("lexical", ["lung", "lung", "liver"], ["lungs", "lung", "lung"], True)]


def test_a_missing_prediction_is_scored_as_empty_and_an_empty_reference_list_as_one_empty_reference():
    fixed = FixedScores({("", "x"): (0.0, 0.0, 0.1, 0.2), ("y", ""): (0.0, 0.0, 0.0, 0.0)})
    rows = open_metrics(fixed)([None, "y"], ["x", []])
    assert rows[0]["bertscore"] == 0.1 and rows[1]["armed_avg"] == 0.0
    assert fixed.asked[0][1:] == (["", "y"], ["x", ""], False)


def test_a_reference_the_encoders_cannot_read_averages_only_the_lexical_metrics():
    fixed = FixedScores({("肺", "肺"): (1.0, 0.5, 0.9, 0.9)}, semantic_none={"肺"})
    (row,) = open_metrics(fixed)(["肺"], ["肺"])
    assert row == {"bleu1": 1.0, "rouge1": 0.5, "armed_avg": 0.75}


def test_open_metrics_are_clipped_at_one_and_rounded_to_what_float32_holds():
    fixed = FixedScores({("a", "a"): (1.0, 1.5, 1.00000003, 0.1234567891)})
    (row,) = open_metrics(fixed)(["a"], ["a"])
    assert row["rouge1"] == 1.0 and row["bertscore"] == 1.0 and row["cossim"] == 0.123457
    assert row["armed_avg"] == round((1.0 + 1.5 + 1.00000003 + 0.1234567891) / 4, 6)


def test_open_metrics_refuse_mismatched_lengths_and_return_nothing_for_nothing():
    metrics = open_metrics(FixedScores({}))
    with pytest.raises(ValueError, match="as many predictions as references, got 2 and 1"):
        metrics(["a", "b"], ["a"])
    assert metrics([], []) == []
    assert OPEN_METRICS == ("bleu1", "rouge1", "bertscore", "cossim")


# -- the harness's per-episode hook -------------------------------------------------------------
def test_the_episode_hook_flags_invalid_calls_every_step_and_scores_only_at_the_end():
    scorer = EpisodeScorer(SimpleNamespace(specs=[ZOOM]))
    env = SimpleNamespace(record=record("yes", "CLOSED"))
    calls = [{"name": "zoom", "arguments": {"bbox": [0, 0, 1, 1]}}, {"name": "nope", "arguments": {}}]
    mid = {"info": {"tool_calls": calls}, "terminated": False, "truncated": False}
    scorer.on_step(env, mid)
    assert [c["invalid"] for c in calls] == [False, True] and "score" not in mid
    for end in ({"terminated": True, "truncated": False}, {"terminated": False, "truncated": True}):
        out = {"info": {"answer": "yes", "format_ok": 1}, **end}
        scorer.on_step(env, out)
        assert out["score"]["correct"] is True and out["score"]["format_ok"] is True
    unanswered = {"info": {}, "terminated": False, "truncated": True}
    scorer.on_step(env, unanswered)
    assert unanswered["score"]["answer"] is None and unanswered["score"]["correct"] is False
    assert unanswered["score"]["format_ok"] is False
    assert scorer.on_batch([mid]) is None
