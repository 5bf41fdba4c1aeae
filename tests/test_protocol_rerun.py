"""``benchmarks/protocol_rerun.py`` compares a protocol record with an earlier one (a git revision,
or another record in the working tree: the same protocol on another machine) run by run and tool
build by tool build."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest


@pytest.fixture()
def rerun(load_benchmark, monkeypatch, tmp_path):
    module = load_benchmark("protocol_rerun")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    recorded: dict = {}
    monkeypatch.setattr(module, "record", lambda name, text, fig, *a: recorded.update(name=name, text=text, fig=fig))
    module.recorded = recorded  # what it would have written to benchmarks/results
    return module


def write_setting(root: Path, name: str, answers: dict[str, list[str]], finals: dict[str, float], tool_hash: str,
                  observations: list[str], machine: dict) -> None:
    folder = root / "benchmarks" / "runs" / "protocol" / name
    for run, rows in answers.items():
        (folder / run).mkdir(parents=True)
        with gzip.open(folder / run / "heldout_answers.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({"answer": a}) + "\n" for a in rows)
        (folder / run / "metrics.jsonl").write_text(json.dumps({"step": 30, "eval/accuracy": finals[run],
                                                                "time/wall_s": len(name)}) + "\n")
    (folder / "tool_outputs_b0.jsonl").write_text("".join(
        json.dumps({"record_id": f"q{i}", "observation": o}) + "\n" for i, o in enumerate(observations)))
    (folder / "protocol.json").write_text(json.dumps({"metric": "eval/accuracy", "identity": {
        "code": {"git_commit": name * 4, "machine": machine},
        "tools": {"ground": {"0": {"content_hash": tool_hash}}}}}))


def test_a_record_from_another_machine_is_compared_run_by_run_and_build_by_build(rerun, tmp_path):
    write_setting(tmp_path, "closed", {"grpo_s0": ["yes", "no", "no"], "tool_sft_s0": ["yes", "yes", "no"]},
                  {"grpo_s0": 0.5, "tool_sft_s0": 0.75}, "aa" * 32, ["(liver lesion, score 0.9)", "nothing", "(spleen, score 0.5)"],
                  {"cpu": "Xeon", "kernel_flags": ["avx2", "avx512f"]})
    write_setting(tmp_path, "closed_machine2", {"grpo_s0": ["yes", "yes", "no"], "tool_sft_s0": ["yes", "yes", "no"]},
                  {"grpo_s0": 0.625, "tool_sft_s0": 0.75}, "bb" * 32, ["(liver lesion, score 0.9)", "(liver, score 0.4)", "(spleen, score 0.6)"],
                  {"cpu": "Xeon", "kernel_flags": ["avx2", "avx512f", "amx_tile"]})
    assert rerun.main(["--against", "closed", "--setting", "closed_machine2"]) == 0
    fig = rerun.recorded["fig"]
    assert rerun.recorded["name"] == "protocol_rerun_closed_machine2"
    assert fig["runs"] == 2 and fig["same_answers"] == 1 and fig["run.grpo_s0.answer_rows_changed"] == 1
    assert fig["same_trajectory"] == 1  # the timings differ, the learned figures of tool_sft_s0 do not
    assert fig["grpo.mean_shift"] == pytest.approx(0.125)
    assert fig["tool.ground.b0.same_hash"] is False and fig["tools.same_hash"] == 0
    assert fig["tool.ground.b0.same_observations"] == 1 and fig["tool.ground.b0.questions"] == 3
    assert fig["tool.ground.b0.same_labels"] == 2  # the spleen's score moved, its label did not
    assert fig["tool.ground.b0.same_found"] == 2
    assert fig["machine.old.kernel_flags"] == "avx2 avx512f"
    assert fig["machine.new.kernel_flags"] == "avx2 avx512f amx_tile"
    assert "| ground.b0 | `aaaaaaaaaaaa` | `bbbbbbbbbbbb` | 3 | 1 | 2 | 2 |" in rerun.recorded["text"]
