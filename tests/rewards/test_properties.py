"""Property tests: ranges and invariants hold for arbitrary input (model output is data)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medvqa_env.records import AnswerType
from rewards.adaptive import AdaptiveConfig, AdaptiveThresholds, squash
from rewards.base import RewardInput
from rewards.rule import RuleReward
from rewards.text_metrics import bleu1, rouge1

unit = st.floats(-1.0, 1.0, allow_nan=False)


@given(unit, st.floats(0.0, 0.95), st.floats(0.1, 20), st.floats(0.1, 20))
def test_squash_stays_in_unit_interval_and_is_monotone(x, t, a_pos, a_neg):
    y = squash(x, t, a_pos, a_neg)
    assert 0.0 <= y < 1.0
    assert squash(min(x + 0.01, 1.0), t, a_pos, a_neg) >= y


@settings(deadline=None)  # a property, not a timing: under load one example may take seconds
@given(st.lists(st.lists(unit, max_size=20), max_size=15), st.floats(0.0, 0.2))
def test_thresholds_move_boundedly_and_stay_clipped(batches, delta):
    t = AdaptiveThresholds(AdaptiveConfig(delta_max=delta, buffer_size=16), metrics=["cosine"])
    for values in batches:
        before = t.current()["cosine"]
        t.observe({"cosine": values})
        assert t.current()["cosine"] == before
        after = t.end_batch()["cosine"]
        assert 0.0 <= after <= 0.95 and abs(after - before) <= delta + 1e-12
        assert len(t.buffers["cosine"]) <= 16


@settings(deadline=None)  # the first example imports rouge-score (lazily, in rewards.text_metrics)
@given(st.text(max_size=60), st.text(max_size=60))
def test_lexical_metrics_in_unit_interval(a, b):
    assert 0.0 <= bleu1(a, b) <= 1.0 and 0.0 <= rouge1(a, b) <= 1.0


@given(st.text(max_size=40), st.text(max_size=20), st.sampled_from(list(AnswerType)))
def test_rule_reward_never_crashes(answer, truth, kind):
    sample = RewardInput(answer, answer, truth or "yes", kind, options={"A": "CT", "B": truth or "MRI"})
    assert RuleReward().score(sample).total in (1.0, -1.0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=40), st.text(min_size=1, max_size=30), st.booleans())
def test_armed_total_in_range_for_any_text(armed, answer, truth, format_ok):
    out = armed([RewardInput(answer, answer, truth, AnswerType.OPEN, format_ok=format_ok)])[0]
    assert -1.0 <= out.total <= 1.0
    semantic = ("r_as",) if out.components["semantic"] else ()  # 0: the encoder cannot read the reference
    assert all(0.0 <= out.components[k] <= 1.0 for k in ("bleu1", "rouge1", "r_c", "r_total", *semantic))
