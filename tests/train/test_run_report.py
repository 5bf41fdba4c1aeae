"""What a trainer says about its run (issues 41 and 42): per-step signals of which mode it is in
(entropy, sampled call rate, accuracy when calling and when answering directly, invalid turns),
one line per held-out evaluation, ``curves.png`` in the run folder, a summary that names it and
``tb/`` and says when the policy did not take off, Ctrl-C naming the checkpoint and the resume
command, and a GRPO run pointed at an SFT folder told to use another ``--out``."""

from __future__ import annotations

import json
import os

import pytest

from medvqa_env.errors import ConfigError
from train import grpo, plot_curves
from train.common import check_resume
from train.run_report import takeoff_flags

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TINY = dict(policy="tiny-qwen2-vl", answer_types="CLOSED", eval_size=4, max_new_tokens=4, eval_every=1,
            prompts_per_step=2, group_size=2, tools="ground=oracle", demo_prompt=True, max_turns=1,
            save_every=1, keep=1)
MODE_KEYS = ("rollout/entropy", "rollout/call_rate", "rollout/accuracy_calling", "rollout/accuracy_direct",
             "rollout/invalid_turn_rate")


def test_a_grpo_run_logs_its_mode_and_ends_with_curves_and_a_verdict(tmp_path, capsys):
    out = tmp_path / "run"
    grpo.main(grpo.Args(**TINY, steps=2, out=str(out)))
    text = capsys.readouterr()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row in rows[1:]:
        assert all(k in row for k in MODE_KEYS), sorted(row)
        assert row["rollout/entropy"] > 0 and 0.0 <= row["rollout/invalid_turn_rate"] <= 1.0
    tags = [e.name for e in (out / "tb").iterdir()]
    assert tags  # the same scalars went to TensorBoard
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    both = text.out + text.err
    assert all(f"held-out at step {s}: accuracy" in both for s in (0, 1, 2))  # one line per evaluation
    assert f"learning curves: {out / 'curves.png'}" in text.out and f"--logdir {out / 'tb'}" in text.out
    # a random tiny policy gives no answer: the summary says it did not take off
    assert "WARNING: did not take off: no held-out question got an answer at step 2" in text.out
    # the documented plot command writes into the run folder, not over docs/img
    (out / "curves.png").unlink()
    assert plot_curves.main(["--runs", f"GRPO={out}", "--panels", "eval/accuracy", "rollout/call_rate"]) == 0
    assert (out / "curves.png").is_file() and f"wrote {out / 'curves.png'}" in capsys.readouterr().out


def test_the_verdict_names_a_constant_answer_and_dead_tool_calls(tmp_path):
    answers = tmp_path / "heldout_answers.jsonl"
    answers.write_text("".join(json.dumps({"step": 10, "tag": t, "answer": a}) + "\n"
                               for t, a in ((None, "no"), (None, "No "), ("blank", "yes"), (None, None))))
    rows = ([{"step": s, "tools/calls_per_episode": 0.3 if s < 3 else 0.0} for s in range(1, 11)]
            + [{"step": 10, "eval/distinct_answers": 1.0}])
    flags = takeoff_flags(rows, answers)
    assert flags[0] == "held-out answers are one constant: every held-out question got 'no' at step 10"
    assert flags[1].startswith("sampled tool calls died: 0.30 per episode at step 1, 0.000 over the last 5")
    alive = [{"step": s, "tools/calls_per_episode": 0.3} for s in range(1, 11)] + [{"step": 10, "eval/distinct_answers": 2.0}]
    assert takeoff_flags(alive, answers) == []
    never = [{"step": s, "tools/calls_per_episode": 0.0} for s in range(1, 11)]  # no tool use to die
    assert takeoff_flags(never) == []


def test_ctrl_c_names_the_checkpoint_and_the_resume_command(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    real = grpo.save_checkpoint

    def save_then_interrupt(out_, step, *a, **kw):
        real(out_, step, *a, **kw)
        if step == 1:
            raise KeyboardInterrupt
    monkeypatch.setattr(grpo, "save_checkpoint", save_then_interrupt)
    monkeypatch.setattr("sys.argv", ["train/grpo.py", "--out", str(out), "--steps", "3"])
    with pytest.raises(SystemExit) as stop:
        grpo.main(grpo.Args(**TINY, steps=3, out=str(out), tensorboard=False))
    assert stop.value.code == 130
    err = capsys.readouterr().err
    assert f"the last checkpoint is {(out / 'checkpoints' / 'step_000001').resolve()} (step 1)" in err
    assert f"resume with the same command: python -m train.grpo --out {out} --steps 3" in err
    assert (out / "curves.png").is_file()  # the picture of what ran so far


def test_a_grpo_run_pointed_at_an_sft_folder_is_told_to_use_another_out(tmp_path):
    out = tmp_path / "sft"
    state = out / "checkpoints" / "step_000010" / "trainer_state"
    state.mkdir(parents=True)
    (state / "state.json").write_text("{}")
    (out / "checkpoints" / "latest").write_text("step_000010")
    (out / "final").mkdir()
    (out / "args.json").write_text(json.dumps({"args": {"tool_share": 0.5, "lr": 3e-3, "steps": 10}}))
    with pytest.raises(ConfigError) as err:
        check_resume(out, grpo.Args(out=str(out), steps=20), out / "checkpoints" / "step_000010")
    msg = str(err.value)
    assert f"{out} holds a train.sft run, not a train.grpo one" in msg and f"--out {out}_grpo" in msg
    assert f"--policy {out / 'final'}" in msg and "--allow-changed" not in msg
