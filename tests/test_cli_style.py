"""One command-line style for every console command: defaults in --help, strict booleans, both dash
spellings, ``prog: error:`` (exit 2, no traceback) for user errors -- argparse's and the program's."""

from __future__ import annotations

import json
import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _grpo(argv):
    from train import grpo
    return grpo.cli(argv)


def _sft(argv):
    from train import sft
    return sft.cli(argv)


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


def _demo(argv):
    from eval.demo import main
    return main(argv)


def _plot(argv):
    from train.plot_curves import main
    return main(argv)


def _server(argv):
    from agents.openai_server import main
    return main(argv)


def _run_all(argv):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "run_all.py"
    spec = importlib.util.spec_from_file_location("run_all_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through its module
    spec.loader.exec_module(module)
    return module.main(argv)


def _finetune(argv):
    from tool_backends.finetune.__main__ import main
    return main(argv)


def _train_eval(argv):
    from train.evaluate import main
    return main(argv)


EVAL = ["--agent", "scripted", "--dataset", "embedded", "--out", "x"]
# command, prog, argv prefix, a bad value for one of its flags, a misspelt flag, an abbreviated flag
COMMANDS = [
    (_grpo, "python -m train.grpo", [], ["--resume", "ture"], "--polcy", "--polic"),
    (_sft, "python -m train.sft", [], ["--tensorboard", "ture"], "--save-evry", "--save-ev"),
    (_ppo, "python -m train.ppo_sb3", [], ["--n-envs", "four"], "--totl-timesteps", "--total-timestep"),
    (_eval, "medvqa-eval", EVAL, ["--progress", "ture"], "--max-turn", "--max-tur"),
    (_compare, "python -m eval.compare", ["a"], ["--rank", "ture"], "--rnak", "--ran"),
    (_tools, "medvqa-tools serve", ["serve"], ["--done-if-invalid", "ture"], "--prot", "--por"),
    (_tools, "medvqa-tools router", ["router"], ["--port", "x"], "--upstrem", "--upstr"),
    (_demo, "medvqa-demo", [], ["--workers", "two"], "--limt", "--lim"),
    (_plot, "python -m train.plot_curves", [], ["--runs"], "--panel", "--pan"),
    (_server, "python -m agents.openai_server", [], ["--port", "x"], "--portt", "--po"),
    (_run_all, "python benchmarks/run_all.py", [], ["--timeout", "x"], "--onyl", "--on"),
    (_finetune, "python -m tool_backends.finetune segment", ["segment"], ["--steps", "x"], "--stepz", "--ste"),
    (_train_eval, "python -m train.evaluate", ["--policy", "p", "--out", "o"], ["--seed", "x"], "--sed", "--se"),
]


def _exit_code(command, argv):
    try:
        return command(argv)
    except SystemExit as done:
        return done.code


@pytest.mark.parametrize("command,prog,prefix,bad,misspelt,abbreviated", COMMANDS, ids=[c[1] for c in COMMANDS])
def test_help_shows_defaults_and_bad_values_are_prog_errors(command, prog, prefix, bad, misspelt, abbreviated, capsys):
    assert _exit_code(command, prefix + ["--help"]) == 0
    assert "(default:" in capsys.readouterr().out
    assert _exit_code(command, prefix + bad) == 2
    err = capsys.readouterr().err
    assert f"{prog}: error:" in err and "Traceback" not in err


@pytest.mark.parametrize("command,prog,prefix,bad,misspelt,abbreviated", COMMANDS, ids=[c[1] for c in COMMANDS])
def test_misspelt_and_abbreviated_flags_are_refused_with_a_hint(command, prog, prefix, bad, misspelt, abbreviated,
                                                                capsys):
    for flag in (misspelt, abbreviated):  # an abbreviation is never taken for the flag it abbreviates
        assert _exit_code(command, prefix + [flag, "1"]) == 2, flag
        err = capsys.readouterr().err
        assert f"{prog}: error: unrecognized arguments: {flag} 1 ({flag}: did you mean --" in err, err
        assert "Traceback" not in err


def test_every_entry_point_builds_its_parser_with_the_project_library():
    """No module with a ``__main__`` (nor a benchmark script) builds a plain argparse parser."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    offenders = []
    for path in sorted(root.glob("*/**/*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in (".venv", ".venv-verl", "tests", "docs") or rel.parts[0].startswith("."):
            continue
        text = path.read_text()
        if "argparse.ArgumentParser(" in text and rel.as_posix() != "medvqa_env/cli.py":
            offenders.append(rel.as_posix())
    assert not offenders, f"plain argparse parsers (use medvqa_env.cli.make_parser / ArgumentParser): {offenders}"


def test_one_name_per_concept_old_spellings_still_work():
    from tool_backends.cli import parse
    from train.ppo_sb3 import parse_args

    ppo = parse_args(["--learning-rate", "0.5", "--train-split", "val"])  # the old names, kept as aliases
    assert (ppo.lr, ppo.split) == (0.5, "val") and parse_args(["--lr", "0.1"]).lr == 0.1
    assert parse(["serve", "--option", "segment.a=1", "--tool-opt", "segment.b=2"])[1].tool_opt == ["segment.a=1",
                                                                                                  "segment.b=2"]


def test_nothing_to_plot_and_unknown_benchmarks_are_errors(tmp_path, capsys):
    assert _plot(["--runs", f"A={tmp_path}/nothing*", "--out", str(tmp_path / "c.png")]) == 2
    assert "python -m train.plot_curves: error: --runs" in capsys.readouterr().err
    assert not (tmp_path / "c.png").exists()
    assert _run_all(["--only", "nosuch"]) == 2
    assert "python benchmarks/run_all.py: error: Unknown benchmark 'nosuch'" in capsys.readouterr().err


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


def test_tools_none_means_no_tools_on_every_command_line():
    """``--tools none`` is the documented "no tools"; the command line once read it as ``None`` (the
    env's default tools), so the protocol's no-tool baselines ran with ``image_zoom_in``."""
    from eval.run import parse, parse_tools
    from train import evaluate, grpo, sft
    from train.common import parse_args, tool_config

    for cls in (sft.Args, grpo.Args, evaluate.Args):
        given = parse_args(cls, ["--tools", "none"]) if cls is not evaluate.Args else \
            parse_args(cls, ["--policy", "p", "--out", "o", "--tools", "none"])
        assert tool_config(given.tools) == {}, cls
    _, config = parse(["--agent", "prior", "--dataset", "embedded", "--out", "x", "--tools", "none"])
    assert parse_tools(config.tools) == {}
    assert parse_args(sft.Args, []).tools is None  # not given: the env's default tools
