"""GRPO-family training of a tool-using policy on MedVQA-Gym (seed 000 §3.2), CleanRL style.

    python -m train.grpo --policy runs/sft/final --algo grpo --steps 30 --out runs/grpo

Reads top to bottom: config -> env factory -> policy -> loop (rollout -> advantages -> update ->
log/eval/checkpoint). ``--algo`` picks GRPO, Dr.GRPO, DAPO, GSPO or GRASP from
:mod:`train.algorithms`; ``--engine verl`` hands the same arguments to the verl + Ray launcher.
A killed run resumes from its last checkpoint with ``--resume true`` (the default).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from train.algorithms import (AdvantageInput, LossInput, compute_advantages, dynamic_sampling_keep,
                              get_algorithm, grasp_sft_weight, group_stats, overlong_penalty, policy_loss)
from train.batching import from_trajectory, gold_answer_sequence, micro_batches, pad_batch, response_logprobs
from train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from train.common import (SHORT_SYSTEM_PROMPT, build_policy, count_trainable, env_kwargs, evaluate_heldout,
                          parse_args, save_policy, select_indices)
from train.env_pool import make_pool
from train.metrics_log import MetricsLogger, rollout_metrics
from train.rollout import HFGenerator, collect_rollouts, group_requests


# ==============================================================================================
# Config
# ==============================================================================================
@dataclass
class Args:
    """GRPO-family RL with tools on MedVQA-Gym."""

    out: str = "runs/grpo"
    """output folder: metrics.jsonl, tb/, checkpoints/, final/"""
    seed: int = 0
    """seed for prompt sampling, generation and initialisation"""
    engine: str = "native"
    """``native`` (this file) or ``verl`` (train.verl_integration.launch)"""
    policy: str = "smollm2"
    """``smollm2``, ``tiny-qwen2-vl``/``tiny-qwen2.5-vl``/``tiny-qwen3-vl`` or a checkpoint folder"""
    system_prompt: str | None = SHORT_SYSTEM_PROMPT
    """replaces the env's long system prompt (cheaper on CPU); ``none`` keeps the env's"""
    train_layers: int = 0
    """train only the top k decoder blocks (0 = all)"""
    lora_rank: int = 0
    """LoRA rank through peft (0 = no LoRA)"""
    dataset: str = "embedded"
    """dataset name for the env"""
    split: str = "train"
    """training split"""
    eval_split: str = "test"
    """held-out split"""
    answer_types: str = "CLOSED,MCQ"
    """which questions to train and evaluate on (rule rewards for CLOSED/MCQ are instant)"""
    tools: str = "ground=oracle"
    """tools as ``name[=engine],...``; empty = no tools"""
    max_turns: int = 1
    """tool turns per episode (seed: 3)"""
    env_pool: str = "local"
    """``local`` (in-process) or ``ray`` (env copies in Ray actors)"""
    env_workers: int = 2
    """Ray actors for ``env_pool=ray``"""
    algo: str = "grpo"
    """grpo, drgrpo, dapo, gspo or grasp"""
    kl_coef: float | None = None
    """override the algorithm's KL coefficient (GRPO default 0.01)"""
    clip_low: float | None = None
    """override the lower clip range"""
    clip_high: float | None = None
    """override the upper clip range"""
    prompts_per_step: int = 4
    """questions per step (batch size)"""
    group_size: int = 4
    """rollouts per question (n); seed: 8"""
    max_new_tokens: int = 40
    """tokens per generated turn"""
    temperature: float = 1.0
    """sampling temperature (seed: 0.7)"""
    steps: int = 30
    """optimiser steps"""
    lr: float = 2e-5
    """AdamW learning rate (seed: 1e-6 for 8B full fine-tuning)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient clipping"""
    update_epochs: int = 1
    """passes over each rollout batch (1 = on-policy; the ratio is then 1 at the update)"""
    micro_batch: int = 8
    """sequences per forward/backward (memory bound)"""
    eval_every: int = 5
    """evaluate on the held-out split every k steps (0 = only at start and end)"""
    eval_size: int = 64
    """held-out questions"""
    save_every: int = 5
    """checkpoint every k steps"""
    resume: bool = True
    """resume from ``out/checkpoints/latest`` when present"""
    torch_threads: int = 1
    """torch CPU threads (1 is fastest on a shared 2-core box)"""
    tensorboard: bool = True
    """also log to TensorBoard"""
    save_final: bool = True
    """write ``out/final`` (an HF folder) at the end"""


def dispatch_verl(args: Args):
    try:
        from train.verl_integration.launch import run
    except ImportError as e:
        raise SystemExit(f"--engine verl needs train.verl_integration.launch.run ({e}); use --engine native") from e
    return run(args)


