"""Teeth on the learning protocol's choices and verdict rule (issue 42), on constructed numbers.

Each test pins one edge of a rule the records' verdicts rest on: which warm start is chosen (the
forced-call score, then the sampled one, each keeping what is within two standard errors of the
best, then the latest step), when a GRPO seed "took off", the answer baselines' bound, which values
are the statistics' units (seeds, or tool builds when seeds share them) and when a difference
"beats". Written against the mutation run of ``benchmarks/mutation.py`` (train/protocol.py): each
assertion is there because a one-token change of the rule passed the earlier tests. Fast: no model,
no subprocess.
"""

from __future__ import annotations

import math

import pytest
from scipy import stats

from train import protocol
from train.protocol import Args


def cand(forced=None, forced_se=None, sampled=None, sampled_se=None, **extra):
    out = dict(extra)
    for k, v in (("forced", forced), ("forced_se", forced_se), ("sampled", sampled), ("sampled_se", sampled_se)):
        if v is not None:
            out[k] = v
    return out


# ---------------------------------------------------------------------------------------------
# choose_warm_start
# ---------------------------------------------------------------------------------------------
def test_the_checkpoint_that_reads_the_tool_is_chosen_over_a_blind_favourite():
    """Build 2's case: step 50 cannot read the tool (forced 0.48), step 150 can (0.72); the greedy
    figure (one question ahead at step 50) is not a measure of the rule and changes nothing."""
    c = protocol.choose_warm_start({50: cand(0.48, 0.05, 0.52, 0.03, greedy=0.505),
                                    150: cand(0.718, 0.045, 0.55, 0.03, greedy=0.495)})
    assert c["chosen_step"] == 150 and c["within_noise"] is False
    assert [s["measure"] for s in c["stages"]] == ["forced", "sampled"]
    assert c["stages"][0] == {"measure": "forced", "best_step": 150, "best": 0.718, "floor": round(0.718 - 0.09, 6),
                              "kept": [150]}
    assert c["stages"][1]["kept"] == [150] and c["stages"][1]["best_step"] == 150
    assert c["rule"] == protocol.CHOICE_RULE
    # the same figures with the steps swapped: the rule follows the figures, not the step numbers
    c = protocol.choose_warm_start({50: cand(0.718, 0.045, 0.55, 0.03), 150: cand(0.48, 0.05, 0.52, 0.03)})
    assert c["chosen_step"] == 50


def test_the_forced_score_decides_first_and_the_sampled_one_only_among_what_it_kept():
    # 25 has the best sampled score, but the forced stage drops it (0.60 < 0.80 - 2 * 0.02)
    c = protocol.choose_warm_start({25: cand(0.60, 0.02, 0.90, 0.01), 50: cand(0.80, 0.02, 0.60, 0.02),
                                    75: cand(0.79, 0.02, 0.50, 0.02)})
    assert c["stages"][0]["kept"] == [50, 75]
    assert c["stages"][1]["kept"] == [50] and c["stages"][1]["best_step"] == 50
    assert c["chosen_step"] == 50 and not c["within_noise"]


def test_within_two_standard_errors_is_kept_at_the_edge_and_dropped_past_it():
    # floor = 0.80 - 2 * 0.05 = 0.70: exactly 0.70 stays, 0.6999 goes (1e-12 of float slack, no more)
    c = protocol.choose_warm_start({10: cand(0.70, 0.05), 20: cand(0.80, 0.05), 5: cand(0.6999, 0.05)})
    assert c["stages"][0]["kept"] == [10, 20] and c["stages"][0]["floor"] == pytest.approx(0.70)
    assert c["chosen_step"] == 20 and c["within_noise"] is True
    # the floor is two SE of the *best* candidate, not one, not three
    c = protocol.choose_warm_start({10: cand(0.74, 0.01), 20: cand(0.80, 0.03)})  # 0.74 = 0.80 - 2 * 0.03
    assert c["stages"][0]["kept"] == [10, 20]
    c = protocol.choose_warm_start({10: cand(0.7399, 0.01), 20: cand(0.80, 0.03)})
    assert c["stages"][0]["kept"] == [20]
    c = protocol.choose_warm_start({10: cand(0.76, 0.01), 20: cand(0.80, 0.03)})  # inside 2 SE, outside 1 SE
    assert c["stages"][0]["kept"] == [10, 20]


