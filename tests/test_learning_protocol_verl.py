"""The learning protocol's verl row (``benchmarks/learning_protocol_verl.py``) is re-derived from the
committed verl run files, checked against the stored held-out answers, and recorded as it derives."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "runs" / "protocol" / "closed_v1_verl"


@pytest.fixture()
def derive(load_benchmark):
    return load_benchmark("learning_protocol_verl")


def test_the_recorded_verl_figures_are_what_the_run_files_say(derive):
    fig, _, _ = derive.verl_setting(RUNS)
    recorded = json.loads((ROOT / "benchmarks" / "results" / "learning_protocol.json").read_text())["figures"]
    mine = {f"closed_v1.{k}": v for k, v in fig.items() if not k.startswith("verl_minus_grpo")}  # needs the native row
    for key, value in mine.items():
        assert key in recorded, key
        assert recorded[key] == (pytest.approx(value) if isinstance(value, float) else value), key


def test_an_answer_that_disagrees_with_verls_metric_fails_the_derivation(derive, tmp_path):
    """Flip one stored held-out verdict: the accuracy recomputed from the answers no longer matches
    the one verl logged, and the derivation says at which step instead of recording it."""
    seed = sorted(RUNS.glob("verl_s*"))[0]
    copy = tmp_path / "closed_v1_verl" / seed.name
    shutil.copytree(seed, copy)
    path = copy / "episodes" / "episodes.jsonl.gz"
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    last = max(r["global_steps"] for r in rows if r["validate"])
    victim = next(r for r in rows if r["validate"] and r["global_steps"] == last)
    victim["correct"] = not victim["correct"]
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with pytest.raises(SystemExit, match=f"step {last}: stored answers give accuracy"):
        derive.verl_setting(tmp_path / "closed_v1_verl")


def test_the_row_counts_what_the_episodes_hold(derive):
    """Independent of the module's helpers: the last evaluation's accuracy, distinct answers and
    greedy calls, and the first step's sampled calls, straight from one seed's episodes."""
    seed = sorted(RUNS.glob("verl_s*"))[0]
    rows = [json.loads(line) for line in gzip.open(seed / "episodes" / "episodes.jsonl.gz", "rt")]
    last = max(r["global_steps"] for r in rows if r["validate"])
    final = [r for r in rows if r["validate"] and r["global_steps"] == last]
    first = [r for r in rows if not r["validate"] and r["global_steps"] == 1]
    one = derive.verl_seed(seed)
    assert one["metric"] == sum(r["correct"] for r in final) / len(final)
    assert one["distinct_answers"] == len({r["answer"].strip().lower() for r in final})
    assert one["greedy_tool_calls"] == sum(r["num_tool_calls"] for r in final) / len(final)
    assert one["sampled_tool_calls_first"] == sum(r["num_tool_calls"] for r in first) / len(first)


def test_verl_seed_k_is_compared_with_the_native_seed_k(derive, tmp_path):
    """Seed k of both trainers ran on tool build k mod builds, so the row pairs them: verl seed 0
    against native seed 0 only, never against another seed's figure or the native mean."""
    seed = RUNS / "verl_s0"
    shutil.copytree(seed, tmp_path / "closed_verl" / "verl_s0")
    (tmp_path / "closed").mkdir()
    per_seed = {"0": {"metric": 0.25}, "1": {"metric": 0.75}}
    (tmp_path / "closed" / "protocol.json").write_text(json.dumps({"rows": {"grpo": {"per_seed": per_seed}}}))
    fig, cells, table = derive.verl_setting(tmp_path / "closed_verl")
    verl_metric = derive.verl_seed(seed)["metric"]
    assert fig["verl.s0.native_metric"] == 0.25
    assert fig["verl.s0.minus_native"] == pytest.approx(verl_metric - 0.25)
    assert fig["verl_minus_grpo_paired.seeds"] == 1
    assert fig["verl_minus_grpo_paired.mean"] == pytest.approx(verl_metric - 0.25)
    assert "verl.s1.minus_native" not in fig
    assert cells[1] == "1 of 2"  # a partial row says how many of the native seeds it has
    assert "| 0.250 |" in table.splitlines()[2]


def test_each_verl_seed_starts_from_its_own_builds_warm_start(derive, tmp_path):
    """With three tool builds, verl seed 4's step 0 is compared with the native evaluation of build
    1's warm start (4 mod 3), not build 0's; a record from before builds has one ``warm_test``."""
    native = tmp_path / "closed"
    for name in ("warm_test_b0", "warm_test_b1", "warm_test"):
        (native / name).mkdir(parents=True)
    (native / "protocol.json").write_text(json.dumps({"args": {"tool_builds": 3}}))
    assert derive.warm_test_answers(native, 4) == native / "warm_test_b1" / "eval.answers.jsonl"
    assert derive.warm_test_answers(native, 3) == native / "warm_test_b0" / "eval.answers.jsonl"
    (native / "protocol.json").write_text(json.dumps({"args": {}}))
    assert derive.warm_test_answers(native, 4) == native / "warm_test" / "eval.answers.jsonl"
