"""The SFT and GRPO scripts end to end on a tiny VLM, checkpoints, and resuming a killed run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from train import grpo, sft
from train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from train.common import parse_args, tool_config
from train.metrics_log import read_metrics, rollout_metrics

REPO = Path(__file__).resolve().parents[2]
TINY = ["--policy", "tiny-qwen2-vl", "--answer_types", "CLOSED", "--eval_size", "4", "--max_new_tokens", "6",
        "--tensorboard", "false"]


def test_sft_then_grasp_runs_and_logs_every_metric(tmp_path):
    sft.main(parse_args(sft.Args, TINY + ["--steps", "2", "--batch_size", "2", "--out", str(tmp_path / "sft")]))
    assert (tmp_path / "sft" / "final" / "config.json").is_file()
    args = parse_args(grpo.Args, TINY + ["--policy", str(tmp_path / "sft" / "final"), "--algo", "grasp",
                                         "--steps", "2", "--prompts_per_step", "2", "--group_size", "2",
                                         "--eval_every", "1", "--out", str(tmp_path / "grpo")])
    grpo.main(args)
    rows = read_metrics(tmp_path / "grpo" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    last = rows[-1]
    for key in ("rollout/reward_mean", "rollout/accuracy", "reward/accuracy", "reward/format",
                "tools/calls_per_episode", "groups/reward_var_mean", "groups/zero_variance_share",
                "time/tokens_per_s", "time/generation_s", "time/update_s", "losses/total", "losses/sft",
                "eval/accuracy", "eval/reward_mean"):
        assert key in last, key
    assert (tmp_path / "grpo" / "final" / "config.json").is_file()


def test_checkpoint_round_trip_restores_weights_optimizer_and_rng(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    save_checkpoint(tmp_path, 4, model, opt, {"running_accuracy": 0.7})
    expected_w, expected_draw = model.weight.detach().clone(), torch.rand(3)
    (tmp_path / "checkpoints" / ".step_000009.tmp1").mkdir()  # a half-written checkpoint is ignored
    fresh = torch.nn.Linear(3, 2)
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    state = load_checkpoint(latest_checkpoint(tmp_path), fresh, opt2)
    assert state["step"] == 4 and state["running_accuracy"] == 0.7
    assert torch.equal(fresh.weight, expected_w) and torch.equal(torch.rand(3), expected_draw)
    assert opt2.state_dict()["state"][0]["step"] == 1
    assert latest_checkpoint(tmp_path / "nothing") is None


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "train.grpo", *TINY, "--steps", "6", "--prompts_per_step", "2", "--group_size",
           "2", "--save_every", "1", "--eval_every", "0", "--save_final", "false", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            ckpt = latest_checkpoint(out)
            if ckpt is not None and ckpt.name >= "step_000002" or proc.poll() is not None:
                break
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    killed_at = int(latest_checkpoint(out).name.split("_")[1])
    assert 2 <= killed_at < 6, "the run should have been killed mid-way"
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    assert latest_checkpoint(out).name == "step_000006"
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert steps == list(range(0, 7))


def test_verl_engine_dispatch_explains_when_missing(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_verl(name, *a, **k):
        if name.startswith("train.verl_integration"):
            raise ImportError("no module named train.verl_integration.launch")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_verl)
    with pytest.raises(SystemExit, match="--engine native"):
        grpo.main(grpo.Args(engine="verl"))
    with pytest.raises(SystemExit, match="expected --engine native or verl"):
        grpo.main(grpo.Args(engine="jax"))


def test_cli_parsing_and_tool_specs():
    args = parse_args(grpo.Args, ["--algo", "drgrpo", "--kl_coef", "none", "--resume", "false", "--steps", "3"])
    assert args.algo == "drgrpo" and args.kl_coef is None and args.resume is False and args.steps == 3
    assert tool_config("") == {} and tool_config("ground=oracle")["ground"]["engine"] == "oracle"


def test_rollout_metrics_by_tool_and_group():
    from train.rollout import Trajectory

    def traj(group, reward, tools):
        return Trajectory(slot=0, group=group, prompt_ids=[1], reward=reward, correct=reward > 0, format_ok=True,
                          tool_calls=tools, components={"accuracy": float(reward > 0)}, turn_texts=["a"])

    m = rollout_metrics([traj(0, 1.0, ["ground"]), traj(0, -1.0, []), traj(1, 1.0, ["ground", "classify"]),
                         traj(1, 1.0, [])])
    assert m["rollout/accuracy"] == 0.75 and m["reward/accuracy"] == 0.75
    assert m["tools/ground_per_episode"] == 0.5 and m["tools/classify_per_episode"] == 0.25
    assert m["groups/zero_variance_share"] == 0.5 and m["groups/reward_var_mean"] == pytest.approx(2.0 / 2)


def test_the_fused_optimizer_takes_adamws_steps():
    """``make_optimizer`` (fused AdamW where torch has the kernel) moves the parameters as the plain
    AdamW does, step after step, to float rounding; and it is fused on this CPU."""
    import copy

    from train.common import make_optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    twin, start = copy.deepcopy(model), copy.deepcopy(model)
    fused = make_optimizer(model, lr=0.05, weight_decay=0.1)
    plain = torch.optim.AdamW(twin.parameters(), lr=0.05, weight_decay=0.1)
    assert fused.defaults["fused"] is True
    x, y = torch.randn(32, 8), torch.randn(32, 3)
    for _ in range(5):
        for m, opt in ((model, fused), (twin, plain)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
    apart = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))
    moved = min((a - b).abs().max().item() for a, b in zip(model.parameters(), start.parameters()))
    assert apart < 1e-6 and moved > 0.05  # every tensor moved (5 steps of lr 0.05), both alike
