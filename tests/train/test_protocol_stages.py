"""The protocol's stages ask for what the protocol says (issue 26): the warm start is chosen on val
(and the record says the split the run really evaluated), every run gets its own seed, seed k runs on
tool build k mod tool_builds with the warm start of that build, baselines share GRPO's builds, and
the report names the builds. Each trainer run is replaced by a stand-in that parses the argv with the
trainer's own parser and writes the files that trainer writes, so what is checked is what would run."""

from __future__ import annotations

import json

import pytest

from train import protocol

TOOLS = "ground=trained"


@pytest.fixture()
def runs(fake_protocol_runs):
    return fake_protocol_runs()


def _args(tmp_path, **kw):
    return protocol.Args(out=str(tmp_path), tools=TOOLS, seeds="0,1,2,3,4", tool_builds=3, sft_steps=50,
                         sft_save_every=25, grpo_steps=10, baselines="more_sft,tool_sft,notool_sft", **kw)


def test_the_warm_start_is_chosen_on_val_and_records_the_split_that_ran(tmp_path, runs):
    args = _args(tmp_path)
    choice = protocol.warm_start(args, tmp_path, build=1)
    (name, module, sft_args), *probes, _ = runs
    assert (name, module) == ("warm_sft_b1", "train.sft") and sft_args.eval_split == "val"
    assert [(n, a.split, a.probe_samples, a.temperature) for n, _, a in probes] == [
        (f"warm_probe_b1_{s:06d}", "val", 4, 0.7) for s in (25, 50)]  # every candidate, on val, at GRPO's temperature
    assert all(a.format_penalty == -0.2 and "ground.seed=1" in a.tool_opt for _, _, a in probes)
    assert choice["split"] == "val" and choice["tool_build"] == 1
    assert sft_args.seed == 1 and "ground.seed=1" in sft_args.tool_opt  # this build's tool and seed
    assert choice["checkpoint"] == "warm_sft_b1/checkpoints/step_000050"  # relative: no machine's path
    record = json.loads((tmp_path / "warm_start_b1.json").read_text())
    assert record["chosen_step"] == 50 and set(record["candidates"]) == {"25", "50"}  # every candidate's figures
    assert record["rule"] == protocol.CHOICE_RULE and record["blind_choice"]["step"] == 50


def test_every_run_gets_its_seed_and_its_seeds_tool_build(tmp_path, runs):
    args = _args(tmp_path)
    assert protocol.main(_args(tmp_path, stages="warm,grpo,baselines")) == 0
    by_name = {name: a for name, _, a in runs}
    for b in (0, 1, 2):
        assert by_name[f"warm_sft_b{b}"].seed == b and by_name[f"warm_sft_b{b}"].eval_split == "val"
    for seed in range(5):
        build = seed % 3
        g = by_name[f"grpo_s{seed}"]
        assert g.seed == seed and g.eval_split == "test"
        assert (g.format_penalty, g.kl_coef) == (args.format_penalty, args.kl_coef) == (-0.2, 0.01)
        assert g.tool_opt == [f"ground.seed={build}"]
        assert g.policy == str(tmp_path / f"warm_sft_b{build}" / "checkpoints" / "step_000050")
        for base in ("more_sft", "tool_sft"):
            assert by_name[f"{base}_s{seed}"].seed == seed and by_name[f"{base}_s{seed}"].tool_opt == [f"ground.seed={build}"]
        assert by_name[f"more_sft_s{seed}"].policy == g.policy  # more SFT from the same warm start as GRPO
        assert by_name[f"notool_sft_s{seed}"].tools == "none" and not by_name[f"notool_sft_s{seed}"].tool_opt
    result = protocol.report(args, tmp_path)
    assert result["tool_builds"] == 3 and result["rows"]["grpo"]["tool_builds"] == 3
    assert [r["tool_build"] for r in result["rows"]["grpo"]["per_seed"].values()] == [0, 1, 2, 0, 1]
    assert result["rows"]["warm_start"]["seeds"] == 3  # one warm start per build
    # seeds share builds (and warm starts): the builds are the units, each counted once (issue 42)
    assert result["unit"] == "tool build" and result["grpo_minus"]["more_sft"]["paired"]["pairs"] == 3
    assert result["grpo_minus"]["warm_start"]["paired"]["pairs"] == 3  # one value per warm start, not 5 from 3
    assert result["rows"]["grpo"]["by_build"]["builds"] == 3
    assert "out" not in result["args"] and "export" not in result["args"]


