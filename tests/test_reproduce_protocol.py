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