def test_when_the_measures_cannot_tell_them_apart_the_latest_step_wins():
    same = cand(0.70, 0.03, 0.60, 0.03)
    c = protocol.choose_warm_start({100: same, 25: same, 50: same})
    assert c["chosen_step"] == 100 and c["within_noise"] is True
    assert c["stages"][0]["best_step"] == 100  # a tie on the best goes to the later step too
    assert c["stages"][0]["kept"] == [25, 50, 100]  # in step order
    # one candidate: chosen, and not "within noise"
    c = protocol.choose_warm_start({40: same})
    assert c["chosen_step"] == 40 and c["within_noise"] is False


def test_a_candidate_without_a_measure_drops_out_and_a_missing_se_is_zero():
    # 30 was never probed with a forced call: it cannot be chosen by the forced-call stage
    c = protocol.choose_warm_start({30: cand(sampled=0.9, sampled_se=0.01), 60: cand(0.7, 0.02, 0.5, 0.02)})
    assert c["stages"][0]["kept"] == [60] and c["chosen_step"] == 60
    # no forced figure anywhere: that stage is skipped, the sampled one decides
    c = protocol.choose_warm_start({30: cand(sampled=0.9, sampled_se=0.01), 60: cand(sampled=0.5, sampled_se=0.01)})
    assert [s["measure"] for s in c["stages"]] == ["sampled"] and c["chosen_step"] == 30
    # no SE: the floor is the best itself, only ties with it stay
    c = protocol.choose_warm_start({30: cand(0.7), 60: cand(0.69), 90: cand(0.7)})
    assert c["stages"][0]["floor"] == 0.7 and c["stages"][0]["kept"] == [30, 90] and c["chosen_step"] == 90
    # no measure at all: the latest of all candidates
    assert protocol.choose_warm_start({30: {}, 60: {}})["chosen_step"] == 60
    with pytest.raises(ValueError, match="at least one warm-start candidate"):
        protocol.choose_warm_start({})


def test_greedy_lead_is_the_blind_choice_with_its_binomial_noise():
    c = protocol.greedy_lead({25: 0.50, 50: 0.515, 75: 0.505}, 200)
    assert c["step"] == 50 and c["lead"] == pytest.approx(0.01)
    assert c["val_se"] == pytest.approx(math.sqrt(0.515 * 0.485 / 200))
    assert c["within_noise"] is True
    c = protocol.greedy_lead({25: 0.50, 50: 0.90}, 200)
    assert c["step"] == 50 and c["lead"] == pytest.approx(0.40) and c["within_noise"] is False
    # ties: the later step (what the protocol chose by before issue 42)
    assert protocol.greedy_lead({25: 0.5, 50: 0.5, 10: 0.5}, 32)["step"] == 50
    # the lead against two SE: just inside and just outside
    se = math.sqrt(0.8 * 0.2 / 100)  # 0.04
    assert protocol.greedy_lead({1: 0.8, 2: 0.8 - 2 * se + 1e-6}, 100)["within_noise"] is True
    assert protocol.greedy_lead({1: 0.8, 2: 0.8 - 2 * se - 1e-3}, 100)["within_noise"] is False
    # one candidate has no runner-up; a figure above 1 (ARMed-like) is clipped for its SE
    one = protocol.greedy_lead({5: 0.7}, 10)
    assert one["lead"] is None and one["within_noise"] is False and one["step"] == 5
    assert protocol.greedy_lead({1: 1.2, 2: 0.0}, 10)["val_se"] == 0.0
    assert protocol.greedy_lead({1: 0.5, 2: 0.4}, 0)["val_se"] == pytest.approx(0.5)  # n 0 counts as 1


# ---------------------------------------------------------------------------------------------
# took_off and the answer baselines' bound
# ---------------------------------------------------------------------------------------------
def test_took_off_needs_half_the_rollouts_calling_and_a_figure_above_the_bound():
    assert protocol.TOOK_OFF_CALL_RATE == 0.5
    assert protocol.took_off({"sampled_call_rate_last": 0.5, "metric": 0.70}, 0.673) is True  # exactly half
    assert protocol.took_off({"sampled_call_rate_last": 0.49, "metric": 0.90}, 0.673) is False
    assert protocol.took_off({"sampled_call_rate_last": 1.0, "metric": 0.673}, 0.673) is False  # at the bound: not above
    assert protocol.took_off({"sampled_call_rate_last": 1.0, "metric": 0.6731}, 0.673) is True
    assert protocol.took_off({"sampled_call_rate_last": None, "metric": 0.9}, 0.5) is False
    assert protocol.took_off({"metric": 0.9}, None) is False  # no call rate logged: not shown to take off
    assert protocol.took_off({"sampled_call_rate_last": 0.8, "metric": 0.1}, None) is True  # no bound: calls only
    assert protocol.took_off({"sampled_call_rate_last": 0.0, "metric": 0.1}, None) is False


