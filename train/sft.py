"""SFT warm start on gold trajectories (seed 000 §3.1), built by playing the env with a script.

    python -m train.sft --policy smollm2 --steps 20 --out runs/sft
    python -m train.sft --policy Qwen/Qwen2.5-VL-3B-Instruct --device cuda --dtype bfloat16 \
        --tools image_zoom_in,segment=classical --dataset vqa_rad --dataset-opt root=/data/vqa_rad

A gold trajectory is what a competent agent would do: one tool call chosen from the question and
the available tools (:func:`gold_tool_call`), the env's real tool output, then the gold answer
boxed. Only the model's turns are trained (cross-entropy); observations are context. The result,
``<out>/final``, is an HF folder :mod:`train.grpo` starts from (``--policy <out>/final``).

Checkpoints, resume and logging work as in :mod:`train.grpo`: every ``--save-every`` steps
``<out>/checkpoints/step_N`` is an HF folder (with ``medvqa_run.json``) that ``eval.run`` or
``train.grpo --policy`` loads, so a warm start can be chosen on a validation split
(``--keep 0`` keeps them all); a killed run resumes from its last checkpoint; a rerun with other
settings refuses and lists them (``--allow-changed`` accepts them); TensorBoard is on by default.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from medvqa_env.chat import Conversation
from medvqa_env.datasets import load_dataset
from medvqa_env.records import AnswerType, VQARecord
from train.algorithms import sft_loss
from train.batching import from_trajectory, micro_batches, pad_batch, response_logprobs
from medvqa_env.cli import NONE_IS_A_VALUE, run_cli
from medvqa_env.config import parse_options
from medvqa_env.errors import ConfigError
from train.checkpoint import (checkpoint_step, latest_checkpoint, load_checkpoint, record_settings, save_checkpoint,
                              trained_settings)
from train.common import (build_policy, check_resume, count_trainable, evaluate_ablations, evaluate_heldout,
                          make_optimizer, parse_args, run_env_kwargs, run_summary, save_policy, select_indices,
                          system_prompt_of, write_run_record)
from medvqa_env.pool import EnvPool
from train.metrics_log import MetricsLogger, purge_rows
from train.rollout import ScriptedGenerator, collect_rollouts
from train.run_report import eval_line, interrupted_message, write_curves

MODALITIES = ["CT", "MRI", "X-Ray", "Ultrasound"]


@dataclass
class Args:
    """Supervised warm start on scripted gold trajectories."""

    out: str = "runs/sft"
    """output folder: metrics.jsonl, tb/, checkpoints/, final/"""
    seed: int = 0
    """seed for sampling questions"""
    policy: str = "Qwen/Qwen2.5-VL-3B-Instruct"
    """model to fine-tune: an HF folder, a Hub id, ``smollm2`` or ``tiny-qwen2-vl`` (see agents.models)"""
    device: str = "auto"
    """``auto`` (CUDA when visible), ``cpu``, ``cuda`` or ``cuda:N``"""
    dtype: str = "float32"
    """``float32``, ``bfloat16`` or ``float16``"""
    system_prompt: str | None = None
    """replaces the env's system prompt (default: the env's); saved with the model, so GRPO and eval use it"""
    demo_prompt: bool = False
    """the CPU demo's short prompt (tells a blind model to call ``ground``)"""
    train_layers: int = 0
    """train only the top k decoder blocks (0 = all)"""
    lora_rank: int = 0
    """LoRA rank (0 = no LoRA)"""
    dataset: str = "embedded"
    """dataset name"""
    dataset_opt: list[str] = field(default_factory=list)
    """loader option ``key=value`` (repeatable), e.g. ``root=/data/vqa_rad``"""
    split: str = "train"
    """split to build gold trajectories from"""
    eval_split: str = "test"
    """held-out split"""
    answer_types: str = "CLOSED,MCQ"
    """question types to use"""
    tools: str | None = field(default=None, metadata={NONE_IS_A_VALUE: True})
    """tools: ``a,b=engine,c=http://host:port``, JSON, a config file, ``none``; default: the env's"""
    tool_opt: list[str] = field(default_factory=list)
    """tool option ``tool.key=value`` (repeatable)"""
    reward: str | None = None
    """the env's reward (see train.grpo --reward); only logged here"""
    reward_opt: list[str] = field(default_factory=list)
    """reward option ``key=value`` (repeatable)"""
    format_penalty: float = 0.0
    """the env's reward for a turn that neither calls a tool nor answers (only logged here, as the reward)"""
    answer_protocol: str = "boxed"
    """the env's answer protocol; the gold trajectories are written with ``\\boxed{}``, so only ``boxed``"""
    tool_share: float = 1.0
    """share of gold trajectories that use a tool (the rest answer directly; < 1 leaves RL a choice)"""
    misread_share: float = 0.0
    """share of the tool-calling gold trajectories that then give a wrong answer, as a demonstrator who
    misreads the tool would (issue 46's imperfect demonstrations; 0 = every demonstration right)"""
    max_turns: int = 3
    """tool turns per episode (seed: 3; the gold trajectories use one)"""
    batch_size: int = 8
    """trajectories per step"""
    steps: int = 20
    """optimiser steps"""
    lr: float = 5e-5
    """AdamW learning rate"""
    micro_batch: int = 8
    """sequences per forward/backward"""
    eval_size: int = 64
    """held-out questions evaluated before and after"""
    eval_every: int = 0
    """also evaluate every k steps (0 = only before and after)"""
    eval_ablations: str = ""
    """at the last step also evaluate with the images ``blank`` and/or ``shuffle``d (comma list;
    tools see the same ablated image): keys ``eval_<mode>/...``"""
    max_new_tokens: int = 40
    """tokens per turn at evaluation"""
    save_every: int = 10
    """save ``out/checkpoints/step_N`` (an HF folder eval.run and train.grpo load, plus optimizer/RNG
    state) every k steps; the last step is always saved (0 = only the last)"""
    keep: int = 2
    """checkpoints kept (the newest; 0 = all, e.g. to pick a warm start on a validation split)"""
    resume: bool = True
    """resume from ``out/checkpoints/latest`` when present (the settings must match ``out/args.json``)"""
    allow_changed: str = ""
    """settings that may differ from the run being resumed (comma list, or ``all``)"""
    torch_threads: int = 1
    """torch CPU threads"""
    tensorboard: bool = True
    """also log to TensorBoard (``out/tb``: scalars and the hyper-parameters with the final metrics)"""
    report_to: str = "none"
    """other trackers: ``wandb`` (needs the wandb package; WANDB_MODE=offline works offline) or ``none``"""
    wandb_project: str = "medvqa-gym"
    """W&B project for ``--report-to wandb``"""
    save_final: bool = True
    """write ``out/final`` (an HF folder, LoRA merged) at the end"""