def test_by_default_every_seed_is_its_own_replicate(tmp_path, runs):
    """Each seed trains its own tool build and warm start (>= 5 builds for >= 5 seeds): the seeds are
    independent, so they are the units."""
    args = protocol.Args(out=str(tmp_path), tools=TOOLS, seeds="0,1,2,3,4", sft_steps=50, sft_save_every=25,
                         grpo_steps=10, baselines="more_sft")
    assert protocol.main(protocol.Args(**{**vars(args), "stages": "warm,grpo,baselines"})) == 0
    by_name = {name: a for name, _, a in runs}
    for seed in range(5):
        assert by_name[f"warm_sft_b{seed}"].tool_opt == [f"ground.seed={seed}"]
        assert by_name[f"grpo_s{seed}"].policy == str(tmp_path / f"warm_sft_b{seed}" / "checkpoints" / "step_000050")
    result = protocol.report(args, tmp_path)
    assert result["unit"] == "seed" and result["tool_builds"] == 5 and result["rows"]["warm_start"]["seeds"] == 5
    assert result["grpo_minus"]["warm_start"]["paired"]["pairs"] == 5 and "by_build" not in result["rows"]["grpo"]


def test_without_trained_tools_every_seed_shares_one_build(tmp_path, runs):
    args = _args(tmp_path, stages="warm,grpo")
    args.tools = "ground=oracle"
    assert protocol.main(args) == 0
    names = [name for name, _, _ in runs]
    assert names.count("warm_sft_b0") == 1 and not any(n.startswith("warm_sft_b1") for n in names)
    assert all(not a.tool_opt for name, _, a in runs if name.startswith("grpo"))


def test_the_report_reads_a_protocol_recorded_before_tool_builds(tmp_path):
    """The committed OPEN protocol has ``warm_start.json`` and one build: it is read as build 0."""
    (tmp_path / "warm_start.json").write_text(json.dumps({"chosen_step": 40, "checkpoint": "/abs/x", "val_by_step": {}}))
    (tmp_path / "warm_test").mkdir()
    (tmp_path / "warm_test" / "eval.json").write_text(json.dumps({"metrics": {"eval/accuracy": 0.5}}))
    args = protocol.recorded_args({"seeds": "0,1", "tools": TOOLS, "baselines": "more_sft"}, tmp_path)
    assert args.tool_builds == 1 and protocol.builds_of(args) == [0]
    assert protocol.warm_names(tmp_path, 0) == ("warm_sft", "warm_test", tmp_path / "warm_start.json")
    assert protocol.warm_checkpoint(tmp_path, {"checkpoint": "/abs/x"}) == "/abs/x"
    assert protocol.report(args, tmp_path)["rows"]["warm_start"]["mean"] == 0.5
    assert not (tmp_path / "protocol.json").exists()  # computing a report writes nothing


def test_rft_and_imperfect_sft_are_baselines_of_the_same_protocol(tmp_path, runs):
    """Issue 46: ``rft`` samples from GRPO's own warm start with GRPO's settings, reward and sampled
    episodes (only ``--algo`` and the folder differ); ``imperfect_sft`` is tool SFT from scratch on
    demonstrations of which a fixed share skip the tool and a fixed share of the rest misread it."""
    args = protocol.Args(out=str(tmp_path), tools=TOOLS, seeds="0,1,2,3,4", sft_steps=50, sft_save_every=25,
                         grpo_steps=10, baselines="tool_sft,imperfect_sft,rft")
    assert protocol.main(protocol.Args(**{**vars(args), "stages": "warm,grpo,baselines"})) == 0
    by_name = {name: (module, a) for name, module, a in runs}
    for seed in range(5):
        module, rft = by_name[f"rft_s{seed}"]
        _, g = by_name[f"grpo_s{seed}"]
        assert module == "train.grpo" and (rft.algo, g.algo) == ("rft", "grpo")
        same = {k: v for k, v in vars(rft).items() if k not in ("algo", "out")}
        assert same == {k: v for k, v in vars(g).items() if k not in ("algo", "out")}
        assert rft.steps * rft.prompts_per_step * rft.group_size == g.steps * g.prompts_per_step * g.group_size
        _, imp = by_name[f"imperfect_sft_s{seed}"]
        _, tool = by_name[f"tool_sft_s{seed}"]
        assert (imp.tool_share, imp.misread_share) == (args.imperfect_tool_share, args.misread_share) == (0.75, 0.25)
        assert (tool.tool_share, tool.misread_share) == (1.0, 0.0)
        assert (imp.policy, imp.steps, imp.tool_opt) == (tool.policy, tool.steps, tool.tool_opt)
    result = protocol.report(args, tmp_path)
    assert {"rft", "imperfect_sft"} <= set(result["grpo_minus"])
    assert result["rows"]["rft"]["seeds"] == result["rows"]["imperfect_sft"]["seeds"] == 5
