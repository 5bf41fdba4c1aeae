"""``benchmarks/reproduce_protocol.py`` (CI's small protocol rerun): what it compares, and what not."""

from __future__ import annotations

import json


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


def _result(rows: dict, seeds: str = "0,1", dirty: bool = False) -> dict:
    """A ``protocol.json`` as train.protocol.report writes it, reduced to what the script reads."""
    grpo = {"seeds": len(rows), "mean": sum(r["metric"] for r in rows.values()) / max(1, len(rows)),
            "per_seed": rows, "took_off_seeds": sum(r["took_off"] for r in rows.values()), "answer_bound": 0.673}
    return {"args": {"seeds": seeds, "eval_size": 32}, "tool_builds": 2, "beats_every_baseline": False,
            "rows": {"grpo": grpo, "constant": {"seeds": 1, "mean": 0.5}},
            "identity": {"tools": {}, "code": {"git_commit": "abc", "git_dirty": dirty}}}


OFF = {"took_off": True, "metric": 0.78, "sampled_call_rate_last": 0.92}
STUCK = {"took_off": False, "metric": 0.5, "sampled_call_rate_last": 0.25}


def test_a_seed_that_did_not_take_off_is_named_in_one_line(load_benchmark):
    check = load_benchmark("reproduce_protocol").took_off_failure
    assert check(_result({"0": OFF, "1": OFF})) is None
    line = check(_result({"0": OFF, "1": STUCK}))
    assert line.startswith("FAIL: GRPO did not take off on 1 of 2 seeds") and "\n" not in line
    assert "seed 1: sampled calls 0.25 at the last step, held-out 0.500 vs bound 0.673" in line and "seed 0" not in line
    # a seed whose run is missing did not take off either; no GRPO row at all is a failure too
    assert "seed 1: no finished run" in check(_result({"0": OFF}))
    assert check({"args": {"seeds": "0,1"}, "rows": {}}).startswith("FAIL: GRPO did not take off")


def test_the_check_fails_when_grpo_does_not_take_off_even_if_the_reference_agrees(load_benchmark, tmp_path,
                                                                                 monkeypatch, capsys):
    """A rerun equal to a reference in which a seed did not take off still exits 1 (it guards nothing)."""
    rp = load_benchmark("reproduce_protocol")
    result = _result({"0": OFF, "1": STUCK})
    reference = {k: v for k, v in rp.figures_of({**result, "identity": {"tools": {}}}).items()}
    (tmp_path / "protocol_small.json").write_text(json.dumps({"meta": {"machine": "m"}, "figures": reference}))
    monkeypatch.setattr(rp, "rerun", lambda out: result)
    monkeypatch.setattr(rp, "tool_hash", lambda t: "x", raising=False)
    assert rp.main(["--results", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "outside: 0" in out and out.strip().splitlines()[-1].startswith("FAIL: GRPO did not take off on 1 of 2")
    monkeypatch.setattr(rp, "rerun", lambda out: _result({"0": OFF, "1": {**OFF, "metric": 0.75}}))
    ok_reference = rp.figures_of(_result({"0": OFF, "1": {**OFF, "metric": 0.75}}))
    (tmp_path / "protocol_small.json").write_text(json.dumps({"meta": {"machine": "m"}, "figures": ok_reference}))
    assert rp.main(["--results", str(tmp_path)]) == 0


def test_a_reference_is_recorded_only_when_every_seed_took_off_from_a_clean_commit(load_benchmark, tmp_path,
                                                                                   monkeypatch, capsys):
    rp = load_benchmark("reproduce_protocol")
    for result, said in ((_result({"0": OFF, "1": STUCK}), "FAIL: GRPO did not take off"),
                         (_result({"0": OFF, "1": OFF}, dirty=True), "uncommitted changes")):
        monkeypatch.setattr(rp, "rerun", lambda out, result=result: result)
        assert rp.main(["--record", "--results", str(tmp_path)]) == 1
        assert said in capsys.readouterr().out and not (tmp_path / "protocol_small.json").exists()
    monkeypatch.setattr(rp, "rerun", lambda out: _result({"0": OFF, "1": OFF}))
    assert rp.main(["--record", "--results", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "protocol_small.json").read_text())["figures"]
    assert figures["grpo.took_off_seeds"] == 2 and figures["git_dirty"] == 0
    assert figures["grpo.seed1.call_rate_last"] == 0.92  # shown with the reference, not compared:
    per_seed = [k for k in figures if k.startswith(("grpo.seed0.", "grpo.seed1."))]
    assert len(per_seed) == 4 and all(rp.shown_only(k) for k in per_seed) and not rp.shown_only("grpo.seeds")