def test_the_answer_bound_is_the_best_answer_baseline_plus_196_binomial_errors():
    rows = {"constant": {"mean": 0.5}, "question_prior": {"mean": 0.4375},
            "tool_sft": {"mean": 0.95}, "warm_start": {"mean": 0.9}}  # trained rows are not answer baselines
    assert protocol.answer_bound(rows, 32) == pytest.approx(0.5 + 1.96 * math.sqrt(0.25 / 32))
    assert protocol.answer_bound({"question_prior": {"mean": 0.6}}, 100) == pytest.approx(0.6 + 1.96 * math.sqrt(0.24 / 100))
    assert protocol.answer_bound({"constant": {"mean": 0.3}, "question_prior": {"mean": 0.6}}, 100) == \
        pytest.approx(0.6 + 1.96 * math.sqrt(0.24 / 100))  # the larger of the two
    assert protocol.answer_bound({"tool_sft": {"mean": 0.9}}, 100) is None
    assert protocol.answer_bound({"constant": {"mean": 1.0}}, 100) == 1.0  # no spread at the top
    assert protocol.answer_bound({"constant": {"mean": 0.5}}, 0) == pytest.approx(0.5 + 1.96 * 0.5)  # n 0 as 1


# ---------------------------------------------------------------------------------------------
# the units: seeds, or tool builds when seeds share them
# ---------------------------------------------------------------------------------------------
def test_builds_and_independence():
    assert [protocol.build_of(Args(tool_builds=3), s) for s in range(5)] == [0, 1, 2, 0, 1]
    assert [protocol.build_of(Args(), s) for s in range(5)] == [0, 1, 2, 3, 4]
    assert [protocol.build_of(Args(tool_builds=1), s) for s in range(3)] == [0, 0, 0]
    assert protocol.build_of(Args(tool_builds=3, tools="ground=oracle"), 4) == 0  # nothing trained: one build
    assert protocol.build_of(Args(tools="ground=oracle"), 4) == 4
    assert protocol.builds_of(Args(tool_builds=3, seeds="4,0,1,3")) == [0, 1]
    assert protocol.builds_of(Args(seeds="3,1,2")) == [1, 2, 3]
    assert protocol.independent(Args(seeds="0,1,2,3,4")) is True
    assert protocol.independent(Args(seeds="0,1,2,3,4", tool_builds=3)) is False
    assert protocol.independent(Args(seeds="0,1,2", tool_builds=3)) is True  # one seed per build
    assert protocol.independent(Args(seeds="0,3", tool_builds=3)) is False
    assert protocol.independent(Args(seeds="0,1", tools="ground=oracle", tool_builds=2)) is False


def test_unit_values_count_each_build_once():
    shared = Args(tool_builds=3, seeds="0,1,2,3,4")
    assert protocol.unit_values(shared, {0: 0.9, 1: 0.8, 2: 0.5, 3: 0.7, 4: 0.6}) == {0: 0.8, 1: 0.7, 2: 0.5}
    got = protocol.unit_values(shared, {3: 0.7, 0: 0.9, 4: 0.6, 1: 0.8, 2: 0.5})
    assert list(got) == [0, 1, 2]  # in build order whatever the seeds' order
    assert protocol.unit_values(Args(tool_builds=2, seeds="0,1,2"), {0: 0.1, 1: 0.2, 2: 0.4}) == {0: 0.25, 1: 0.2}
    # the mean is rounded to 12 places (so 0.1/3-type sums compare equal), not to fewer
    v = protocol.unit_values(Args(tool_builds=1, seeds="0,1,2"), {0: 0.1, 1: 0.2, 2: 0.4})[0]
    assert v == round(0.7 / 3, 12) and v != round(0.7 / 3, 2)
    independent = Args(seeds="0,1,2")
    values = {0: 0.9, 1: 0.8, 2: 0.1}
    got = protocol.unit_values(independent, values)
    assert got == values and got is not values  # the seeds themselves, a copy


