"""The KL coefficient is chosen on val (issue 42): one GRPO run per candidate from the first seed's warm
start, evaluated on val questions only, chosen by a rule fixed in advance (the default stays unless
another candidate is better by more than two standard errors of the paired difference), recorded,
and given to every reward-trained run (GRPO and rft). Each trainer run is replaced by a stand-in that
parses the argv with the trainer's own parser and writes the files that trainer writes."""

from __future__ import annotations

import json

import pytest

from train import protocol

TOOLS = "ground=trained"
QUESTIONS = 100


def _fake_runs(fake_protocol_runs, right_by_kl):
    """``protocol.run`` stood in (tests/train/conftest.py); a GRPO run on val also stores answers,
    ``right_by_kl[kl_coef]`` of its questions right (as train.grpo stores them)."""

    def store_val_answers(folder, module, args):
        if module == "train.grpo" and args.eval_split == "val":
            right = right_by_kl[args.kl_coef]
            answers = [{"step": args.steps, "tag": None, "record_id": f"val_{i:04d}", "correct": i < right,
                        "answer": "yes"} for i in range(QUESTIONS)]
            (folder / "heldout_answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in answers))

    return fake_protocol_runs(store_val_answers)


def _args(tmp_path, **kw):
    kw = {"stages": "warm,kl,grpo,baselines", **kw}
    return protocol.Args(out=str(tmp_path), tools=TOOLS, seeds="0,1,2,3,4", sft_steps=50, sft_save_every=25,
                         grpo_steps=10, val_size=QUESTIONS, baselines="rft", **kw)


def test_a_candidate_better_on_val_beyond_noise_is_chosen_and_every_reward_trained_run_gets_it(tmp_path, fake_protocol_runs):
    calls = _fake_runs(fake_protocol_runs, {0.0: 60, 0.01: 60, 0.05: 85})
    assert protocol.main(_args(tmp_path)) == 0
    by_name = {name: a for name, _, a in calls}
    kl_runs = {name: a for name, a in by_name.items() if name.startswith("kl_val_")}
    assert set(kl_runs) == {"kl_val_0_s0", "kl_val_0.01_s0", "kl_val_0.05_s0"}
    for a in kl_runs.values():  # on val, from the first seed's warm start and build, no ablations
        assert a.eval_split == "val" and a.eval_size == QUESTIONS and not a.eval_ablations
        assert a.policy == by_name["grpo_s0"].policy and a.tool_opt == ["ground.seed=0"] and a.seed == 0
    assert not any(a.eval_split == "test" for name, a in kl_runs.items())  # nothing chosen sees a test question
    for seed in range(5):
        assert by_name[f"grpo_s{seed}"].kl_coef == 0.05 and by_name[f"rft_s{seed}"].kl_coef == 0.05
        assert by_name[f"grpo_s{seed}"].eval_split == "test"
    record = json.loads((tmp_path / "kl_choice.json").read_text())
    assert record["chosen"] == 0.05 and record["default"] == 0.01 and record["val"] == {"0": 0.6, "0.01": 0.6, "0.05": 0.85}
    assert record["best_minus_default"]["difference"] == pytest.approx(0.25) and record["rule"] == protocol.KL_RULE
    # a later run of the stages alone reads the choice back, and the report records it
    calls.clear()
    assert protocol.main(protocol.Args(**{**vars(_args(tmp_path)), "stages": "grpo"})) == 0
    assert protocol.chosen_kl(_args(tmp_path), tmp_path).kl_coef == 0.05
    assert protocol.report(protocol.chosen_kl(_args(tmp_path), tmp_path), tmp_path)["kl_choice"]["chosen"] == 0.05


def test_a_lead_within_noise_keeps_the_default(tmp_path, fake_protocol_runs):
    """Two questions out of 100 ahead is not a choice the val set can make: the default stays."""
    calls = _fake_runs(fake_protocol_runs, {0.0: 60, 0.01: 60, 0.05: 62})
    assert protocol.main(_args(tmp_path)) == 0
    record = json.loads((tmp_path / "kl_choice.json").read_text())
    assert record["best"] == 0.05 and record["chosen"] == 0.01
    assert 0 < record["best_minus_default"]["difference"] < 2 * record["best_minus_default"]["se"]
    assert all(a.kl_coef == 0.01 for name, _, a in calls if name.startswith(("grpo_s", "rft_s")))


def test_no_candidates_no_choice(tmp_path, fake_protocol_runs):
    calls = _fake_runs(fake_protocol_runs, {})
    args = _args(tmp_path, kl_candidates="", kl_coef=0.02, stages="kl")
    assert protocol.main(args) == 0
    assert not calls and not (tmp_path / "kl_choice.json").exists()
    (tmp_path / "kl_choice.json").write_text(json.dumps({"chosen": 0.05}))  # a choice left by another setting
    assert protocol.chosen_kl(args, tmp_path).kl_coef == 0.02  # no candidates: the given coefficient


def test_records_made_before_the_choice_read_as_no_choice():
    assert protocol.recorded_args({"seeds": "0"}, protocol.Path("/nonexistent")).kl_candidates == ""


def test_the_kl_stage_alone_exports_the_choice_and_its_runs_only(tmp_path, fake_protocol_runs):
    _fake_runs(fake_protocol_runs, {0.0: 60, 0.01: 60, 0.05: 60})
    work, dest = tmp_path / "work", tmp_path / "export"
    assert protocol.main(_args(work, stages="warm,kl")) == 0
    assert protocol.main(protocol.Args(**{**vars(_args(work)), "stages": "kl", "export": str(dest)})) == 0
    assert sorted(p.name for p in dest.iterdir()) == ["kl_choice.json", "kl_val_0.01_s0", "kl_val_0.05_s0",
                                                      "kl_val_0_s0", "runs.jsonl"]
    names = [json.loads(line)["name"] for line in (dest / "runs.jsonl").read_text().splitlines()]
    assert set(names) == {"kl_val_0.01_s0", "kl_val_0.05_s0", "kl_val_0_s0"}  # no other run's line
    assert (dest / "kl_val_0_s0" / "heldout_answers.jsonl.gz").is_file()
    assert str(work) not in (dest / "kl_val_0_s0" / "args.json").read_text()  # no machine's path
