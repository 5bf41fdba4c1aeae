"""A training run killed with SIGKILL and rerun with the same command ends exactly where an
uninterrupted run with the same seed ends: the same metrics step by step and the same weights.

(The evaluation's kill-then-compare is ``tests/eval/test_eval_cli.py``; the trainer had none.)
GRASP on a tiny random Qwen2-VL so that every step changes the weights (its SFT term always
has a gradient, even when every rollout fails).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hardening_helpers import REPO

STEPS = 5


def command(out: Path) -> list[str]:
    return [sys.executable, "-m", "train.grpo", "--policy", "tiny-qwen2-vl", "--algo", "grasp", "--steps", str(STEPS),
            "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "8", "--eval_every", "0",
            "--eval_size", "4", "--save_every", "1", "--tensorboard", "false", "--save_final", "false",
            "--seed", "3", "--out", str(out)]


def env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def metrics_by_step(out: Path) -> dict[int, dict]:
    rows = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = {k: v for k, v in row.items() if not k.startswith("time/")}  # last row per step wins
    return rows


def latest_step(out: Path) -> int:
    marker = out / "checkpoints" / "latest"
    try:
        return int(marker.read_text().strip().rsplit("_", 1)[1])
    except (OSError, ValueError, IndexError):
        return 0


@pytest.mark.slow
def test_a_killed_training_run_resumes_to_the_same_weights_and_metrics(tmp_path):
    import torch

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run = subprocess.run(command(whole), cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]

    proc = subprocess.Popen(command(killed), cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while latest_step(killed) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    at_kill = latest_step(killed)
    assert proc.returncode == -signal.SIGKILL and 2 <= at_kill < STEPS, "the run should have been killed mid-way"

    rerun = subprocess.run(command(killed), cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "resumed from" in rerun.stdout + rerun.stderr

    assert metrics_by_step(killed) == metrics_by_step(whole)
    from safetensors.torch import load_file

    final = f"step_{STEPS:06d}"
    a = load_file(whole / "checkpoints" / final / "model.safetensors")
    b = load_file(killed / "checkpoints" / final / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
