"""Compose verl's own PPO trainer config with the seed's GRPO settings.

verl's ``ppo_trainer.yaml`` (from the installed package, through Hydra, exactly as
``verl.trainer.main_ppo`` loads it) is the base. On top, in this order, later wins:

1. :data:`SEED_SETTINGS` -- seed 000 §3.2 (Qwen3-VL-8B, n=8, batch 32, T=0.7, lr 1e-6,
   KL loss 0.01, max_turns 3, max_action_length 4096, max_obs_length 8192) in verl's names;
2. :data:`WIRING` -- what makes verl run our agent loop and reward (multi-turn on, agent loop
   ``medvqa_agent``, custom reward function, data keys);
3. :data:`ALGORITHMS` -- the preset picked with ``--algorithm`` (grpo, gspo, dapo, drgrpo);
4. the user's ``key=value`` overrides.

Our own settings (the env's kwargs, per-turn token caps, DAPO's overlong buffer) live in a
``medvqa`` section of the same config, which the agent loop reads on the workers.

>>> ALGORITHMS["gspo"]["actor_rollout_ref.actor.policy_loss.loss_mode"]
'gspo'
>>> split_overrides(["medvqa.env.dataset=slake", "data.train_batch_size=8"])
(['data.train_batch_size=8'], ['env.dataset=slake'])
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from medvqa_env.errors import ConfigError, unknown_name_message

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENT_NAME = "medvqa_agent"
AGENT_LOOP_TARGET = "train.verl_integration.agent_loop.MedVQAAgentLoop"
REWARD_PATH = str(Path(__file__).resolve().with_name("reward.py"))


@dataclass(frozen=True)
class SeedSetting:
    """One row of the seed -> verl mapping (also the table in ``docs/verl.md``)."""

    seed: str
    key: str
    value: Any
    note: str = ""


SEED_SETTINGS: tuple[SeedSetting, ...] = (
    SeedSetting("backbone Qwen3-VL-8B-Instruct", "actor_rollout_ref.model.path", "Qwen/Qwen3-VL-8B-Instruct",
                "point at the SFT checkpoint for stage 2"),
    SeedSetting("GRPO", "algorithm.adv_estimator", "grpo"),
    SeedSetting("n=8 rollouts per prompt", "actor_rollout_ref.rollout.n", 8),
    SeedSetting("batch_size=32", "data.train_batch_size", 32, "prompts per step (x n = 256 trajectories)"),
    SeedSetting("batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size", "${data.train_batch_size}",
                "one update per step (follows the batch size)"),
    SeedSetting("temperature=0.7", "actor_rollout_ref.rollout.temperature", 0.7),
    SeedSetting("lr=1e-6", "actor_rollout_ref.actor.optim.lr", 1e-6),
    SeedSetting("kl_loss_coef=0.01", "actor_rollout_ref.actor.use_kl_loss", True, "KL as a loss, not in the reward"),
    SeedSetting("kl_loss_coef=0.01", "actor_rollout_ref.actor.kl_loss_coef", 0.01, "v1's 0 let the policy drift"),
    SeedSetting("kl_loss_coef=0.01", "actor_rollout_ref.actor.kl_loss_type", "low_var_kl"),
    SeedSetting("kl_loss_coef=0.01", "algorithm.use_kl_in_reward", False),
    SeedSetting("max_turns=3", "medvqa.env.max_turns", 3, "tool turns in MedVQAEnv"),
    SeedSetting("max_turns=3", "actor_rollout_ref.rollout.multi_turn.max_user_turns", 3, "observations"),
    SeedSetting("max_turns=3", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns", 4,
                "3 tool turns + the answer turn"),
    SeedSetting("max_action_length=4096", "medvqa.max_action_length", 4096, "max new tokens per model turn"),
    SeedSetting("max_obs_length=8192", "medvqa.max_obs_length", 8192, "observation tokens kept per tool turn"),
    SeedSetting("max_obs_length=8192", "actor_rollout_ref.rollout.multi_turn.max_tool_response_length", 8192,
                "verl's own cap (characters) for its tool agent"),
    SeedSetting("(trajectory budget)", "data.max_response_length", 8192,
                "all turns + observations; tokens past it end the episode"),
    SeedSetting("(prompt budget)", "data.max_prompt_length", 4096, "system prompt + question + image tokens"),
)

# What makes verl run *our* rollout and reward; ``None`` values are filled in by compose_config.
WIRING: dict[str, Any] = {
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.mode": "async",
    "actor_rollout_ref.rollout.multi_turn.enable": True,
    "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_NAME,
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": None,  # written by launch.prepare_run
    # verl's TQ worker + the validate flag and TransferQueue-safe extra_fields (worker.py)
    "+actor_rollout_ref.rollout.agent.agent_loop_manager_class": "train.verl_integration.worker.MedVQAAgentLoopManager",
    # the reward state (ARMed thresholds) into verl's checkpoints and back (reward_state.py)
    "trainer.checkpoint_callback_class": "train.verl_integration.reward_state.RewardStateCheckpoint",
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.calculate_log_probs": True,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.model.use_remove_padding": True,
    "data.prompt_key": "prompt",
    "data.image_key": "images",
    "data.return_raw_chat": True,
    "data.filter_overlong_prompts": True,
    "data.truncation": "error",
    "data.train_files": None,  # --train-files
    "data.val_files": None,  # --val-files
    "reward.custom_reward_function.path": REWARD_PATH,
    "reward.custom_reward_function.name": "compute_score",
    "trainer.project_name": "medvqa_gym",
    "trainer.experiment_name": None,  # qwen3vl_8b_armed_<algorithm>
    "trainer.logger": ["console"],
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "trainer.save_freq": 30,
    "trainer.test_freq": 30,
    "trainer.val_before_train": False,
}

# Presets as verl spells them. KL stays on in every preset (the seed's lesson); the papers that
# drop it (DAPO, Dr.GRPO) are one override away: actor_rollout_ref.actor.use_kl_loss=false.
ALGORITHMS: dict[str, dict[str, Any]] = {
    "grpo": {},
    "gspo": {  # sequence-level ratio (Zheng et al. 2025); verl's recommended GSPO clip range
        "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
        "actor_rollout_ref.actor.clip_ratio_low": 3e-4,
        "actor_rollout_ref.actor.clip_ratio_high": 4e-4,
    },
    "dapo": {  # clip-higher, token-level loss, dynamic sampling, overlong reward shaping
        "actor_rollout_ref.actor.clip_ratio_low": 0.2,
        "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "algorithm.filter_groups.enable": True,
        "algorithm.filter_groups.metric": "acc",
        "algorithm.filter_groups.max_num_gen_batches": 10,
        "medvqa.overlong_buffer.enable": True,
    },
    "drgrpo": {  # no std normalisation, no length normalisation
        "algorithm.norm_adv_by_std_in_grpo": False,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
    },
}

# ``--device cpu``: what verl's trainer needs to run without an accelerator (with the platform and
# patches of :mod:`train.verl_integration.cpu_platform`). Applied after the algorithm preset, before
# the user's overrides. Keys starting with "+" are not in verl's YAML (its dataclasses have them).
CPU_OVERRIDES: dict[str, Any] = {
    "trainer.device": "cpu",
    "trainer.n_gpus_per_node": 1,  # one FSDP rank and one vLLM replica; Ray sees one fake GPU
    "ray_kwargs.ray_init.num_cpus": 32,  # logical: each placement bundle asks for 10 CPUs + 1 GPU
    "+ray_kwargs.ray_init.num_gpus": 1,
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",  # default flash_attention_2
    "actor_rollout_ref.model.use_remove_padding": False,  # flash-attn varlen kernels
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    "actor_rollout_ref.actor.use_torch_compile": False,
    # fp32 compute on CPU (FSDP's mixed precision defaults to bf16 params): rollout and actor agree
    "actor_rollout_ref.actor.fsdp_config.dtype": "float32",
    "actor_rollout_ref.ref.fsdp_config.dtype": "float32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                             "buffer_dtype": "fp32"},
    "+actor_rollout_ref.ref.fsdp_config.mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                           "buffer_dtype": "fp32"},
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.dtype": "float32",
    "actor_rollout_ref.rollout.enforce_eager": True,  # no CUDA graphs
    "actor_rollout_ref.rollout.free_cache_engine": False,
    "+actor_rollout_ref.rollout.enable_sleep_mode": False,  # sleep mode is CUDA memory pooling
    # vLLM 0.32 normalises images inside the model (FusedMMInputNorm) by default; its constants are
    # part of the model's state, which verl's load_format=dummy start randomises and verl's weight
    # sync (the HF checkpoint's tensors) never restores: the rollout's vision tower would read
    # garbage pixels. Host-side normalisation, as the actor's processor does, gives the same pixels.
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.mm_device_do_normalize": False,
    "actor_rollout_ref.rollout.agent.num_workers": 1,  # agent-loop workers (each loads the env + ARMed)
    "data.dataloader_num_workers": 0,
    "reward.num_workers": 1,  # reward-loop actors (idle with our agent loop: the env scores)
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
}

# Our own section (read by the agent loop on the workers).
MEDVQA_DEFAULTS: dict[str, Any] = {
    "env": {
        "dataset": "vqa_rad",
        "split": "train",
        "dataset_options": {},
        "tools": None,
        "max_turns": 3,
        "answer_protocol": "boxed",
        "observation_style": "observation_tag",
        "format_penalty": 0.0,
    },
    "max_action_length": 4096,
    "max_obs_length": 8192,
    "stop": [],  # extra stop strings per turn, e.g. ["</tool_call>"]
    # a prompted first turn: {name, arguments} becomes '<tool_call>{json}</tool_call>', given, not sampled
    # (response_mask 0); the env runs the call for real. Tool turns for a policy that never writes one.
    "scripted_tool_call": None,
    "episode_log_dir": None,  # one JSON line per episode with what the env computed (reward_state.episode_log)
    # read the policy's episodes as the project's trainers saved it to: the system prompt and image size
    # of <actor_rollout_ref.model.path>/medvqa_run.json (agents.models.load_policy's rule), see agent_loop
    "checkpoint_settings": False,
    "overlong_buffer": {"enable": False, "len": 1024, "penalty_factor": 1.0},
    # ARMed's adaptive thresholds: "auto" = one Ray actor for all workers under Ray, else local;
    # "armed": ARMedConfig overrides, e.g. {bertscore_model: /models/pubmedbert, bertscore_layers: 8,
    # cosine_model: /models/biobert-sts} for the seed's backbones.
    "reward": {"threshold_store": "auto", "armed": {}},
}


def verl_config_dir() -> str:
    """The folder of verl's own trainer YAMLs inside the installed package."""
    import verl

    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate verl overrides from ``medvqa.*`` ones (returned without the prefix)."""
    verl_ov, ours = [], []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"expected an override of the form key=value, got {item!r}")
        key = item.split("=", 1)[0].lstrip("+~")
        if key == "medvqa" or key.startswith("medvqa."):
            ours.append(item.lstrip("+~")[len("medvqa."):])
        else:
            verl_ov.append(item)
    return verl_ov, ours


def _hydra_value(value: Any) -> str:
    """Render a Python value in Hydra override grammar.

    >>> _hydra_value(True), _hydra_value(["console"]), _hydra_value(1e-06), _hydra_value("a b")
    ('true', '[console]', '1e-06', "'a b'")
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if any(c in text for c in " ,[]{}()=:'\"") or text == "":
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