def gold_tool_call(record: VQARecord, tools: list[str]) -> str | None:
    """A sensible first tool call for ``record`` (``None`` = answer directly): ``ground`` for
    lesion questions, ``classify`` over modalities for modality questions, ``image_zoom_in`` on
    the first annotated box whose label the question names."""
    q = record.question.lower()
    if "ground" in tools and "lesion" in q:
        return '<tool_call>{"name": "ground", "arguments": {"text": "lesion"}}</tool_call>'
    if "classify" in tools and "modality" in q:
        return '<tool_call>{"name": "classify", "arguments": {"labels": ' + json.dumps(MODALITIES) + "}}</tool_call>"
    if "image_zoom_in" in tools:
        for b in record.annotations.boxes:
            if b.label.lower() in q:
                box = [int(v) for v in b.bbox]
                return '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": ' + json.dumps(box) + "}}</tool_call>"
    return None


def gold_script(dataset, tools: list[str], tool_share: float = 1.0, seed: int = 0,
                misread_share: float = 0.0) -> Callable[[Conversation], str]:
    """The scripted agent: first turn the gold tool call (if any), then ``\\boxed{gold}``. With
    ``tool_share < 1`` a fixed (seeded, per-record) share of the questions is answered directly;
    with ``misread_share > 0`` a fixed share of those that call a tool answer with
    :func:`wrong_answer` after it (imperfect demonstrations)."""
    import random

    if not (0.0 <= tool_share <= 1.0 and 0.0 <= misread_share <= 1.0):
        raise ConfigError(f"expected tool_share and misread_share in [0, 1], got {tool_share!r} and {misread_share!r}")
    wrong = wrong_answers(dataset) if misread_share else {}

    def script(conv: Conversation) -> str:
        record = dataset[dataset.index_of(conv.info["record_id"])]
        use_tool = random.Random(f"{seed}:{record.id}").random() < tool_share
        call = gold_tool_call(record, tools) if use_tool else None
        if conv.turns == 0 and call:
            return call
        misread = bool(call) and random.Random(f"{seed}:{record.id}:misread").random() < misread_share
        answer = wrong.get(record.id, record.answer) if misread else record.answer
        return f"\\boxed{{{answer}}}"
    return script


