"""Teeth on checkpoints and the resume checks (issue 42): what ``--allow-changed`` may and may not skip.

``train.common.check_resume`` refuses to resume a run folder with other settings than its
``args.json`` names (listing them), unless ``--allow-changed`` names them or is ``all``; settings
that do not change what is learned (steps, eval cadence, threads, ...) are free; a folder of the
other trainer is refused even with ``--allow-changed all``; a setting the record predates counts as
its default; the recorded tools are compared unless ``tools`` (or ``all``) is allowed; ``--steps``
below the checkpoint's step is refused whatever is allowed. ``train.checkpoint``: a checkpoint is
written whole or not at all, ``latest`` names a complete one, only the newest ``keep`` stay, resuming
restores weights, optimizer and every RNG stream, and ``policy_sha256`` names a policy by what it
is. Written against the mutation run of ``benchmarks/mutation.py`` (train/common.py,
train/checkpoint.py); fast: plain torch modules, no model download, no subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
import torch

from medvqa_env.errors import ConfigError
from train import checkpoint as ck
from train import common, grpo, sft
from train.common import check_resume, config_differences, other_trainer


# ---------------------------------------------------------------------------------------------
# config_differences / other_trainer
# ---------------------------------------------------------------------------------------------
def test_config_differences_lists_what_may_not_change_in_name_order():
    old = {"lr": 1e-3, "seed": 0, "group_size": 8, "steps": 10, "eval_every": 5, "tools": {"a": 1, "b": 2}}
    new = {"lr": 2e-3, "seed": 0, "group_size": 4, "steps": 30, "eval_every": 1, "tools": {"b": 2, "a": 1}}
    assert config_differences(old, new) == ["group_size: 8 -> 4", "lr: 0.001 -> 0.002"]  # dict order is no change
    assert config_differences(old, new, ["lr"]) == ["group_size: 8 -> 4"]
    assert config_differences(old, new, ["lr", "group_size"]) == []
    # a setting on one side only is a difference, shown as absent
    assert config_differences({"lr": 1.0}, {"lr": 1.0, "kl_coef": 0.01}) == ["kl_coef: '<absent>' -> 0.01"]
    assert config_differences({"kl_coef": 0.01}, {}) == ["kl_coef: 0.01 -> '<absent>'"]
    assert config_differences({}, {}) == [] and config_differences({"lr": 1}, {"lr": 1}) == []


def test_only_what_does_not_change_learning_is_free_on_resume():
    assert {"steps", "eval_every", "eval_size", "save_every", "keep", "torch_threads", "micro_batch", "out",
            "resume", "allow_changed", "device"} <= common.MAY_CHANGE_ON_RESUME
    for key in ("lr", "seed", "algo", "kl_coef", "group_size", "prompts_per_step", "temperature", "reward",
                "tools", "policy", "format_penalty", "max_turns", "answer_types", "dataset"):
        assert key not in common.MAY_CHANGE_ON_RESUME, key
        assert config_differences({key: 1}, {key: 2}) == [f"{key}: 1 -> 2"]
    for key in common.MAY_CHANGE_ON_RESUME:
        assert config_differences({key: 1}, {key: 2}) == []


def test_other_trainer_names_the_trainer_a_record_belongs_to():
    assert other_trainer({"tool_share": 0.5, "lr": 1e-3}, grpo.Args()) == "train.sft"
    assert other_trainer({"algo": "grpo", "lr": 1e-3}, sft.Args()) == "train.grpo"
    assert other_trainer({"algo": "grpo"}, grpo.Args()) is None
    assert other_trainer({"tool_share": 0.5}, sft.Args()) is None
    assert other_trainer({"lr": 1e-3}, grpo.Args()) is None and other_trainer({}, sft.Args()) is None


# ---------------------------------------------------------------------------------------------
# check_resume
# ---------------------------------------------------------------------------------------------
def run_folder(tmp_path, args, step=10, record_args=None, resolved=None, name="run"):
    out = tmp_path / name
    ckpt = out / "checkpoints" / f"step_{step:06d}"
    (ckpt / ck.STATE_DIR).mkdir(parents=True)
    (ckpt / ck.STATE_DIR / "state.json").write_text(json.dumps({"step": step}))
    recorded = dataclasses.asdict(args) if record_args is None else record_args
    (out / "args.json").write_text(json.dumps({"args": recorded, "resolved": resolved or {}}))
    return out, ckpt


def test_the_same_settings_resume_and_free_ones_may_change(tmp_path):
    args = grpo.Args(lr=1e-3, steps=20)
    out, ckpt = run_folder(tmp_path, args)
    check_resume(out, args, ckpt)
    check_resume(out, dataclasses.replace(args, steps=40, eval_every=2, micro_batch=8, torch_threads=1), ckpt)
    # nothing to check: no checkpoint, or no record
    check_resume(out, dataclasses.replace(args, lr=9.0), None)
    (out / "args.json").unlink()
    check_resume(out, dataclasses.replace(args, lr=9.0), ckpt)


def test_a_changed_setting_is_refused_and_named_unless_allowed(tmp_path):
    args = grpo.Args(lr=1e-3, seed=0, steps=20)
    out, ckpt = run_folder(tmp_path, args)
    changed = dataclasses.replace(args, lr=2e-3, seed=3)
    with pytest.raises(ConfigError) as err:
        check_resume(out, changed, ckpt)
    msg = str(err.value)
    assert f"{out} holds a run with other settings" in msg
    assert "lr: 0.001 -> 0.002" in msg and "seed: 0 -> 3" in msg
    assert "--allow-changed lr,seed to resume" in msg
    # allowing one of the two is not enough; the other is still named
    with pytest.raises(ConfigError) as err:
        check_resume(out, dataclasses.replace(changed, allow_changed="lr"), ckpt)
    assert "seed: 0 -> 3" in str(err.value) and "lr: 0.001" not in str(err.value)
    check_resume(out, dataclasses.replace(changed, allow_changed="lr, seed"), ckpt)  # spaces are fine
    check_resume(out, dataclasses.replace(changed, allow_changed="all"), ckpt)
    with pytest.raises(ConfigError):  # "all" as a word, not a prefix
        check_resume(out, dataclasses.replace(changed, allow_changed="alls"), ckpt)


def test_a_setting_the_record_predates_counts_as_its_default(tmp_path):
    """A record written before format_penalty existed ran with 0: resuming with 0 is the same run,
    resuming with the protocol's -0.2 is not (issue 42: an invalid turn's cost is part of the reward)."""
    args = grpo.Args(steps=20)
    old = {k: v for k, v in dataclasses.asdict(args).items() if k != "format_penalty"}
    assert "format_penalty" in common.NEW_SETTINGS and grpo.Args().format_penalty == 0.0
    out, ckpt = run_folder(tmp_path, args, record_args=old)
    check_resume(out, args, ckpt)
    with pytest.raises(ConfigError, match=r"format_penalty: 0\.0 -> -0\.2"):
        check_resume(out, dataclasses.replace(args, format_penalty=-0.2), ckpt)
    check_resume(out, dataclasses.replace(args, format_penalty=-0.2, allow_changed="format_penalty"), ckpt)
    # only the new settings get a default: a record without lr is a difference, not "the default"
    no_lr = {k: v for k, v in dataclasses.asdict(args).items() if k != "lr"}
    out, ckpt = run_folder(tmp_path, args, record_args=no_lr, name="nolr")
    with pytest.raises(ConfigError, match="lr: '<absent>'"):
        check_resume(out, args, ckpt)


def test_the_other_trainers_folder_is_refused_even_with_allow_changed_all(tmp_path):
    rec = dataclasses.asdict(sft.Args(steps=10))
    out, ckpt = run_folder(tmp_path, grpo.Args(), record_args=rec)
    for allowed in ("", "all"):
        with pytest.raises(ConfigError) as err:
            check_resume(out, grpo.Args(steps=20, allow_changed=allowed), ckpt)
        msg = str(err.value)
        assert f"{out} holds a train.sft run, not a train.grpo one" in msg and f"--out {out}_grpo" in msg
        assert "--policy" not in msg  # no final model yet: nothing to start from
    (out / "final").mkdir()
    with pytest.raises(ConfigError, match=f"pass --policy {out / 'final'}"):
        check_resume(out, grpo.Args(steps=20), ckpt)
    # and the other way round
    out, ckpt = run_folder(tmp_path, sft.Args(), record_args=dataclasses.asdict(grpo.Args(steps=10)), name="g")
    with pytest.raises(ConfigError, match="holds a train.grpo run, not a train.sft one"):
        check_resume(out, sft.Args(steps=20, allow_changed="all"), ckpt)


def test_steps_below_the_checkpoint_are_refused_whatever_is_allowed(tmp_path):
    args = grpo.Args(steps=20)
    out, ckpt = run_folder(tmp_path, args, step=10)
    check_resume(out, dataclasses.replace(args, steps=10), ckpt)  # at the checkpoint: nothing left, not an error
    for allowed in ("", "steps", "all"):
        with pytest.raises(ConfigError, match="is at step 10, past --steps 9"):
            check_resume(out, dataclasses.replace(args, steps=9, allow_changed=allowed), ckpt)


def test_the_recorded_tools_are_compared_unless_tools_are_allowed(tmp_path):
    from tool_backends.identity import describe_tools

    args = grpo.Args(tools="ground=oracle", steps=20)
    recorded = describe_tools(common.tool_config(args.tools))
    recorded["ground"] = {**recorded["ground"], "engine": "trained", "content_hash": "a" * 64}
    out, ckpt = run_folder(tmp_path, args, resolved={"tool_identity": recorded})
    with pytest.raises(ConfigError) as err:
        check_resume(out, args, ckpt)
    assert "used other tools than these" in str(err.value) and "--allow-changed tools" in str(err.value)
    check_resume(out, dataclasses.replace(args, allow_changed="tools"), ckpt)
    check_resume(out, dataclasses.replace(args, allow_changed="all"), ckpt)
    with pytest.raises(ConfigError, match="used other tools"):  # allowing another setting does not skip it
        check_resume(out, dataclasses.replace(args, allow_changed="lr"), ckpt)
    # the same tools as recorded: resumes
    out, ckpt = run_folder(tmp_path, args, resolved={"tool_identity": describe_tools(common.tool_config(args.tools))},
                           name="same")
    check_resume(out, args, ckpt)


# ---------------------------------------------------------------------------------------------
# train.checkpoint
# ---------------------------------------------------------------------------------------------
def model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return model, opt


def test_checkpoint_step_reads_the_folder_name():
    assert ck.checkpoint_step("runs/x/checkpoints/step_000010") == 10
    assert ck.checkpoint_step("step_123456") == 123456


def test_a_checkpoint_is_complete_named_by_latest_and_only_the_newest_keep_stay(tmp_path):
    model, opt = model_and_optimizer()
    for step in (1, 2, 3):
        path = ck.save_checkpoint(tmp_path, step, model, opt, {"acc": 0.5}, keep=2, run_info={"kind": "test"})
        assert path == tmp_path / "checkpoints" / f"step_{step:06d}"
    names = [p.name for p in ck.list_checkpoints(tmp_path)]
    assert names == ["step_000002", "step_000003"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000003"
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000003"
    state_dir = path / ck.STATE_DIR
    assert json.loads((state_dir / "state.json").read_text()) == {"acc": 0.5, "step": 3}
    assert (state_dir / "optimizer.pt").is_file() and (state_dir / "rng.json").is_file()
    assert json.loads((path / ck.RUN_FILE).read_text()) == {"kind": "test", "step": 3}
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp folder left
    # keep 0 keeps every one; saving a step again replaces it
    for step in (4, 5):
        ck.save_checkpoint(tmp_path, step, model, opt, {}, keep=0)
    ck.save_checkpoint(tmp_path, 5, model, opt, {"again": 1}, keep=0)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_000002", "step_000003", "step_000004", "step_000005"]
    assert json.loads((tmp_path / "checkpoints" / "step_000005" / ck.STATE_DIR / "state.json").read_text())["again"] == 1
    # keep 1: only the newest
    ck.save_checkpoint(tmp_path, 6, model, opt, {}, keep=1)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_000006"]


def test_an_incomplete_checkpoint_is_neither_listed_nor_latest(tmp_path):
    assert ck.latest_checkpoint(tmp_path) is None and ck.list_checkpoints(tmp_path) == []
    model, opt = model_and_optimizer()
    ck.save_checkpoint(tmp_path, 7, model, opt, {}, keep=0)
    broken = tmp_path / "checkpoints" / "step_000009"
    (broken / ck.STATE_DIR).mkdir(parents=True)  # killed before state.json
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_000007"]
    (tmp_path / "checkpoints" / "latest").write_text("step_000009\n")
    assert ck.latest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoints" / "latest").write_text("step_000007\n")  # a trailing newline is no other name
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000007"


def test_resuming_restores_weights_optimizer_and_every_rng_stream(tmp_path):
    model, opt = model_and_optimizer(seed=1)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    path = ck.save_checkpoint(tmp_path, 4, model, opt, {"running": 0.25}, keep=0)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    fresh, fresh_opt = model_and_optimizer(seed=2)
    assert not torch.equal(fresh.weight, model.weight)
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    state = ck.load_checkpoint(path, fresh, fresh_opt)
    assert state == {"running": 0.25, "step": 4}
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    saved, loaded = opt.state_dict(), fresh_opt.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    assert all(torch.equal(saved["state"][k]["exp_avg"], loaded["state"][k]["exp_avg"]) for k in saved["state"])
    # restore_rng=False leaves the streams alone; no optimizer given: weights only
    random.seed(123)
    want = random.random()
    random.seed(123)
    ck.load_checkpoint(path, fresh, None, restore_rng=False)
    assert random.random() == want


def test_the_rng_state_round_trips_through_json_and_junk_is_a_value_error(tmp_path):
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    state = ck.rng_state()
    data = json.loads(json.dumps(ck.rng_state_to_json(state)))
    back = ck.rng_state_from_json(data)
    assert back["python"] == state["python"]
    assert back["numpy"][0] == state["numpy"][0] and np.array_equal(back["numpy"][1], state["numpy"][1])
    assert back["numpy"][2:] == tuple(state["numpy"][2:])
    assert torch.equal(back["torch"], state["torch"])
    for junk in ({}, {"python": [1, [1, 2], None]}, {**data, "torch": "not base64!"}, {**data, "numpy": [1, 2]}):
        with pytest.raises(ValueError, match="expected an RNG state written by save_checkpoint"):
            ck.rng_state_from_json(junk)
    assert ck.load_rng_state(tmp_path) is None  # neither rng.json nor rng.pt
    (tmp_path / "rng.json").write_text(json.dumps(data))
    assert torch.equal(ck.load_rng_state(tmp_path)["torch"], state["torch"])


def test_policy_sha256_names_the_policy_not_how_or_when_it_was_written(tmp_path):
    model, opt = model_and_optimizer()
    info = {"kind": "full", "system_prompt": "p", "env": {"max_turns": 1}, "generation": {"do_sample": False},
            "resolved": {"tool_identity": {"ground": {"content_hash": "h1"}}}, "args": {"lr": 1}, "commit": "abc"}
    a = ck.save_checkpoint(tmp_path / "a", 1, model, opt, {"wall": 1.0}, run_info=info)
    b = ck.save_checkpoint(tmp_path / "b", 1, model, opt, {"wall": 99.0},
                           run_info={**info, "args": {"lr": 2}, "commit": "def"})
    assert ck.policy_sha256(a) == ck.policy_sha256(b)  # trainer state, args and commit are not the policy
    c = ck.save_checkpoint(tmp_path / "c", 1, model, opt, {}, run_info={**info, "system_prompt": "other"})
    assert ck.policy_sha256(c) != ck.policy_sha256(a)
    d = ck.save_checkpoint(tmp_path / "d", 1, model, opt, {},
                           run_info={**info, "resolved": {"tool_identity": {"ground": {"content_hash": "h2"}}}})
    assert ck.policy_sha256(d) != ck.policy_sha256(a)
    with torch.no_grad():
        model.bias.add_(1.0)
    e = ck.save_checkpoint(tmp_path / "e", 1, model, opt, {}, run_info=info)
    assert ck.policy_sha256(e) != ck.policy_sha256(a)
    (a / ck.RUN_FILE).unlink()  # no run file: the files alone
    assert len(ck.policy_sha256(a)) == 64 and ck.policy_sha256(a) != ck.policy_sha256(b)


def test_atomic_write_leaves_the_text_and_no_temporary_file(tmp_path):
    target = tmp_path / "latest"
    target.write_text("old")
    ck._atomic_write_text(target, "step_000002")
    assert target.read_text() == "step_000002" and [p.name for p in tmp_path.iterdir()] == ["latest"]