# ---------------------------------------------------------------------------------------------
# the verdict: paired and Welch intervals, "beats"
# ---------------------------------------------------------------------------------------------
def test_t_interval_matches_scipy_and_a_single_value_has_none():
    values = [0.62, 0.58, 0.60, 0.64, 0.56]
    mean, sd, low, high = protocol.t_interval(values)
    ref = stats.t.interval(0.95, len(values) - 1, loc=sum(values) / 5, scale=stats.sem(values))
    assert (mean, low, high) == pytest.approx((0.6, *ref))
    assert sd == pytest.approx(stats.tstd(values))
    wide = protocol.t_interval(values, 0.99)
    assert wide[2] < low and wide[3] > high
    one = protocol.t_interval([0.7])
    assert one[0] == 0.7 and all(math.isnan(v) for v in one[1:])  # no spread from one value: no interval


def test_welch_difference_matches_scipy():
    a, b = [0.62, 0.58, 0.60, 0.64, 0.56], [0.58, 0.52, 0.61, 0.57, 0.62]
    got = protocol.welch_difference(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert got["difference"] == pytest.approx(0.6 - 0.58)
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((ref.low, ref.high))
    assert got["beats"] is bool(ref.low > 0)
    narrow = protocol.welch_difference(a, b, 0.5)
    assert narrow["ci_low"] > got["ci_low"]


def test_paired_difference_pairs_the_shared_seeds_only():
    a, b = {0: 0.9, 1: 0.8, 2: 0.85, 7: 0.1}, {0: 0.8, 1: 0.72, 2: 0.76, 9: 0.99}
    d = protocol.paired_difference(a, b)
    diffs = [0.1, 0.08, 0.09]
    mean, _, low, high = protocol.t_interval(diffs)
    assert d["pairs"] == 3 and d["difference"] == pytest.approx(0.09)
    assert (d["ci_low"], d["ci_high"]) == pytest.approx((low, high))
    assert d["beats"] is True
    ref = stats.ttest_rel([0.9, 0.8, 0.85], [0.8, 0.72, 0.76]).confidence_interval(0.95)
    assert (d["ci_low"], d["ci_high"]) == pytest.approx((ref.low, ref.high))
    assert protocol.paired_difference(a, b, 0.999)["ci_low"] < d["ci_low"]  # the level reaches the interval
    # two pairs are enough, one is not
    assert protocol.paired_difference({0: 0.9, 1: 0.8}, {0: 0.8, 1: 0.6})["pairs"] == 2
    assert protocol.paired_difference({0: 0.9, 5: 0.8}, {0: 0.8, 6: 0.6}) is None
    # an interval touching 0 from above is not a win
    assert protocol.paired_difference({0: 0.9, 1: 0.8}, {0: 0.9, 1: 0.8})["beats"] is False
    # a constant positive difference is a sure one
    assert protocol.paired_difference({0: 0.9, 1: 0.8}, {0: 0.8, 1: 0.7})["beats"] is True


def test_compare_lets_the_paired_interval_decide_where_the_units_pair_up():
    # the builds' spread is shared: Welch straddles 0, the paired interval does not
    grpo, base = {0: 0.9, 1: 0.6, 2: 0.75}, {0: 0.85, 1: 0.55, 2: 0.70}
    c = protocol.compare(grpo, base)
    assert c["beats"] is True and c["paired"]["beats"] is True
    assert protocol.welch_difference(list(grpo.values()), list(base.values()))["beats"] is False
    assert c["ci_low"] == pytest.approx(protocol.welch_difference(list(grpo.values()), list(base.values()))["ci_low"])
    # the paired interval can also take a win away
    grpo, base = {0: 0.95, 1: 0.94, 2: 0.93}, {0: 0.5, 1: 0.96, 2: 0.2}
    c = protocol.compare(grpo, base)
    assert c["paired"]["beats"] is False and c["beats"] is False
    # one baseline value (an answer baseline): Welch against it, no pairing
    c = protocol.compare({0: 0.9, 1: 0.8, 2: 0.85}, {0: 0.5})
    assert "paired" not in c and c["beats"] is True
    # baselines on other units than GRPO's: nothing pairs, Welch decides
    c = protocol.compare({0: 0.9, 1: 0.8}, {5: 0.1, 6: 0.2})
    assert "paired" not in c and c["beats"] is protocol.welch_difference([0.9, 0.8], [0.1, 0.2])["beats"]