# ==============================================================================================
# One update
# ==============================================================================================
def update_policy(model, reference, encoder, optimizer, batch, advantages, keep, algo, args, correct=None):
    """One (or ``update_epochs``) gradient step(s) on the kept rollouts; returns metrics."""
    idx = [i for i, k in enumerate(keep.tolist()) if k]
    if not idx:
        return {"losses/skipped": 1.0}
    trajs = [batch.trajectories[i] for i in idx]
    prompts = [batch.prompts[i] for i in idx]
    seqs = [from_trajectory(t, p) for t, p in zip(trajs, prompts)]
    adv = advantages[idx]
    sft_seqs, sft_w = None, None
    if algo.needs_sft_branch:
        acc, _ = group_stats(correct[idx].float(), torch.tensor([t.group for t in trajs]))
        sft_w = grasp_sft_weight(acc, algo.config)
        sft_seqs = [gold_answer_sequence(t, p, encoder, f"\\boxed{{{t.ground_truth}}}") for t, p in zip(trajs, prompts)]
    metrics: dict[str, float] = {}
    total_tokens = sum(sum(s.response_mask) for s in seqs)
    for _ in range(args.update_epochs):
        old_cache: list[torch.Tensor] = []
        for sl in micro_batches(len(seqs), args.micro_batch):
            mb = pad_batch(seqs[sl], encoder.pad_token_id)
            ref = None
            with torch.no_grad():
                if args.update_epochs > 1:
                    old_cache.append(response_logprobs(model, mb, encoder))
                if algo.config.kl_coef:
                    ref = _reference_logprobs(model, reference, mb, encoder)
            logp = response_logprobs(model, mb, encoder)
            old = old_cache[-1] if args.update_epochs > 1 else logp.detach()
            extra = {}
            if sft_seqs is not None:
                pairs = [(s, w) for s, w in zip(sft_seqs[sl], sft_w[sl].tolist()) if s is not None]
                if pairs and any(w > 0 for _, w in pairs):
                    sb = pad_batch([s for s, _ in pairs], encoder.pad_token_id)
                    extra = {"sft_logp": response_logprobs(model, sb, encoder), "sft_mask": sb.response_mask,
                             "sft_weight": torch.tensor([w for _, w in pairs])}
            inp = LossInput(logp=logp, old_logp=old, advantages=adv[sl], mask=mb.response_mask, ref_logp=ref, **extra)
            loss, m = policy_loss(algo.loss, inp, algo.config)
            share = (float(mb.response_mask.sum()) / max(1, total_tokens) if algo.config.loss_agg == "token-mean"
                     else len(mb) / len(seqs))
            (loss * share).backward()
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v * share
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                                   args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        metrics["losses/grad_norm"] = float(grad_norm)
    return metrics


def _reference_logprobs(model, reference, mb, encoder):
    if reference is not None:
        return response_logprobs(reference, mb, encoder)
    if hasattr(model, "disable_adapter"):  # LoRA: the base model is the reference
        with model.disable_adapter():
            return response_logprobs(model, mb, encoder)
    return None


