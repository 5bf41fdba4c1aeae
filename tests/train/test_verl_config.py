"""Composing verl's own ppo_trainer config with the seed's settings, presets and overrides; the launcher."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402

from medvqa_env.errors import ConfigError  # noqa: E402
from train.verl_integration import launch  # noqa: E402
from train.verl_integration.config import (  # noqa: E402
    AGENT_NAME,
    ALGORITHMS,
    SEED_SETTINGS,
    compose_config,
    validate,
)


@pytest.fixture(scope="module")
def default_cfg():
    return compose_config()


def test_seed_settings_land_on_verl_keys(default_cfg):
    for s in SEED_SETTINGS:
        if s.key == "actor_rollout_ref.actor.ppo_mini_batch_size":
            continue  # an interpolation of data.train_batch_size, checked below
        assert OmegaConf.select(default_cfg, s.key) == s.value, s.key
    a = default_cfg.actor_rollout_ref
    assert a.model.path == "Qwen/Qwen3-VL-8B-Instruct"
    assert (a.rollout.n, default_cfg.data.train_batch_size, a.rollout.temperature) == (8, 32, 0.7)
    assert (a.actor.optim.lr, a.actor.use_kl_loss, a.actor.kl_loss_coef) == (1e-6, True, 0.01)
    assert a.actor.ppo_mini_batch_size == 32
    assert default_cfg.algorithm.adv_estimator == "grpo"
    # verl derives the rollout lengths from data.*; the seed's caps reach the agent loop
    assert a.rollout.response_length == default_cfg.data.max_response_length == 8192
    assert default_cfg.medvqa.max_action_length == 4096 and default_cfg.medvqa.max_obs_length == 8192
    assert default_cfg.medvqa.env.max_turns == 3
    assert a.rollout.multi_turn.enable and a.rollout.agent.default_agent_loop == AGENT_NAME
    assert default_cfg.reward.custom_reward_function.name == "compute_score"
    assert default_cfg.reward.custom_reward_function.path.endswith("train/verl_integration/reward.py")


def test_default_config_passes_verl_validation(default_cfg):
    validate(default_cfg)


def test_overrides_win_over_seed_and_preset():
    cfg = compose_config(["actor_rollout_ref.rollout.n=4", "data.train_batch_size=16",
                          "actor_rollout_ref.actor.clip_ratio_high=0.3", "medvqa.env.dataset=slake",
                          "medvqa.env.max_turns=1", "trainer.experiment_name=mine"], algorithm="dapo")
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.data.train_batch_size == 16 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 16
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == 0.3  # preset said 0.28
    assert cfg.medvqa.env.dataset == "slake" and cfg.medvqa.env.max_turns == 1
    assert cfg.medvqa.env.answer_protocol == "boxed"  # untouched defaults stay
    assert cfg.trainer.experiment_name == "mine"
    validate(cfg)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_algorithm_presets_as_verl_spells_them(algorithm):
    cfg = compose_config(algorithm=algorithm)
    actor, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    if algorithm == "gspo":
        assert actor.policy_loss.loss_mode == "gspo" and actor.loss_agg_mode == "seq-mean-token-mean"
        assert (actor.clip_ratio_low, actor.clip_ratio_high) == (3e-4, 4e-4)
    elif algorithm == "dapo":
        assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
        assert algo.filter_groups.enable and algo.filter_groups.metric == "acc"
        assert cfg.medvqa.overlong_buffer.enable
    elif algorithm == "drgrpo":
        assert algo.norm_adv_by_std_in_grpo is False and actor.loss_agg_mode == "seq-mean-token-sum-norm"
    else:
        assert actor.policy_loss.loss_mode == "vanilla" and algo.norm_adv_by_std_in_grpo is True
    assert actor.use_kl_loss and actor.kl_loss_coef == 0.01  # the seed's KL stays on in every preset
    assert cfg.trainer.experiment_name == f"qwen3vl_8b_armed_{algorithm}"
    validate(cfg)


def test_bad_inputs_fail_clearly():
    with pytest.raises(ConfigError, match="Did you mean 'grpo'"):
        compose_config(algorithm="grop")
    with pytest.raises(ConfigError, match="verl rejected an override"):
        compose_config(["data.no_such_key=1"])
    with pytest.raises(ConfigError, match="key=value"):
        compose_config(["data.train_batch_size"])
    with pytest.raises(ConfigError, match="ppo_mini_batch_size"):
        validate(compose_config(["actor_rollout_ref.actor.ppo_mini_batch_size=64"]))
    with pytest.raises(ConfigError, match="max_assistant_turns >= medvqa.env.max_turns"):
        validate(compose_config(["medvqa.env.max_turns=5"]))
    with pytest.raises(ConfigError, match="overlong_buffer.len"):
        validate(compose_config(["medvqa.overlong_buffer.len=9000"], algorithm="dapo"))


def test_dry_run_prints_validated_config(capsys, tmp_path):
    rc = launch.run(["--engine", "verl", "--dry-run", "--algorithm", "gspo", "--output-dir", str(tmp_path),
                     "data.train_batch_size=8", "medvqa.env.dataset=embedded"])
    out = capsys.readouterr().out
    assert rc == 0
    cfg = OmegaConf.create(out.split("\n", 1)[1])
    assert cfg.data.train_batch_size == 8 and cfg.medvqa.env.dataset == "embedded"
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "gspo"
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path == str(tmp_path / "agent_loops.yaml")
    assert "PYTHONPATH" in cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_bad_override_exits_2(capsys):
    assert launch.run(["--dry-run", "actor_rollout_ref.rollout.nn=3"]) == launch.EXIT_CONFIG
    assert "verl rejected" in capsys.readouterr().err


def test_launch_without_gpu_prepares_then_fails_clearly(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MEDVQA_CACHE", str(tmp_path / "cache"))
    rc = launch.run(["--output-dir", str(tmp_path), "--prepare-data", "--limit", "3", "--val-split", "val",
                     "medvqa.env.dataset=embedded", "medvqa.env.dataset_options.n=4"])
    captured = capsys.readouterr()
    import pyarrow.parquet as pq

    for split in ("train", "val"):
        rows = pq.read_table(tmp_path / "data" / f"{split}.parquet").to_pylist()
        assert len(rows) == 3 and rows[0]["extra_info"]["split"] == split
    assert (tmp_path / "agent_loops.yaml").read_text().startswith(f"- name: {AGENT_NAME}")
    if launch.preflight():  # this machine: no GPU, no vLLM
        assert rc == launch.EXIT_NO_GPU
        assert "cannot launch verl here" in captured.err and "GPU" in captured.err
    else:  # pragma: no cover - a GPU node would get past the preflight
        assert rc == launch.EXIT_OK


def test_cpu_dry_run_has_the_cpu_overrides_and_platform_env(capsys, tmp_path):
    """``--device cpu``: verl's config validates with the CPU overrides, and every Ray worker gets
    the variables that load our CPU platform through verl's own hook."""
    from train.verl_integration.config import CPU_OVERRIDES
    from train.verl_integration.cpu_platform import cpu_env_vars

    rc = launch.run(["--device", "cpu", "--dry-run", "--output-dir", str(tmp_path), "data.train_batch_size=2",
                     "actor_rollout_ref.rollout.n=2"])
    out = capsys.readouterr().out
    assert rc == 0
    cfg = OmegaConf.create(out.split("\n", 1)[1])
    for key, value in CPU_OVERRIDES.items():
        assert OmegaConf.select(cfg, key.lstrip("+")) == value, key
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert {k: env[k] for k in cpu_env_vars()} == cpu_env_vars()
    assert cfg.trainer.checkpoint_callback_class.endswith("RewardStateCheckpoint")
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class.endswith("MedVQAAgentLoopManager")


