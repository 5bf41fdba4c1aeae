"""A checkpoint is evaluated as it was trained (issue 26): ``eval.run`` on a trainer's checkpoint
decodes as the trainer's held-out evaluation did (greedy, its ``max_new_tokens``), so it gets the
trainer's held-out figure on the same questions, answer for answer; sampling is an explicit choice."""

from __future__ import annotations

import json
import logging
import os

import pytest

from train import sft
from train.common import parse_args

os.environ.setdefault("HF_HUB_OFFLINE", "1")
N_HELDOUT = 16
TRAIN = ["--policy", "tiny-qwen2-vl", "--answer-types", "CLOSED", "--eval-size", str(N_HELDOUT),
         "--max-new-tokens", "12", "--batch-size", "8", "--tools", "ground=oracle", "--demo-prompt",
         "--tool-share", "0.5", "--steps", "40", "--lr", "3e-3", "--max-turns", "1", "--no-tensorboard",
         "--save-every", "0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "run"
    sft.main(parse_args(sft.Args, [*TRAIN, "--out", str(out)]))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in rows if "eval/accuracy" in r][-1]
    answers = [json.loads(line) for line in (out / "heldout_answers.jsonl").read_text().splitlines()]
    last = {a["record_id"]: a["answer"] for a in answers if a["step"] == final["step"] and a["tag"] is None}
    return out / "final", final["eval/accuracy"], last


def _eval(ckpt, out, *flags):
    from eval.run import main

    code = main(["--agent", "vlm", "--agent-opt", f"model={ckpt}", "--dataset", "embedded",
                 "--answer-types", "CLOSED", "--limit", str(N_HELDOUT), "--workers", "0", "--no-progress",
                 "--bootstrap", "0", "--out", str(out), *flags])
    summary = json.loads((out / "summary.json").read_text())
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    return code, summary, {e["record_id"]: e["prediction"] for e in episodes}


def test_the_checkpoint_records_how_its_trainer_decoded(trained):
    ckpt, _, _ = trained
    saved = json.loads((ckpt / "medvqa_run.json").read_text())
    assert saved["generation"] == {"do_sample": False, "temperature": 0.0, "max_new_tokens": 12}


def test_eval_run_by_default_reproduces_the_trainers_heldout_figure(trained, tmp_path, capsys):
    ckpt, figure, trainer_answers = trained
    code, summary, answers = _eval(ckpt, tmp_path / "default")
    assert code == 0
    assert answers == trainer_answers  # answer for answer, on the trainer's held-out questions
    assert summary["overall"]["closed_accuracy"]["value"] == pytest.approx(figure)
    run = json.loads((tmp_path / "default" / "run.json").read_text())
    assert run["agent"]["decoding"] == "greedy" and run["agent"]["generation_source"] == "checkpoint"
    assert run["agent"]["max_new_tokens"] == 12 and run["answer_types"] == "CLOSED"
    assert "decoding: greedy, max_new_tokens=12 (the checkpoint's held-out decoding" in capsys.readouterr().err


def test_sampling_is_an_explicit_choice_and_is_warned_about(trained, tmp_path, caplog):
    ckpt, _, trainer_answers = trained
    with caplog.at_level(logging.WARNING, logger="agents.text_llm"):
        code, _, answers = _eval(ckpt, tmp_path / "sampled", "--agent-opt", "temperature=1.5")
    assert code == 0
    assert "samples, but this checkpoint's trainer evaluated it greedily" in caplog.text
    assert answers != trainer_answers  # a sampled tiny model answers otherwise
    run = json.loads((tmp_path / "sampled" / "run.json").read_text())
    assert run["agent"]["decoding"] == "sampled" and run["agent"]["temperature"] == 1.5


def test_pass_at_k_with_greedy_decoding_says_it_does_not_sample(trained, tmp_path, capsys):
    ckpt, _, _ = trained
    code, _, _ = _eval(ckpt, tmp_path / "k2", "--k", "2", "--limit", "2")
    assert code == 0
    assert "--k 2 with greedy decoding asks the same answer 2 times" in capsys.readouterr().err
