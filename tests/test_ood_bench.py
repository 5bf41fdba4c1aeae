"""Issue 46's generalisation task (``benchmarks/bench_ood.py``): every final policy of a CLOSED
protocol folder is evaluated on ``test_ood`` as it was trained (its own tool build; the no-tool
baseline without tools; the warm start its build chose), and the verdict comes from the stored answers."""

from __future__ import annotations

import gzip
import json

import pytest

from train import protocol
from train.common import parse_args
from train.evaluate import Args as EvalArgs


@pytest.fixture()
def bench(load_benchmark):
    return load_benchmark("bench_ood")


def test_each_policy_is_evaluated_on_test_ood_as_it_was_trained(bench, tmp_path, monkeypatch):
    args = protocol.Args(out=str(tmp_path), tools="ground=trained", seeds="0,1,2")
    (tmp_path / "protocol_args.json").write_text(json.dumps(vars(args)))
    for b in range(3):
        (tmp_path / f"warm_start_b{b}.json").write_text(json.dumps({"checkpoint": f"warm_sft_b{b}/checkpoints/step_000125"}))
    seen = {}

    def fake_run(out, name, module, argv):
        assert module == "train.evaluate"
        seen[name] = parse_args(EvalArgs, argv)
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "eval.json").write_text("{}")
        (out / name / "eval.answers.jsonl").write_text("")
        (out / name / "DONE").write_text("{}")

    monkeypatch.setattr(protocol, "run", fake_run)
    bench.evaluate_rows(tmp_path, [0, 1, 2], 50, tmp_path / "export")
    assert len(seen) == 3 * len(bench.ROWS)
    for seed in range(3):
        for row in bench.ROWS:
            got = seen[f"ood_{row}_s{seed}"]
            assert got.split == "test_ood" and got.eval_size == 50 and got.answer_types == "CLOSED"
            if row == "notool_sft":
                assert got.tools == "none" and not got.tool_opt
            else:
                assert got.tools == "ground=trained" and got.tool_opt == [f"ground.seed={seed}"]
        assert seen[f"ood_warm_s{seed}"].policy.endswith(f"warm_sft_b{seed}/checkpoints/step_000125")
        assert seen[f"ood_grpo_s{seed}"].policy == str(tmp_path / f"grpo_s{seed}" / "final")
    assert (tmp_path / "export" / "ood_rft_s2" / "eval.answers.jsonl.gz").is_file()


def _stored(folder, right, calls=1.0):
    folder.mkdir(parents=True)
    (folder / "eval.json").write_text(json.dumps({"metrics": {"eval/calls_per_episode": calls, "eval/answered": 1.0}}))
    rows = [{"tag": None, "record_id": rid, "correct": ok} for rid, ok in right.items()]
    rows.append({"tag": "blank", "record_id": "q0", "correct": True})  # an ablation: not counted
    (folder / "eval.answers.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))


def test_the_verdict_is_the_stored_answers_paired_over_seeds(bench, tmp_path):
    for s in range(3):  # GRPO right on 3 of 4 on every seed; tool SFT on 2 of 4 (s0), 1 of 4 (s1, s2)
        _stored(tmp_path / f"ood_grpo_s{s}", {"q0": True, "q1": True, "q2": True, "q3": False})
        _stored(tmp_path / f"ood_tool_sft_s{s}", {"q0": True, "q1": s == 0, "q2": False, "q3": False})
    fig, table = bench.derive(tmp_path)
    assert fig["grpo.mean"] == 0.75 and fig["tool_sft.per_seed"] == "0.500, 0.250, 0.250"
    assert fig["grpo_minus.tool_sft.difference"] == pytest.approx(0.75 - 1 / 3)
    assert fig["grpo_minus.tool_sft.beats"] and fig["beats_every_baseline"]
    _stored(tmp_path / "ood_rft_s0", {"q0": True, "q1": True, "q2": True, "q3": True})
    _stored(tmp_path / "ood_rft_s1", {"q0": True, "q1": True, "q2": True, "q3": False})
    fig, _ = bench.derive(tmp_path)  # a row GRPO does not beat ends the claim
    assert not fig["grpo_minus.rft.beats"] and not fig["beats_every_baseline"]
    assert "| rejection-sampling FT | 2 |" in fig["table"]
