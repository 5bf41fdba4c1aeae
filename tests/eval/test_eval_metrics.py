"""Aggregation: pass@K, format failure@K, unique answers@K, tool rates, CIs, a fixed schema."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings, strategies as st

from eval.metrics import pass_at_k, ratio_with_ci, summarize
from eval.summary import METRIC_NAMES, EvalSummary


@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
@settings(max_examples=60, deadline=None)
def test_pass_at_k_is_the_probability_that_k_draws_include_a_correct_one(nck):
    n, c, k = nck
    draws = list(itertools.combinations([1] * c + [0] * (n - c), k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="expected 0 <= c <= n"):
        pass_at_k(2, 3, 1)


def test_ratio_ci_brackets_the_value_and_is_seeded():
    num, den = [1, 0, 1, 1, 0, 1, 1, 1], [1] * 8
    a, b = ratio_with_ci(num, den, 500, seed=1), ratio_with_ci(num, den, 500, seed=1)
    assert a == b and a.value == 0.75 and a.n == 8
    assert 0.0 <= a.ci_low <= 0.75 <= a.ci_high <= 1.0


def row(rid, sample, kind="CLOSED", correct=False, pred="yes", fmt=True, error=None, metrics=None,
        calls=0, invalid=0, errors=0, malformed=0, dataset="d", modality="CT"):
    return {"key": f"{rid}#{sample}", "record_id": rid, "sample": sample, "answer_type": kind, "correct": correct,
            "exact_match": correct, "prediction": pred, "format_ok": fmt, "error": error, "metrics": metrics or {},
            "reward": 1.0 if correct else -1.0, "judge": None, "turns": 1 + calls, "dataset": dataset,
            "modality": modality, "organ": None,
            "tool_stats": {"calls": calls, "by_tool": {"image_zoom_in": calls} if calls else {},
                           "malformed": malformed, "invalid": invalid, "errors": errors},
            "timing": {"total_s": 0.1, "agent_s": 0.0, "env_s": 0.1}}


def test_summary_of_known_rows():
    om = lambda v: {"bleu1": v, "rouge1": v, "bertscore": v, "cossim": v, "armed_avg": v}  # noqa: E731
    rows = [
        # q1 CLOSED: 1 of 2 right -> pass@1 0.5, pass@2 1
        row("q1", 0, correct=True), row("q1", 1, pred="no"),
        # q2 CLOSED: no parseable answer in either sample -> format failure@2
        row("q2", 0, pred=None, fmt=False), row("q2", 1, pred=None, fmt=False),
        # q3 OPEN, two different answers; ARMed avg 0.2 and 0.6
        row("q3", 0, "OPEN", pred="lung", metrics=om(0.2), calls=2, invalid=1),
        row("q3", 1, "OPEN", pred="Lung.", metrics=om(0.6), calls=2, errors=1),
        # q4: the image was missing -> counted, not scored
        row("q4", 0, pred=None, error={"kind": "dataset_error", "message": "gone"}, dataset="e"),
        row("q4", 1, pred=None, error={"kind": "dataset_error", "message": "gone"}, dataset="e"),
    ]
    s = summarize(rows, k=2, resamples=200)
    g = s.overall
    assert (s.n_episodes, s.n_questions, s.errors_by_kind) == (8, 4, {"dataset_error": 2})
    assert g.closed_accuracy.value == pytest.approx(1 / 4) and g.closed_accuracy.n == 4
    assert g.armed_open_avg.value == pytest.approx(0.4) and g.bleu1.n == 2
    assert g.armed_score.value == pytest.approx((1 + 0.2 + 0.6) / 6)
    assert g.pass_at_1.value == pytest.approx((0.5 + 0 + 0) / 3)
    assert g.pass_at_k.value == pytest.approx(1 / 3)
    assert g.format_failure_at_k.value == pytest.approx(1 / 3)
    assert g.unique_answers_at_k.value == pytest.approx((2 + 0 + 1) / 3)  # "lung" == "Lung." once normalised
    assert g.tool_calls_per_episode.value == pytest.approx(4 / 6)
    assert g.invalid_call_rate.value == pytest.approx(1 / 4)
    assert g.tool_error_rate.value == pytest.approx(1 / 3)
    assert g.tool_calls_by_tool["image_zoom_in"].value == pytest.approx(4 / 6)
    assert set(s.by_dataset) == {"d", "e"} and s.by_dataset["e"].n_errors == 2
    assert s.by_dataset["e"].closed_accuracy.value is None  # nothing scored there
    assert set(s.by_answer_type) == {"CLOSED", "OPEN"}
    assert s.metrics_available == {"open_metrics": True, "judge": False}


def test_schema_is_the_same_with_no_rows_and_round_trips_json():
    empty = summarize([], k=4).to_dict()
    full = summarize([row("q1", 0, correct=True)], k=4).to_dict()
    assert set(empty) == set(full) and set(empty["overall"]) == set(full["overall"])
    assert all(empty["overall"][m] == {"value": None, "ci_low": None, "ci_high": None, "n": 0} for m in METRIC_NAMES)
    again = EvalSummary.from_dict(json.loads(json.dumps(full)))
    assert again.to_dict() == full
