"""Issue 46's levers (``benchmarks/bench_levers.py``): each lever changes one thing against the
protocol's GRPO, runs on val only, and its figures come from the stored val answers, overall and on
the questions where the tool's two readings disagree."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import pytest

from train import grpo, protocol
from train.common import parse_args


@pytest.fixture()
def bench(load_benchmark):
    return load_benchmark("bench_levers")


def _protocol_folder(tmp_path):
    args = protocol.Args(out=str(tmp_path), tools="ground=trained", seeds="0,1,2")
    (tmp_path / "protocol_args.json").write_text(json.dumps({k: v for k, v in vars(args).items()}))
    for b in range(3):
        (tmp_path / f"warm_start_b{b}.json").write_text(json.dumps({"chosen_step": 150, "checkpoint": f"warm_sft_b{b}/checkpoints/step_000150"}))
    return args


def test_each_lever_changes_only_its_own_setting_and_runs_on_val(bench, tmp_path, monkeypatch):
    _protocol_folder(tmp_path)
    seen = {}

    def fake_run(out, name, module, argv):
        seen[name] = parse_args(grpo.Args, argv)
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "DONE").write_text("{}")

    monkeypatch.setattr(protocol, "run", fake_run)
    monkeypatch.setitem(__import__("sys").modules, "bench_headroom",
                        SimpleNamespace(disagreements=lambda args, build, split="val":
                                        [SimpleNamespace(id=f"embedded_{split}_{build}")]))
    bench.train_levers(tmp_path, list(bench.LEVERS), [0, 1, 2], tmp_path / "export")
    for seed in range(3):
        none = vars(seen[f"lever_none_s{seed}"])
        assert none["eval_split"] == "val" and not none["eval_ablations"] and none["seed"] == seed
        assert none["policy"].endswith(f"warm_sft_b{seed}/checkpoints/step_000150")
        for lever, changed in (("group16", {"group_size": 16}), ("steps60", {"steps": 60, "save_every": 60}),
                               ("guidance2", {"guidance": 2})):
            got = vars(seen[f"lever_{lever}_s{seed}"])
            assert {k: v for k, v in got.items() if none[k] != v and k != "out"} == changed, lever
        bonus = vars(seen[f"lever_bonus_s{seed}"])
        assert {k for k, v in bonus.items() if none[k] != v and k != "out"} == {"reward"}
        assert json.loads(bonus["reward"])["tool_shaping"]["bonus"] == 0.2
        over = vars(seen[f"lever_oversample4_s{seed}"])  # this seed's own build's train disagreements, x4
        assert {k: v for k, v in over.items() if none[k] != v and k != "out"} == {
            "oversample": f"{tmp_path}/lever_train_disagreements_b{seed}.json:4"}
        assert json.loads((tmp_path / f"lever_train_disagreements_b{seed}.json").read_text()) == [f"embedded_train_{seed}"]
    assert json.loads((tmp_path / "lever_disagreements_b1.json").read_text()) == ["embedded_val_1"]
    assert (tmp_path / "export" / "lever_disagreements_b2.json").is_file()  # stored with the runs


def _run(folder, build, right, steps=30):
    folder.mkdir(parents=True)
    (folder / "args.json").write_text(json.dumps({"args": {"tool_opt": [f"ground.seed={build}"]}}))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": steps, "rollout/call_rate": 0.9}) + "\n")
    rows = [{"step": 0, "tag": None, "record_id": rid, "correct": False} for rid in right]
    rows += [{"step": steps, "tag": None, "record_id": rid, "correct": ok} for rid, ok in right.items()]
    (folder / "heldout_answers.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))


def test_the_figures_are_the_stored_answers_overall_and_on_the_disagreement_questions(bench, tmp_path):
    """Three seeds; the lever gets the disagreement question right on every seed where ``none`` does
    not, and one easy question wrong: +0.5 on the hard ones, the same overall."""
    for b in range(3):
        (tmp_path / f"lever_disagreements_b{b}.json").write_text(json.dumps(["hard"]))
        _run(tmp_path / f"lever_none_s{b}", b, {"hard": False, "easy": True})
        _run(tmp_path / f"lever_guidance2_s{b}", b, {"hard": True, "easy": False})
    fig, table = bench.derive(tmp_path)
    assert fig["none.val.mean"] == fig["guidance2.val.mean"] == 0.5
    assert fig["none.hard.mean"] == 0.0 and fig["guidance2.hard.mean"] == 1.0
    assert fig["guidance2.hard.minus_none.difference"] == pytest.approx(1.0)
    assert fig["guidance2.val.minus_none.difference"] == pytest.approx(0.0)
    assert fig["hard_questions_min"] == fig["hard_questions_max"] == 1
    assert fig["guidance2.hard.turned_right_per_seed"] == "1, 1, 1" and fig["guidance2.hard.turned_wrong_per_seed"] == "0, 0, 0"
    assert fig["guidance2.easy.turned_right_per_seed"] == "0, 0, 0" and fig["guidance2.easy.turned_wrong_per_seed"] == "1, 1, 1"
    assert "| guidance2 | 3 |" in table and "| none | 3 |" in table


# ---- --oversample: the draw it changes, and only when given -------------------------------------------
def test_oversample_draws_the_named_questions_k_times_as_often_and_leaves_the_default_draw_alone(tmp_path):
    records = [SimpleNamespace(id=f"q{i}") for i in range(10)]
    train_idx = list(range(10))
    (tmp_path / "hard.json").write_text(json.dumps(["q3", "q7", "not_in_train"]))
    weights = grpo.question_weights(f"{tmp_path}/hard.json:4", records, train_idx)
    assert weights[3] == weights[7] == pytest.approx(4 / 16) and weights[0] == pytest.approx(1 / 16)
    assert grpo.question_weights("", records, train_idx) is None
    # the default draw is the one every earlier run made
    import numpy as np
    rng = np.random.default_rng([5, 2])
    assert grpo.sample_questions(train_idx, 4, 5, 2) == [(5 * 100_003 + 2 + 0, int(i)) for i in rng.choice(train_idx, size=4, replace=False)]
    # drawn often: of 100 questions, the 2 named get 8/106 of the draws (2/100 without the lever)
    many = [SimpleNamespace(id=f"q{i}") for i in range(100)]
    heavy = grpo.question_weights(f"{tmp_path}/hard.json:4", many, list(range(100)))
    drawn = [i for step in range(400) for _, i in grpo.sample_questions(list(range(100)), 4, 0, step, weights=heavy)]
    share = sum(i in (3, 7) for i in drawn) / len(drawn)
    assert 0.06 < share < 0.09, share


@pytest.mark.parametrize("spec, message", [("x.json", "FILE:K"), ("{p}:0.5", "FILE:K"), ("{p}:many", "FILE:K"),
                                           ("{missing}:4", "cannot read"), ("{other}:4", "none of the 1 record ids")])
def test_a_bad_oversample_setting_says_what_is_wrong(tmp_path, spec, message):
    from medvqa_env.errors import ConfigError

    (tmp_path / "ids.json").write_text(json.dumps(["q1"]))
    (tmp_path / "other.json").write_text(json.dumps(["elsewhere"]))
    spec = spec.format(p=tmp_path / "ids.json", missing=tmp_path / "nope.json", other=tmp_path / "other.json")
    with pytest.raises(ConfigError, match=message):
        grpo.question_weights(spec, [SimpleNamespace(id=f"q{i}") for i in range(3)], [0, 1, 2])


def test_a_run_record_names_the_oversampled_ids_by_content(tmp_path):
    from train.common import resolved_config

    (tmp_path / "ids.json").write_text(json.dumps(["q1"]))
    first = resolved_config(grpo.Args(out=str(tmp_path / "r"), oversample=f"{tmp_path}/ids.json:4"))["resolved"]
    (tmp_path / "ids.json").write_text(json.dumps(["q2"]))  # the same path, other questions: another record
    second = resolved_config(grpo.Args(out=str(tmp_path / "r"), oversample=f"{tmp_path}/ids.json:4"))["resolved"]
    assert len(first["oversample_ids_sha256"]) == 64 and first["oversample_ids_sha256"] != second["oversample_ids_sha256"]
    assert "oversample_ids_sha256" not in resolved_config(grpo.Args(out=str(tmp_path / "r")))["resolved"]