def test_cpu_launch_outside_the_cpu_venv_fails_clearly(capsys, tmp_path, monkeypatch):
    if not launch.preflight("cpu"):
        pytest.skip("this venv can launch verl on CPU (test_verl_trainer_cpu.py runs that launch)")
    monkeypatch.setenv("MEDVQA_CACHE", str(tmp_path / "cache"))
    rc = launch.run(["--device", "cpu", "--output-dir", str(tmp_path), "--prepare-data", "--limit", "2",
                     "--answer-types", "OPEN", "--image-mode", "none", "medvqa.env.dataset=embedded"])
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    assert [r["extra_info"]["answer_type"] for r in rows] == ["OPEN", "OPEN"]
    assert rows[0]["images"] == [] and "<image>" not in rows[0]["prompt"][1]["content"]
    assert rc == launch.EXIT_NO_GPU  # the main venv: no vLLM by design
    assert "setup_verl_cpu.sh" in capsys.readouterr().err


def test_docs_table_lists_every_seed_setting():
    from train.verl_integration.config import REPO_ROOT

    doc = (REPO_ROOT / "docs" / "verl.md").read_text()
    for s in SEED_SETTINGS:
        assert f"| `{s.key}` | `{s.value}` |" in doc, s.key
    for preset in ALGORITHMS:
        assert f"`{preset}`" in doc


def test_module_doctests():
    import doctest

    from train.verl_integration import config, data, reward

    for module in (config, data, reward):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_native_trainer_args_are_translated(capsys, tmp_path):
    """``train/grpo.py --engine verl`` hands over its Args dataclass: changed fields map, the rest
    keep the seed's settings."""
    from dataclasses import dataclass

    @dataclass
    class Args:  # the shape of train.grpo.Args (field names and CPU-sized defaults)
        engine: str = "native"
        algo: str = "grpo"
        policy: str = "smollm2"
        max_turns: int = 1
        group_size: int = 4
        lr: float = 2e-5
        out: str = "runs/grpo"

    argv = launch.argv_from_native(Args(engine="verl", algo="gspo", policy="/ckpt/sft", max_turns=2,
                                        out=str(tmp_path)))
    assert argv[:2] == ["--algorithm", "gspo"] and "actor_rollout_ref.model.path=/ckpt/sft" in argv
    assert launch.run(Args(engine="verl", algo="gspo", out=str(tmp_path))) == launch.EXIT_CONFIG
    assert "data file(s) not found" in capsys.readouterr().err  # got past composing and validating
    cfg = compose_config([a for a in argv if "=" in a], algorithm="gspo")
    assert cfg.medvqa.env.max_turns == 2 and cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 3
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.actor_rollout_ref.actor.optim.lr == 1e-6  # seed kept
    validate(cfg)
    assert launch.run(object()) == launch.EXIT_CONFIG
    assert "expected a list of arguments" in capsys.readouterr().err