# ==============================================================================================
# Main loop
# ==============================================================================================
def main(args: Args) -> dict[str, float] | int:
    if args.engine == "verl":
        return dispatch_verl(args)
    if args.engine != "native":
        raise SystemExit(f"expected --engine native or verl, got {args.engine!r}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    algo = get_algorithm(args.algo, kl_coef=args.kl_coef, clip_low=args.clip_low, clip_high=args.clip_high,
                         norm_len=args.max_new_tokens * (args.max_turns + 1))

    # ---- env factory ----------------------------------------------------------------------
    train_idx = select_indices(args.dataset, args.split, args.answer_types)
    eval_idx = select_indices(args.dataset, args.eval_split, args.answer_types, limit=args.eval_size)
    n_slots = args.prompts_per_step * args.group_size
    pool = make_pool(args.env_pool, env_kwargs(args.dataset, args.split, args.tools, args.max_turns), n_slots,
                     **({"num_workers": args.env_workers} if args.env_pool == "ray" else {}))
    eval_pool = make_pool("local", env_kwargs(args.dataset, args.eval_split, args.tools, args.max_turns),
                          min(len(eval_idx), 32))

    # ---- policy ---------------------------------------------------------------------------
    model, encoder, kind, reference = build_policy(args.policy, args.system_prompt, args.train_layers,
                                                   args.lora_rank, args.seed, need_reference=bool(algo.config.kl_coef))
    trainable, total = count_trainable(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr,
                                  weight_decay=args.weight_decay)
    generator = HFGenerator(model, encoder, max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    logger = MetricsLogger(out, tensorboard=args.tensorboard)
    state = {"running_accuracy": 0.5, "config": asdict(args)}
    start_step = 0
    ckpt = latest_checkpoint(out) if args.resume else None
    if ckpt is not None:
        state = load_checkpoint(ckpt, model, optimizer)
        start_step = state["step"]
        print(f"resumed from {ckpt} at step {start_step}")
    print(f"policy {args.policy} ({kind}): {trainable:,} of {total:,} parameters train; algo {args.algo}; "
          f"{len(train_idx)} train / {len(eval_idx)} held-out questions")
    if start_step == 0:
        logger.log(0, {**evaluate_heldout(model, encoder, eval_pool, eval_idx, args.max_new_tokens), "time/wall_s": 0.0})

    # ---- loop -----------------------------------------------------------------------------
    from tqdm.auto import tqdm

    t_start = time.perf_counter() - float(state.get("wall_s", 0.0))
    bar = tqdm(range(start_step, args.steps), initial=start_step, total=args.steps, desc=args.algo)
    for step in bar:
        # -- rollout: n copies of the env per question, same seed + index -> same episode
        rng = np.random.default_rng([args.seed, step])
        chosen = rng.choice(train_idx, size=args.prompts_per_step, replace=len(train_idx) < args.prompts_per_step)
        requests, groups = group_requests([(args.seed * 100_003 + step, int(i)) for i in chosen], args.group_size)
        t0 = time.perf_counter()
        batch = collect_rollouts(generator, pool, encoder, requests, groups, micro_batch=n_slots)
        t_rollout = time.perf_counter() - t0

        # -- rewards -> advantages
        rewards = batch.rewards
        if algo.overlong_buffer:
            lengths = torch.tensor([t.generated_tokens for t in batch.trajectories])
            rewards = rewards + overlong_penalty(lengths, args.max_new_tokens * (args.max_turns + 1),
                                                 algo.overlong_buffer * (args.max_turns + 1))
        correct = torch.tensor([float(bool(t.correct)) for t in batch.trajectories])
        state["running_accuracy"] = 0.9 * state["running_accuracy"] + 0.1 * float(correct.mean())
        adv = compute_advantages(algo.advantage, AdvantageInput(rewards, batch.group_index, correct,
                                                                state["running_accuracy"]), algo.config)
        keep = dynamic_sampling_keep(rewards, batch.group_index) if algo.dynamic_sampling else torch.ones(len(adv), dtype=torch.bool)

        # -- update
        t0 = time.perf_counter()
        losses = update_policy(model, reference, encoder, optimizer, batch, adv, keep, algo, args, correct)
        t_update = time.perf_counter() - t0

        # -- log / evaluate / checkpoint
        done = step + 1
        metrics = {**rollout_metrics(batch.trajectories), **losses,
                   "rollout/advantage_abs": float(adv.abs().mean()), "rollout/kept_share": float(keep.float().mean()),
                   "time/rollout_s": t_rollout, "time/generation_s": batch.timings.get("generation_s", 0.0),
                   "time/env_wait_s": batch.timings.get("env_wait_s", 0.0), "time/update_s": t_update,
                   "time/tokens_per_s": batch.timings.get("generated_tokens", 0) / max(1e-9, batch.timings.get("generation_s", 0.0)),
                   "time/wall_s": time.perf_counter() - t_start, "grasp/running_accuracy": state["running_accuracy"]}
        if (args.eval_every and done % args.eval_every == 0) or done == args.steps:
            t0 = time.perf_counter()
            metrics.update(evaluate_heldout(model, encoder, eval_pool, eval_idx, args.max_new_tokens))
            metrics["time/eval_s"] = time.perf_counter() - t0
        logger.log(done, metrics)
        bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.2f}", acc=f"{metrics['rollout/accuracy']:.2f}")
        if done % args.save_every == 0 or done == args.steps:
            state["wall_s"] = time.perf_counter() - t_start
            save_checkpoint(out, done, model, optimizer, state)

    if args.save_final:
        save_policy(model, encoder, out / "final")
    logger.close()
    pool.close()
    eval_pool.close()
    return metrics if args.steps > start_step else {}


def verl_argv(argv: list[str]) -> list[str] | None:
    """``argv`` without ``--engine verl`` when it asks for verl (``None`` otherwise), so the verl
    launcher gets its own flags (``--dry-run``, ``key=value`` overrides) untouched.

    >>> verl_argv(["--engine", "verl", "--dry-run", "data.train_batch_size=16"])
    ['--dry-run', 'data.train_batch_size=16']
    >>> verl_argv(["--steps", "3"]) is None
    True
    """
    for i, arg in enumerate(argv):
        if arg == "--engine=verl":
            return argv[:i] + argv[i + 1:]
        if arg == "--engine" and argv[i + 1:i + 2] == ["verl"]:
            return argv[:i] + argv[i + 2:]
    return None


if __name__ == "__main__":
    forwarded = verl_argv(sys.argv[1:])
    if forwarded is not None:
        from train.verl_integration.launch import run

        raise SystemExit(run(forwarded))
    result = main(parse_args(Args))
    if isinstance(result, int):  # the verl launcher returns an exit code
        raise SystemExit(result)