DEVICES = ("cuda", "cpu")


def base_overrides(algorithm: str = "grpo", device: str = "cuda") -> tuple[list[str], dict[str, Any]]:
    """Seed settings + wiring + algorithm preset (+ :data:`CPU_OVERRIDES` for ``device="cpu"``), as
    (verl Hydra overrides, medvqa dotted values)."""
    if algorithm not in ALGORITHMS:
        raise ConfigError(unknown_name_message("algorithm", algorithm, ALGORITHMS))
    if device not in DEVICES:
        raise ConfigError(unknown_name_message("device", device, DEVICES))
    verl_values: dict[str, Any] = {}
    ours: dict[str, Any] = {}
    items = [(s.key, s.value) for s in SEED_SETTINGS] + list(WIRING.items()) + list(ALGORITHMS[algorithm].items())
    items.append(("trainer.experiment_name", f"qwen3vl_8b_armed_{algorithm}"))
    if device == "cpu":
        items += list(CPU_OVERRIDES.items())
    for key, value in items:
        if key.startswith("medvqa."):
            ours[key[len("medvqa."):]] = value
        elif value is not None:
            verl_values[key] = value
    return [f"{k}={_hydra_value(v)}" for k, v in verl_values.items()], ours


def compose_config(overrides: Sequence[str] = (), algorithm: str = "grpo", device: str = "cuda"):
    """verl's ``ppo_trainer`` config with our layers on top; returns an OmegaConf ``DictConfig``.

    Raises :class:`ConfigError` for an unknown algorithm or a key verl's config does not have
    (Hydra's message says which).
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    user_verl, user_ours = split_overrides(list(overrides))
    seed_verl, seed_ours = base_overrides(algorithm, device)
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=seed_verl + user_verl)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"verl rejected an override: {err}") from None
    finally:
        GlobalHydra.instance().clear()

    medvqa = OmegaConf.create(MEDVQA_DEFAULTS)
    for key, value in seed_ours.items():
        OmegaConf.update(medvqa, key, value, merge=False)
    try:
        medvqa = OmegaConf.merge(medvqa, OmegaConf.from_dotlist(user_ours))
    except OmegaConfBaseException as err:
        raise ConfigError(f"bad medvqa override in {user_ours}: {err}") from None
    OmegaConf.set_struct(cfg, False)
    cfg.medvqa = medvqa
    cfg.medvqa.algorithm = algorithm
    OmegaConf.set_struct(cfg, True)
    return cfg


def validate(cfg) -> None:
    """Check the composed config against verl's schema: its dataclasses (``omega_conf_to_dataclass``
    on actor, rollout, algorithm) and ``verl.utils.config.validate_config`` (batch divisibility,
    micro-batch rules, ...). No GPU is needed. Raises :class:`ConfigError`."""
    import warnings

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
            omega_conf_to_dataclass(cfg.algorithm)
            validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except (AssertionError, ValueError, TypeError) as err:
        raise ConfigError(f"verl rejected the composed config: {err}") from None
    _validate_medvqa(cfg)


def _validate_medvqa(cfg) -> None:
    m = cfg.medvqa
    response_length = int(cfg.actor_rollout_ref.rollout.response_length)
    for key in ("max_action_length", "max_obs_length"):
        value = m[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"expected medvqa.{key} to be a positive int, got {value!r}")
    store = m.reward.threshold_store
    if store not in ("auto", "local", "ray"):
        raise ConfigError(f"expected medvqa.reward.threshold_store in ('auto', 'local', 'ray'), got {store!r}")
    ob = m.overlong_buffer
    if ob.enable and not 0 < int(ob.len) < response_length:
        raise ConfigError(
            f"expected medvqa.overlong_buffer.len in 1..{response_length - 1} (response_length), got {ob.len!r}")
    if cfg.actor_rollout_ref.rollout.agent.default_agent_loop != AGENT_NAME:
        return
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    if not multi_turn.enable:
        raise ConfigError("expected actor_rollout_ref.rollout.multi_turn.enable=true for the medvqa agent loop")
    env_turns = int(m.env.max_turns)
    if multi_turn.max_assistant_turns is not None and int(multi_turn.max_assistant_turns) < env_turns + 1:
        raise ConfigError(
            f"expected actor_rollout_ref.rollout.multi_turn.max_assistant_turns >= medvqa.env.max_turns + 1 "
            f"= {env_turns + 1} (tool turns + the answer turn), got {multi_turn.max_assistant_turns}")


def plain(value: Any) -> Any:
    """OmegaConf containers -> plain Python (verl hands sections over as ``DictConfig``)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        pass
    return value
