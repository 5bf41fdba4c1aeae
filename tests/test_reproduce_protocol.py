"""``benchmarks/reproduce_protocol.py`` (CI's small protocol rerun): what it compares, and what not."""

from __future__ import annotations


def test_means_are_held_to_the_tolerance_and_tool_hashes_are_shown_not_passed(load_benchmark):
    compare = load_benchmark("reproduce_protocol").compare
    reference = {"grpo.mean": 0.5, "grpo.seeds": 2, "tools_sha256": "aaaa,bbbb"}
    rows = {name: ok for name, _, _, ok in compare({"grpo.mean": 0.59, "grpo.seeds": 2, "tools_sha256": "cccc,dddd"},
                                                   reference)}
    assert rows == {"grpo.mean": True, "grpo.seeds": True, "tools_sha256": None}  # another machine's builds: not a pass
    rows = {name: ok for name, _, _, ok in compare({"grpo.mean": 0.61, "grpo.seeds": 1, "tools_sha256": "aaaa,bbbb"},
                                                   reference)}
    assert rows == {"grpo.mean": False, "grpo.seeds": False, "tools_sha256": None}


def test_grpo_seeds_that_took_off_must_all_take_off_again(load_benchmark):
    """CI guards learning (issue 42): a rerun in which a seed no longer takes off fails, whatever its mean."""
    compare = load_benchmark("reproduce_protocol").compare
    reference = {"grpo.mean": 0.8, "grpo.took_off_seeds": 2}
    assert all(ok for *_, ok in compare({"grpo.mean": 0.75, "grpo.took_off_seeds": 2}, reference))
    rows = {name: ok for name, _, _, ok in compare({"grpo.mean": 0.75, "grpo.took_off_seeds": 1}, reference)}
    assert rows == {"grpo.mean": True, "grpo.took_off_seeds": False}