def wrong_answers(dataset) -> dict[str, str]:
    """A fixed wrong answer per record: the other of yes/no, the next option letter, or (OPEN) the next
    of the answers its question type takes in the dataset; a record with no other answer is left out."""
    by_type: dict[str, list[str]] = {}
    for r in dataset:
        by_type.setdefault(r.question_type or "", [])
        if r.answer not in by_type[r.question_type or ""]:
            by_type[r.question_type or ""].append(r.answer)
    out = {}
    for r in dataset:
        if r.answer_type == AnswerType.CLOSED and r.answer.lower() in ("yes", "no"):
            out[r.id] = "no" if r.answer.lower() == "yes" else "yes"
        elif r.options and len(r.options) > 1 and r.answer in r.options:
            letters = sorted(r.options)
            out[r.id] = letters[(letters.index(r.answer) + 1) % len(letters)]
        else:
            pool = sorted(by_type[r.question_type or ""])
            if len(pool) > 1:
                out[r.id] = pool[(pool.index(r.answer) + 1) % len(pool)]
    return out


def main(args: Args) -> dict[str, float]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    if args.answer_protocol != "boxed":
        raise ConfigError(f"expected --answer-protocol boxed (gold answers are \\boxed{{}}), got {args.answer_protocol!r}")
    if args.save_every < 0 or args.steps < 1:
        raise ConfigError(f"expected --steps >= 1 and --save-every >= 0, got {args.steps!r} and {args.save_every!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # ---- the run record: a resume with other settings refuses and lists them ----------------
    ckpt = latest_checkpoint(out)
    if ckpt is not None and not args.resume:
        raise ConfigError(f"{out} already holds checkpoints (up to {ckpt.name}); pass --resume to continue "
                          "that run, or choose another --out")
    check_resume(out, args, ckpt)
    start_step = checkpoint_step(ckpt) if ckpt is not None else 0
    record = write_run_record(out, args, resumed_at=start_step if ckpt is not None else None)
    if start_step >= args.steps and (out / "final").exists():
        print(f"{out} already finished {args.steps} steps; nothing to do")
        write_curves(out, "train.sft")
        print(run_summary("train.sft", args, out, None, len(select_indices(
            args.dataset, args.eval_split, args.answer_types, limit=args.eval_size,
            dataset_options=parse_options(args.dataset_opt, "--dataset-opt")))))
        return {}

    # ---- data and envs --------------------------------------------------------------------
    options = parse_options(args.dataset_opt, "--dataset-opt")
    dataset = load_dataset(args.dataset, split=args.split, **options)
    train_idx = select_indices(args.dataset, args.split, args.answer_types, dataset_options=options)
    eval_idx = select_indices(args.dataset, args.eval_split, args.answer_types, limit=args.eval_size,
                              dataset_options=options)
    pool = EnvPool(run_env_kwargs(args, args.split), size=args.batch_size)
    eval_pool = EnvPool(run_env_kwargs(args, args.eval_split), size=min(32, len(eval_idx)))

    # ---- policy ---------------------------------------------------------------------------
    model, encoder, kind, _ = build_policy(args.policy, system_prompt_of(args), args.train_layers, args.lora_rank,
                                           args.seed, need_reference=False, device=args.device, dtype=args.dtype)
    optimizer = make_optimizer(model, args.lr)
    settings = trained_settings(encoder, pool, int(train_idx[0]), args.max_new_tokens)  # the prompt actually shown, env, encoder
    record = record_settings(out, record, settings)
    saved = {**record, "base_model": record["resolved"]["base_model"], "kind": kind, **settings}
    state: dict = {}
    if ckpt is not None:
        state = load_checkpoint(ckpt, model, optimizer)
        print(f"resumed from {ckpt} at step {start_step}")
    script = ScriptedGenerator(encoder, gold_script(dataset, pool.tool_names, args.tool_share, args.seed,
                                                     args.misread_share))
    logger = MetricsLogger(out, tensorboard=args.tensorboard, report_to=args.report_to, hparams=record,
                           project=args.wandb_project, purge_step=start_step + 1 if start_step else 0)
    trainable, total = count_trainable(model)
    print(f"SFT {args.policy} ({kind}): {trainable:,} of {total:,} parameters train")
    answers_path = out / "heldout_answers.jsonl"  # every held-out answer, so a constant answer cannot pass for learning
    purge_rows(answers_path, start_step + 1 if start_step else 0)  # a resume writes those evaluations again
    if start_step == 0:
        first = evaluate_heldout(model, encoder, eval_pool, eval_idx, args.max_new_tokens, answers_path=answers_path, step=0)
        print(eval_line(0, first), flush=True)
        logger.log(0, first)

    # ---- loop -----------------------------------------------------------------------------
    try:
        metrics = _loop(args, out, model, encoder, optimizer, script, pool, eval_pool, train_idx, eval_idx, logger,
                        saved, state, start_step, answers_path)
    except KeyboardInterrupt:
        logger.close(finished=False)
        write_curves(out, "train.sft")
        print(interrupted_message("python -m train.sft", out, logger.last_step), file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    if args.save_final:
        save_policy(model, encoder, out / "final", {**saved, "step": args.steps})
    logger.close()
    pool.close()
    eval_pool.close()
    write_curves(out, "train.sft")
    print(run_summary("train.sft", args, out, kind, len(eval_idx)), flush=True)
    return metrics


def _loop(args, out, model, encoder, optimizer, script, pool, eval_pool, train_idx, eval_idx, logger, saved, state,
          start_step, answers_path) -> dict[str, float]:
    """The SFT steps: gold trajectories -> cross-entropy -> log/evaluate/checkpoint; the last step's metrics."""
    t_start = time.perf_counter() - float(state.get("wall_s", 0.0))
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(train_idx)  # the same order on resume: step k trains the same batch
    metrics: dict[str, float] = {}
    for step in range(start_step, args.steps):
        chosen = [order[(step * args.batch_size + k) % len(order)] for k in range(args.batch_size)]
        batch = collect_rollouts(script, pool, encoder, [(args.seed, {"index": int(i)}) for i in chosen])
        seqs = [from_trajectory(t, p) for t, p in zip(batch.trajectories, batch.prompts)]
        total_loss = 0.0
        for sl in micro_batches(len(seqs), args.micro_batch):
            mb = pad_batch(seqs[sl], encoder.pad_token_id)
            loss = sft_loss(response_logprobs(model, mb, encoder), mb.response_mask) * (len(mb) / len(seqs))
            loss.backward()
            total_loss += float(loss.detach())
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done = step + 1
        metrics = {"losses/sft": total_loss, "rollout/reward_mean": float(batch.rewards.mean()),
                   "time/wall_s": time.perf_counter() - t_start}
        if done == args.steps or (args.eval_every and done % args.eval_every == 0):
            metrics.update(evaluate_heldout(model, encoder, eval_pool, eval_idx, args.max_new_tokens,
                                            answers_path=answers_path, step=done))
            print(eval_line(done, metrics), flush=True)
        if done == args.steps:
            metrics.update(evaluate_ablations(model, encoder, args, eval_idx, answers_path, done))
        metrics["time/cpu_s"] = time.process_time()
        logger.log(done, metrics)
        print(f"sft step {done}/{args.steps} loss {total_loss:.3f} ({metrics['time/wall_s']:.0f}s)", flush=True)
        if (args.save_every and done % args.save_every == 0) or done == args.steps:
            save_checkpoint(out, done, model, optimizer, {"wall_s": time.perf_counter() - t_start}, keep=args.keep,
                            encoder=encoder, run_info={**saved, "step": done})
    return metrics


def cli(argv: list[str] | None = None) -> int:
    """``python -m train.sft ...``: parse, run, exit code (``prog: error:`` for user errors)."""
    prog = "python -m train.sft"
    args = parse_args(Args, argv, prog=prog)
    return run_cli(prog, lambda: main(args))


if __name__ == "__main__":
    sys.exit(cli())
