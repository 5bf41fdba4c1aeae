"""The verl CLOSED launcher gives every seed the reward and update settings of the native record.

``benchmarks/runs/protocol/closed_verl/run.sh`` trains the protocol's task through verl against a
native record; issue 42: every reward-trained run gets the same reward, so its format penalty, KL
coefficient, learning rate and temperature must be the ones the record's own GRPO runs were given
(``train.protocol.grpo_runs``). The launcher's ``DRY_RUN=1`` prints each seed's verl arguments
without running anything; they are compared here with the native GRPO command line built from the
same record. Red when the launcher hard-codes a value (it had ``kl_loss_coef=0.01`` and no format
penalty) or the native side changes what it passes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from train import protocol

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "benchmarks" / "runs" / "protocol" / "closed_verl" / "run.sh"


def write_record(tmp_path: Path, args: protocol.Args, drop: tuple[str, ...] = ()) -> Path:
    saved = {k: v for k, v in asdict(args).items() if k not in ("out", "export") + drop}
    builds = protocol.builds_of(args)
    ident = {"tools": {"ground": {str(b): {"content_hash": f"hash{b}"} for b in builds}},
             "warm_starts": {str(b): {"checkpoint": f"warm_sft_b{b}/checkpoints/step_000100"} for b in builds}}
    path = tmp_path / "record" / "protocol.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"args": saved, "identity": ident}))
    return path


def verl_argv(record: Path, tmp_path: Path, seeds: list[int]) -> tuple[str, dict[int, dict[str, str]]]:
    """The launcher's dry run: its settings line and each seed's ``key=value`` overrides."""
    env = {**os.environ, "DRY_RUN": "1", "PY": sys.executable, "RECORD": str(record), "B": str(tmp_path / "b"),
           "SEEDS": " ".join(map(str, seeds)), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", str(LAUNCHER)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    per_seed = {}
    for line in lines[1:]:
        head, _, rest = line.partition(":")
        per_seed[int(head.split()[1])] = dict(a.split("=", 1) for a in shlex.split(rest) if "=" in a and not a.startswith("--"))
    assert not (tmp_path / "b").exists(), "a dry run must not write anything"
    return lines[0], per_seed


def native_argv(args: protocol.Args, monkeypatch) -> dict[int, list[str]]:
    """What ``train.protocol`` gives each GRPO seed (its run() captured, nothing trained)."""
    got: dict[int, list[str]] = {}
    monkeypatch.setattr(protocol, "run", lambda out, name, module, argv: got.setdefault(int(name.split("_s")[1]), argv))
    warm = {b: {"checkpoint": f"warm_sft_b{b}/checkpoints/step_000100"} for b in protocol.builds_of(args)}
    protocol.grpo_runs(args, Path("/nonexistent"), warm)
    return got


def flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


@pytest.mark.parametrize("tool_builds", [0, 3])
def test_verl_seeds_get_the_native_reward_and_update(tmp_path, monkeypatch, tool_builds):
    args = protocol.Args(seeds="0,1,2,3", tool_builds=tool_builds, format_penalty=-0.2, kl_coef=0.03,
                         grpo_lr=7e-4, temperature=0.9)
    record = write_record(tmp_path, args)
    header, verl = verl_argv(record, tmp_path, [0, 1, 2, 3])
    native = native_argv(args, monkeypatch)
    assert set(verl) == set(native) == {0, 1, 2, 3}
    for seed, argv in native.items():
        v = verl[seed]
        assert float(v["medvqa.env.format_penalty"]) == float(flag(argv, "--format_penalty", "0")) == -0.2
        assert float(v["actor_rollout_ref.actor.kl_loss_coef"]) == float(flag(argv, "--kl_coef")) == 0.03
        assert v["actor_rollout_ref.actor.use_kl_loss"] == "true"
        assert float(v["actor_rollout_ref.actor.optim.lr"]) == float(flag(argv, "--lr")) == 7e-4
        assert float(v["actor_rollout_ref.rollout.temperature"]) == float(flag(argv, "--temperature")) == 0.9
        # the same tool build (and so the same warm start) as the native seed
        assert f"ground.seed={v['medvqa.env.tools.ground.seed']}" == flag(argv, "--tool-opt")
        assert v["actor_rollout_ref.model.path"].endswith(f"policy_b{protocol.build_of(args, seed)}")
    assert "format_penalty=-0.2" in header and "kl_coef=0.03" in header


def test_a_record_from_before_the_format_penalty_keeps_its_own_reward(tmp_path, monkeypatch):
    """A record made before issue 42 stores no format_penalty/kl_coef: its runs had 0 and 0.01
    (train.protocol.recorded_args), and verl is given the same, not today's default."""
    args = protocol.Args(seeds="0,1", tool_builds=3)
    record = write_record(tmp_path, args, drop=("format_penalty", "kl_coef"))
    _, verl = verl_argv(record, tmp_path, [0, 1])
    old = protocol.recorded_args(json.loads(record.read_text())["args"], record.parent)
    native = native_argv(old, monkeypatch)
    for seed, argv in native.items():
        assert flag(argv, "--format_penalty") is None  # 0: not passed natively
        assert float(verl[seed]["medvqa.env.format_penalty"]) == 0.0
        assert float(verl[seed]["actor_rollout_ref.actor.kl_loss_coef"]) == float(flag(argv, "--kl_coef")) == 0.01
