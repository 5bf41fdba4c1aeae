"""The protocol's verdict on constructed numbers: GRPO "beats" a baseline only when the whole Welch
interval of the difference lies above 0 -- not when it straddles 0, not on a positive point estimate,
not below -- and "beats every baseline" needs every comparison. The interval itself is checked
against scipy's Welch t-test (``ttest_ind(equal_var=False)``), computed independently of the code."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from train import protocol

GRPO = [0.62, 0.58, 0.60, 0.64, 0.56]                   # mean 0.60, sd 0.032


@pytest.mark.parametrize("baseline,beats", [
    ([0.40, 0.42, 0.38], True),                          # interval wholly above 0
    ([0.58, 0.52, 0.61], False),                         # point estimate +0.03 > 0, interval straddles 0
    ([0.61, 0.59, 0.62], False),                         # straddles, point estimate below 0
    ([0.80, 0.82, 0.78], False),                         # wholly below 0: GRPO is worse
])
def test_beats_only_when_the_welch_interval_excludes_zero_from_above(baseline, beats):
    d = protocol.welch_difference(GRPO, baseline)
    welch = stats.ttest_ind(GRPO, baseline, equal_var=False).confidence_interval(0.95)
    assert (d["ci_low"], d["ci_high"]) == pytest.approx((welch.low, welch.high), rel=1e-9)
    assert d["difference"] == pytest.approx(sum(GRPO) / 5 - sum(baseline) / 3)
    assert d["beats"] is beats
    assert (d["ci_low"] > 0) is beats                    # the rule, stated on the interval


def test_the_level_widens_the_interval_and_can_change_the_verdict():
    baseline = [0.55, 0.53, 0.57]                        # +0.05: beaten at 80 %, not at 99 %
    loose, strict = protocol.welch_difference(GRPO, baseline, level=0.8), protocol.welch_difference(GRPO, baseline, level=0.99)
    for level, d in ((0.8, loose), (0.99, strict)):
        welch = stats.ttest_ind(GRPO, baseline, equal_var=False).confidence_interval(level)
        assert (d["ci_low"], d["ci_high"]) == pytest.approx((welch.low, welch.high), rel=1e-9)
    assert loose["beats"] and not strict["beats"]


def test_a_difference_of_exactly_zero_is_not_a_win_and_no_spread_is_a_sure_one():
    # five seeds on one reading (values exact in binary, so the difference is exactly 0 or 0.25)
    tie = protocol.welch_difference([0.5] * 5, [0.5])
    assert tie["ci_low"] == tie["ci_high"] == 0.0 and not tie["beats"]
    d = protocol.welch_difference([0.75] * 5, [0.5])
    assert d["ci_low"] == d["ci_high"] == 0.25 and d["beats"]


def _run(out, name, value):
    (out / name).mkdir(parents=True)
    rows = [{"step": 0, "eval/open/armed_avg": 0.3}, {"step": 5, "eval/open/armed_avg": value}]
    (out / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / name / "DONE").write_text("{}")
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps({"name": name, "rc": 0, "cpu_s": 1.0}) + "\n")


@pytest.mark.parametrize("notool", [[0.58, 0.52, 0.61, 0.57, 0.62], [0.40, 0.42, 0.38, 0.41, 0.39]])
def test_the_open_report_beats_every_baseline_only_when_each_comparison_does(tmp_path, notool):
    args = protocol.Args(out=str(tmp_path), answer_types="OPEN", baselines="notool_sft")
    for seed, (g, b) in enumerate(zip(GRPO, notool)):
        _run(tmp_path, f"grpo_s{seed}", g)
        _run(tmp_path, f"notool_sft_s{seed}", b)
    (tmp_path / "warm_start.json").write_text(json.dumps({"chosen_step": 25, "checkpoint": "x"}))
    (tmp_path / "warm_test").mkdir()
    (tmp_path / "warm_test" / "eval.json").write_text(json.dumps({"metrics": {"eval/open/armed_avg": 0.30}}))
    result = protocol.report(args, tmp_path)
    assert result["metric"] == "eval/open/armed_avg" and set(result["grpo_minus"]) == {"notool_sft", "warm_start"}
    assert result["grpo_minus"]["warm_start"]["beats"]                      # 0.60 vs a constant 0.30
    welch = stats.ttest_ind(GRPO, notool, equal_var=False).confidence_interval(0.95)
    assert result["grpo_minus"]["notool_sft"]["ci_low"] == pytest.approx(welch.low, rel=1e-9)
    assert result["grpo_minus"]["notool_sft"]["beats"] is bool(welch.low > 0)
    assert result["beats_every_baseline"] is bool(welch.low > 0)                # one loss is enough to lose
