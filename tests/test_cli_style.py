"""One command-line style for every console command: defaults in --help, strict booleans, both dash
spellings, ``prog: error:`` (exit 2, no traceback) for user errors -- argparse's and the program's."""

from __future__ import annotations

import json

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _grpo(argv):
    from train import grpo
    return grpo.cli(argv)


def _sft(argv):
    from train import sft
    from train.common import parse_args
    return parse_args(sft.Args, argv, prog="python -m train.sft")


def _ppo(argv):
    from train.ppo_sb3 import parse_args
    return parse_args(argv)


def _eval(argv):
    from eval.run import main
    return main(argv)


def _compare(argv):
    from eval.compare import main
    return main(argv)


def _tools(argv):
    from tool_backends.cli import main
    return main(argv)


def _finetune(argv):
    from tool_backends.finetune.__main__ import main
    return main(argv)


# command, prog, argv prefix, a bad value for one of its flags
COMMANDS = [
    (_grpo, "python -m train.grpo", [], ["--resume", "ture"]),
    (_sft, "python -m train.sft", [], ["--tensorboard", "ture"]),
    (_ppo, "python -m train.ppo_sb3", [], ["--n-envs", "four"]),
    (_eval, "medvqa-eval", ["--agent", "scripted", "--dataset", "embedded", "--out", "x"], ["--progress", "ture"]),
    (_compare, "python -m eval.compare", ["a"], ["--rank", "ture"]),
    (_tools, "medvqa-tools serve", ["serve"], ["--done-if-invalid", "ture"]),
    (_finetune, "python -m tool_backends.finetune ground", ["ground"], ["--steps", "many"]),
]


@pytest.mark.parametrize("command,prog,prefix,bad", COMMANDS, ids=[c[1] for c in COMMANDS])
def test_help_shows_defaults_and_bad_values_are_prog_errors(command, prog, prefix, bad, capsys):
    with pytest.raises(SystemExit) as done:
        command(prefix + ["--help"])
    assert done.value.code == 0
    assert "(default:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as failed:
        command(prefix + bad)
    err = capsys.readouterr().err
    assert failed.value.code == 2 and f"{prog}: error:" in err and "Traceback" not in err


def test_both_dash_spellings_and_strict_booleans():
    from train import grpo
    from train.common import parse_args

    a = parse_args(grpo.Args, ["--save-every", "3", "--save_every", "4", "--no-resume", "--kl_coef", "none",
                               "--algorithm", "dapo", "--dataset-opt", "root=/a", "--dataset-opt", "limit=3"])
    assert (a.save_every, a.resume, a.kl_coef, a.algo) == (4, False, None, "dapo")
    assert a.dataset_opt == ["root=/a", "limit=3"]  # a repeated option keeps every occurrence
    assert parse_args(grpo.Args, ["--resume", "false"]).resume is False
    assert parse_args(grpo.Args, ["--resume"]).resume is True


def test_program_errors_are_prog_errors_not_tracebacks(tmp_path, capsys):
    from train import grpo

    rc = grpo.cli(["--policy", "tiny-qwen2-vl", "--tools", "segment=classicl", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "python -m train.grpo: error: Unknown segment engine 'classicl'" in err
    assert "Did you mean 'classical'?" in err
    rc = grpo.cli(["--policy", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "r2")])
    assert rc == 2 and "model folder" in capsys.readouterr().err
    assert _tools(["router", "--upstream", "segment=ftp://x"]) == 2
    assert "medvqa-tools: error: expected 'tool=http://host:port'" in capsys.readouterr().err


def test_verl_engine_accepts_native_flags_as_docs_say(capsys):
    pytest.importorskip("verl")
    from train import grpo

    assert grpo.cli(["--engine", "verl", "--group_size", "8", "--algo", "dapo", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--algorithm dapo" in out  # the launcher got the translated flags


def test_verl_translation_of_native_flags():
    from train import grpo
    from train.verl_integration.launch import argv_from_native

    argv = argv_from_native(grpo.Args(group_size=8, lr=1e-6))
    assert "actor_rollout_ref.rollout.n=8" in argv and "actor_rollout_ref.actor.optim.lr=1e-06" in argv


def test_verl_gets_every_flag_the_user_gave_resolved_or_a_clear_refusal():
    from medvqa_env.errors import ConfigError
    from train import grpo
    from train.verl_integration.launch import argv_from_native

    args = grpo.Args(group_size=4, tools="image_zoom_in,segment=classical", tool_opt=["segment.max_side=512"],
                     dataset_opt=["root=/data/vqa_rad"], answer_protocol="xml")
    argv = argv_from_native(args, {"group_size", "tools", "tool_opt", "dataset_opt", "answer_protocol"})
    assert "actor_rollout_ref.rollout.n=4" in argv          # given, though equal to the native default
    tools = json.loads(next(a for a in argv if a.startswith("medvqa.env.tools=")).split("=", 1)[1])
    assert tools["segment"] == {"backend": "local", "engine": "classical", "max_side": 512}
    assert 'medvqa.env.dataset_options={"root": "/data/vqa_rad"}' in argv
    assert "medvqa.env.answer_protocol=xml" in argv
    with pytest.raises(ConfigError, match="default reward"):
        argv_from_native(grpo.Args(reward="medix"), {"reward"})
