"""GRPO-family training of a tool-using policy on MedVQA-Gym (seed 000 §3.2), CleanRL style.

    python -m train.grpo --policy Qwen/Qwen2.5-VL-3B-Instruct --device cuda --dtype bfloat16 \
        --tools "image_zoom_in,segment=http://127.0.0.1:7660" --reward armed \
        --dataset vqa_rad --dataset-opt root=/data/vqa_rad --steps 200 --out runs/grpo

Reads top to bottom: config -> env factory -> policy -> loop (rollout -> advantages -> update ->
log/eval/checkpoint). ``--algo`` picks GRPO, Dr.GRPO, DAPO, GSPO, GRASP or the RFT baseline from
:mod:`train.algorithms`; ``--engine verl`` hands the same arguments to the verl + Ray launcher.
Every ``--save-every`` steps ``out/checkpoints/step_N`` is an HF folder ``eval.run`` loads. A
killed run resumes from its last checkpoint (``--resume``, the default); a rerun with other
settings refuses and lists them (``--allow-changed`` accepts them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from train.algorithms import (AdvantageInput, LossInput, compute_advantages, dynamic_sampling_keep,
                              get_algorithm, grasp_sft_weight, group_stats, overlong_penalty, policy_loss)
from train.batching import from_trajectory, gold_answer_sequence, micro_batches, pad_batch, response_logprobs
from medvqa_env.cli import NONE_IS_A_VALUE, run_cli
from medvqa_env.errors import ConfigError
from train.checkpoint import (checkpoint_step, latest_checkpoint, load_checkpoint, record_settings, save_checkpoint,
                              trained_settings)
from train.common import (build_policy, check_resume, count_trainable, evaluate_ablations, evaluate_heldout,
                          make_optimizer, parse_args, run_env_kwargs, run_summary, save_policy, select_indices,
                          system_prompt_of, write_run_record)
from medvqa_env.pool import EnvPool
from train.metrics_log import MetricsLogger, purge_rows, reward_thresholds, rollout_metrics
from medvqa_env.config import parse_options
from medvqa_env.datasets import load_dataset
from train.rollout import HFGenerator, RolloutBatch, ScriptedGenerator, collect_rollouts, fill_groups, group_requests
from train.run_report import eval_line, interrupted_message, write_curves


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
    policy: str = "Qwen/Qwen2.5-VL-3B-Instruct"
    """an HF folder (e.g. a save of this trainer), a Hub id (needs a reachable hub or its cache),
    ``smollm2`` (packaged SmolLM2-135M) or ``tiny-qwen2-vl``/``tiny-qwen2.5-vl``/``tiny-qwen3-vl``"""
    device: str = "auto"
    """``auto`` (CUDA when visible), ``cpu``, ``cuda`` or ``cuda:N``"""
    dtype: str = "float32"
    """weights and compute: ``float32``, ``bfloat16`` or ``float16``"""
    system_prompt: str | None = None
    """replaces the env's system prompt (default: the env's, with its tools' schemas and answer protocol)"""
    demo_prompt: bool = False
    """the CPU demo's short prompt (tells a blind model to call ``ground``); saved with the model"""
    train_layers: int = 0
    """train only the top k decoder blocks (0 = all)"""
    lora_rank: int = 0
    """LoRA rank through peft (0 = no LoRA)"""
    dataset: str = "embedded"
    """dataset name for the env (see medvqa_env.datasets)"""
    dataset_opt: list[str] = field(default_factory=list)
    """loader option ``key=value`` (repeatable), e.g. ``root=/data/vqa_rad``"""
    split: str = "train"
    """training split"""
    eval_split: str = "test"
    """held-out split"""
    answer_types: str = "CLOSED,MCQ"
    """which questions to train and evaluate on (rule rewards for CLOSED/MCQ are instant)"""
    tools: str | None = field(default=None, metadata={NONE_IS_A_VALUE: True})
    """tools: ``a,b=engine,c=http://host:port``, JSON, a config file, ``none``; default: the env's"""
    tool_opt: list[str] = field(default_factory=list)
    """tool option ``tool.key=value`` (repeatable), e.g. ``segment.model=/models/medsam``"""
    reward: str | None = None
    """the env's reward: ``default`` (rule + ARMed for OPEN), ``armed``, ``rule``, ``medix``, ``grasp``, ``<name>+tools``"""
    reward_opt: list[str] = field(default_factory=list)
    """reward option ``key=value`` (repeatable)"""
    format_penalty: float = 0.0
    """the env's reward for a turn that neither calls a tool nor answers (e.g. -0.2), added to the episode's
    return: without it such a turn costs nothing (issue 42: a policy drifted into ``yes}`` then ``\boxed{yes}``)"""
    answer_protocol: str = "boxed"
    """``boxed`` (seed 000's \\boxed{}) or ``xml`` (MediX-R1's <answer>)"""
    max_turns: int = 3
    """tool turns per episode (seed: 3; eval.run's default, and what a checkpoint is evaluated with)"""
    env_pool: str = "thread"
    """where the env copies run: ``thread`` (this process, beside generation), ``process`` or ``ray``"""
    env_workers: int = 2
    """worker processes / Ray actors for ``env_pool=process|ray`` (a GRPO group stays on one)"""
    algo: str = field(default="grpo", metadata={"cli": {"alias": ["--algorithm"]}})
    """grpo, drgrpo, dapo, gspo, grasp, or rft (the rejection-sampling baseline: GRPO's sampling, SFT on the
    correct episodes; native only) (``--algorithm`` too, as verl's launcher spells it)"""
    kl_coef: float | None = None
    """override the algorithm's KL coefficient (GRPO default 0.01)"""
    clip_low: float | None = None
    """override the lower clip range"""
    clip_high: float | None = None
    """override the upper clip range"""
    loss_agg: str | None = None
    """override the preset's loss aggregation: token-mean (verl's default), seq-mean-token-mean, seq-mean-token-sum-norm"""
    max_gen_rounds: int = 10
    """DAPO dynamic sampling: generation rounds per step at most (verl's max_num_gen_batches)"""
    prompts_per_step: int = 4
    """questions per step (batch size)"""
    group_size: int = 4
    """rollouts per question (n); seed: 8"""
    guidance: int = 0
    """off-policy guidance (issue 46's lever, LUFFY-like): this many of each group's ``group_size`` rollouts
    are train.sft's gold demonstration instead of the policy's samples, rewarded by the env like the rest
    and trained on as if sampled (ratio 1, no importance weight); rollout metrics count the policy's own"""
    oversample: str = ""
    """issue 46's lever: ``FILE:K`` gives the train questions whose record ids FILE (a JSON list) names K
    times the others' draw weight (a step draws without replacement, so somewhat less than K times as
    often); the run record names FILE's content by hash; "" (the default) draws every question alike"""
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
    """optimiser steps per rollout batch; the behaviour log-probs are taken once, so from the second
    step on the ratio moves away from 1 and clipping acts (1 = on-policy)"""
    micro_batch: int = 8
    """sequences per forward/backward (memory bound)"""
    eval_every: int = 5
    """evaluate on the held-out split every k steps (0 = only at start and end)"""
    eval_size: int = 64
    """held-out questions"""
    eval_ablations: str = ""
    """at the last step also evaluate with the images ``blank`` and/or ``shuffle``d (comma list;
    tools see the same ablated image): keys ``eval_<mode>/...``"""
    save_every: int = 5
    """save ``out/checkpoints/step_N`` (an HF folder eval.run loads, plus optimizer/RNG state) every k steps;
    the last step is always saved (0 = only the last)"""
    keep: int = 2
    """checkpoints kept (the newest; 0 = all)"""
    resume: bool = True
    """resume from ``out/checkpoints/latest`` when present (the settings must match ``out/args.json``)"""
    allow_changed: str = ""
    """settings that may differ from the run being resumed (comma list, or ``all``)"""
    torch_threads: int = 1
    """torch CPU threads (1 is fastest on a shared 2-core box)"""
    tensorboard: bool = True
    """also log to TensorBoard (``out/tb``: scalars and the hyper-parameters with the final metrics)"""
    report_to: str = "none"
    """other trackers: ``wandb`` (needs the wandb package; WANDB_MODE=offline works offline) or ``none``"""
    wandb_project: str = "medvqa-gym"
    """W&B project for ``--report-to wandb``"""
    save_final: bool = True
    """write ``out/final`` (an HF folder, LoRA merged) at the end"""


def dispatch_verl(args: Args):
    try:
        from train.verl_integration.launch import run
    except ImportError as e:
        raise SystemExit(f"--engine verl needs train.verl_integration.launch.run ({e}); use --engine native") from e
    return run(args)


# ==============================================================================================
# One update
# ==============================================================================================
def update_policy(model, reference, encoder, optimizer, batch, advantages, keep, algo, args, correct=None, *,
                  share_prompts=True, reuse_onpolicy_logp=True, all_logits=False):
    """``args.update_epochs`` gradient steps on the kept rollouts (``keep=None``: all); returns the
    metrics averaged over the epochs.

    The behaviour policy's log-probs (and the reference's) are computed once, before the first
    epoch, at the sampling temperature, and reused by every epoch: the first epoch is on-policy
    (ratio 1), later ones see the ratio move and the clipping act. With one epoch
    (``reuse_onpolicy_logp``) the behaviour log-probs are the training forward's own, detached:
    the same numbers without a second forward. ``share_prompts``: a group's prompt runs once
    (:func:`train.batching.response_logprobs`). ``all_logits``: logits at every response position,
    not only at the trained tokens (the same loss; slower)."""
    idx = list(range(len(advantages))) if keep is None else [i for i, k in enumerate(keep.tolist()) if k]
    if not idx:
        return {"losses/skipped": 1.0}
    trajs = [batch.trajectories[i] for i in idx]
    prompts = [batch.prompts[i] for i in idx]
    seqs = [from_trajectory(t, p) for t, p in zip(trajs, prompts)]
    adv = advantages[idx]
    temperature = args.temperature
    sft_seqs, sft_w = None, None
    if algo.needs_sft_branch:
        acc, _ = group_stats(correct[idx].float(), torch.tensor([t.group for t in trajs]))
        sft_w = grasp_sft_weight(acc, algo.config)
        sft_seqs = [gold_answer_sequence(t, p, encoder, f"\\boxed{{{t.ground_truth}}}") for t, p in zip(trajs, prompts)]
    slices = micro_batches(len(seqs), args.micro_batch)
    padded = [pad_batch(seqs[sl], encoder.pad_token_id) for sl in slices]
    # ---- behaviour and reference log-probs: once per rollout batch, before any update
    reuse = reuse_onpolicy_logp and args.update_epochs == 1
    with torch.no_grad():
        old_logps = [None if reuse else response_logprobs(model, mb, encoder, temperature, share_prompts, all_logits)
                     for mb in padded]
        refs = [_reference_logprobs(model, reference, mb, encoder, temperature, share_prompts, all_logits)
                if algo.config.kl_coef else None for mb in padded]
    total_tokens = sum(sum(s.response_mask) for s in seqs)
    token_mean = algo.config.loss_agg == "token-mean"
    metrics: dict[str, float] = {}
    for epoch in range(args.update_epochs):
        for sl, mb, old, ref in zip(slices, padded, old_logps, refs):
            logp = response_logprobs(model, mb, encoder, temperature, share_prompts, all_logits)
            old = logp.detach() if old is None else old
            if epoch == 0:  # the sampled tokens' -log p at the sampling temperature: an estimate of the policy's entropy
                mask = mb.response_mask.to(old.device)
                metrics["rollout/entropy"] = metrics.get("rollout/entropy", 0.0) + float(
                    (-old * mask).sum()) / max(1, total_tokens)
            extra = {}
            if sft_seqs is not None:
                pairs = [(s, w) for s, w in zip(sft_seqs[sl], sft_w[sl].tolist()) if s is not None]
                if pairs and any(w > 0 for _, w in pairs):
                    sb = pad_batch([s for s, _ in pairs], encoder.pad_token_id)
                    sft_logp = response_logprobs(model, sb, encoder)
                    extra = {"sft_logp": sft_logp, "sft_mask": sb.response_mask.to(sft_logp.device),
                             "sft_weight": torch.tensor([w for _, w in pairs], device=sft_logp.device)}
            # log-probs live on the model's device; the batch's masks and advantages were built on CPU
            inp = LossInput(logp=logp, old_logp=old, advantages=adv[sl].to(logp.device),
                            mask=mb.response_mask.to(logp.device), ref_logp=ref, **extra)
            loss, m = policy_loss(algo.loss, inp, algo.config)
            # this micro-batch's share of the batch-level aggregate (tokens or sequences)
            share = float(mb.response_mask.sum()) / max(1, total_tokens) if token_mean else len(mb) / len(seqs)
            (loss * share).backward()
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v * share / args.update_epochs
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                                   args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        metrics["losses/grad_norm"] = metrics.get("losses/grad_norm", 0.0) + float(grad_norm) / args.update_epochs
    return metrics


def sample_groups(generator, guide, pool, encoder, items, group_size: int, guidance: int, n_slots: int) -> RolloutBatch:
    """One group per ``(seed, index)`` item: ``group_size - guidance`` episodes the policy samples and
    ``guidance`` the ``guide`` (the gold script) plays, on the same episode, marked ``off_policy``."""
    requests, groups = group_requests(items, group_size - guidance)
    batch = collect_rollouts(generator, pool, encoder, requests, groups, micro_batch=n_slots)
    if not guidance:
        return batch
    requests, groups = group_requests(items, guidance)
    demos = collect_rollouts(guide, pool, encoder, requests, groups, micro_batch=n_slots)
    timings = {k: batch.timings.get(k, 0.0) + demos.timings.get(k, 0.0) for k in {*batch.timings, *demos.timings}}
    return RolloutBatch(batch.trajectories + [dataclasses.replace(t, off_policy=True) for t in demos.trajectories],
                        batch.prompts + demos.prompts, timings)


def sample_questions(train_idx, n: int, seed: int, step: int, round_: int = 0,
                     weights: np.ndarray | None = None) -> list[tuple[int, int]]:
    """``n`` ``(env seed, dataset index)`` pairs for generation round ``round_`` of ``step``
    (round 0 draws what the trainer always drew; later rounds are DAPO's refills); ``weights``
    (:func:`question_weights`), when given, are the questions' probabilities."""
    rng = np.random.default_rng([seed, step] + ([round_] if round_ else []))
    if weights is None:  # the draw every run before --oversample made, unchanged
        chosen = rng.choice(train_idx, size=n, replace=len(train_idx) < n)
    else:
        chosen = rng.choice(train_idx, size=n, replace=len(train_idx) < n, p=weights)
    return [(seed * 100_003 + step + 1_000_003 * round_, int(i)) for i in chosen]


def question_weights(spec: str, records: Sequence, train_idx: Sequence[int]) -> np.ndarray | None:
    """``--oversample FILE:K``'s draw probabilities over ``train_idx`` (``records[i].id`` named in FILE:
    weight K, the rest 1); ``None`` for ""."""
    if not spec:
        return None
    path, sep, factor = str(spec).rpartition(":")
    try:
        k = float(factor)
    except ValueError:
        k = float("nan")
    if not sep or not path or not (k >= 1 and np.isfinite(k)):
        raise ConfigError(f"expected --oversample FILE:K with K a number >= 1, got {spec!r}")
    try:
        ids = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--oversample: cannot read a JSON list of record ids from {path}: {e}") from None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ConfigError(f"--oversample: expected {path} to hold a JSON list of record ids (strings)")
    named = set(ids)
    weights = np.array([k if records[i].id in named else 1.0 for i in train_idx])
    if not (weights > 1).any() and k > 1:
        raise ConfigError(f"--oversample: none of the {len(named)} record ids in {path} is a question of this run's "
                          "train split")
    return weights / weights.sum()


def shaped_rewards(batch, algo, args) -> torch.Tensor:
    """The rewards advantages are computed from: the env's, plus DAPO's soft overlong penalty."""
    rewards = batch.rewards
    if algo.overlong_buffer and len(rewards):
        lengths = torch.tensor([t.generated_tokens for t in batch.trajectories])
        rewards = rewards + overlong_penalty(lengths, args.max_new_tokens * (args.max_turns + 1),
                                             algo.overlong_buffer * (args.max_turns + 1))
    return rewards


def _reference_logprobs(model, reference, mb, encoder, temperature=1.0, share_prompts=True, all_logits=False):
    if reference is not None:
        return response_logprobs(reference, mb, encoder, temperature, share_prompts, all_logits)
    if hasattr(model, "disable_adapter"):  # LoRA: the base model is the reference
        with model.disable_adapter():
            return response_logprobs(model, mb, encoder, temperature, share_prompts, all_logits)
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
                         loss_agg=args.loss_agg, norm_len=args.max_new_tokens * (args.max_turns + 1))

    # ---- the run record: a resume with other settings refuses and lists them ----------------
    ckpt = latest_checkpoint(out)
    if ckpt is not None and not args.resume:
        raise ConfigError(f"{out} already holds checkpoints (up to {ckpt.name}); pass --resume to continue "
                          "that run, or choose another --out")
    check_resume(out, args, ckpt)
    record = write_run_record(out, args, resumed_at=int(ckpt.name.rsplit("_", 1)[1]) if ckpt else None)
    if ckpt is not None and int(ckpt.name.rsplit("_", 1)[1]) >= args.steps and (out / "final").exists():
        print(f"{out} already finished {args.steps} steps; nothing to do")
        write_curves(out, f"train.grpo {args.algo}")
        print(run_summary("train.grpo", args, out, None, len(select_indices(
            args.dataset, args.eval_split, args.answer_types, limit=args.eval_size,
            dataset_options=record["args"]["dataset_opt"]))))
        return {}

    # ---- env factory: the env's prompt, tools, reward and dataset, as every other consumer ----
    dataset_options = record["args"]["dataset_opt"]
    train_idx = select_indices(args.dataset, args.split, args.answer_types, dataset_options=dataset_options)
    eval_idx = select_indices(args.dataset, args.eval_split, args.answer_types, limit=args.eval_size,
                              dataset_options=dataset_options)
    weights = (question_weights(args.oversample, load_dataset(args.dataset, split=args.split,
                                                              **parse_options(dataset_options, "--dataset-opt")),
                                train_idx) if args.oversample else None)
    n_slots = args.prompts_per_step * args.group_size
    # one pool = one reward object for the run (its ARMed thresholds move once per step) and a
    # toolbox per worker; the held-out pool's reward stays frozen, so evaluations are comparable
    pool = EnvPool(run_env_kwargs(args, args.split), n_slots,
                   backend=args.env_pool, workers=1 if args.env_pool == "thread" else args.env_workers,
                   group_size=args.group_size)
    eval_pool = EnvPool(run_env_kwargs(args, args.eval_split), min(len(eval_idx), 32))

    # ---- policy: device, dtype, the prompt it is trained (and saved) with ----------------------
    model, encoder, kind, reference = build_policy(args.policy, system_prompt_of(args), args.train_layers,
                                                   args.lora_rank, args.seed, need_reference=bool(algo.config.kl_coef),
                                                   device=args.device, dtype=args.dtype)
    trainable, total = count_trainable(model)
    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    generator = HFGenerator(model, encoder, max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    guide = guide_generator(args, encoder, pool) if args.guidance else None
    start_step = checkpoint_step(ckpt) if ckpt is not None else 0
    settings = trained_settings(encoder, pool, int(train_idx[0]), args.max_new_tokens)  # the prompt actually shown, env, encoder
    record = record_settings(out, record, settings)
    logger = MetricsLogger(out, tensorboard=args.tensorboard, report_to=args.report_to, hparams=record,
                           project=args.wandb_project, purge_step=start_step + 1 if start_step else 0)
    saved = {**record, "base_model": record["resolved"]["base_model"], "kind": kind, **settings}
    state = {"running_accuracy": 0.5}
    if ckpt is not None:
        state = load_checkpoint(ckpt, model, optimizer)
        start_step = state["step"]
        if state.get("reward_state"):  # the ARMed thresholds and buffers, as the killed run left them
            pool.load_state_dict(state["reward_state"])
        print(f"resumed from {ckpt} at step {start_step}")
    print(f"policy {args.policy} ({kind}, {next(model.parameters()).device}, {next(model.parameters()).dtype}): "
          f"{trainable:,} of {total:,} parameters train; algo {args.algo}; "
          f"{len(train_idx)} train / {len(eval_idx)} held-out questions")
    answers_path = out / "heldout_answers.jsonl"  # every held-out answer, so a constant answer cannot pass for learning
    purge_rows(answers_path, start_step + 1 if start_step else 0)  # a resume writes those evaluations again
    if start_step == 0:
        first = evaluate_heldout(model, encoder, eval_pool, eval_idx, args.max_new_tokens, answers_path=answers_path, step=0)
        print(eval_line(0, first), flush=True)
        logger.log(0, {**first, "time/wall_s": 0.0})

    # ---- loop -----------------------------------------------------------------------------
    from tqdm.auto import tqdm

    bar = tqdm(range(start_step, args.steps), initial=start_step, total=args.steps, desc=args.algo)
    metrics: dict[str, float] = {}
    try:
        metrics = _loop(bar, args, out, algo, model, reference, encoder, optimizer, generator, guide, pool, eval_pool,
                        train_idx, eval_idx, n_slots, state, logger, saved, answers_path, weights)
    except KeyboardInterrupt:
        logger.close(finished=False)
        write_curves(out, f"train.grpo {args.algo}")
        raise SystemExit(_interrupted("python -m train.grpo", out, logger.last_step)) from None
    if args.save_final and (args.steps > start_step or not (out / "final").exists()):
        save_policy(model, encoder, out / "final", {**saved, "step": max(start_step, args.steps)})
    logger.close()
    pool.close()
    eval_pool.close()
    write_curves(out, f"train.grpo {args.algo}")
    print(run_summary("train.grpo", args, out, kind, len(eval_idx)), flush=True)
    return metrics if args.steps > start_step else {}


def guide_generator(args: Args, encoder, pool) -> ScriptedGenerator:
    """``--guidance``'s demonstrator: train.sft's gold script (every trajectory calling its tool) on the train split."""
    from train.sft import gold_script

    if not 0 < args.guidance < args.group_size:
        raise ConfigError(f"expected 0 <= --guidance < --group_size ({args.group_size}), got {args.guidance!r}")
    dataset = load_dataset(args.dataset, split=args.split, **parse_options(args.dataset_opt, "--dataset-opt"))
    return ScriptedGenerator(encoder, gold_script(dataset, pool.tool_names, 1.0, args.seed))


def _interrupted(prog: str, out: Path, step: int) -> int:
    print(interrupted_message(prog, out, step), file=sys.stderr, flush=True)
    return 130


def _loop(bar, args, out, algo, model, reference, encoder, optimizer, generator, guide, pool, eval_pool, train_idx,
          eval_idx, n_slots, state, logger, saved, answers_path, weights=None) -> dict[str, float]:
    """The training steps: rollout -> advantages -> update -> log/evaluate/checkpoint; the last step's metrics."""
    t_start = time.perf_counter() - float(state.get("wall_s", 0.0))
    metrics: dict[str, float] = {}
    for step in bar:
        # -- rollout: n copies of the env per question, same seed + index -> same episode; DAPO
        #    samples more questions until prompts_per_step groups have a reward spread
        t0 = time.perf_counter()

        def sample_round(r: int, step: int = step):
            items = sample_questions(train_idx, args.prompts_per_step, args.seed, step, r, weights)
            return sample_groups(generator, guide, pool, encoder, items, args.group_size, args.guidance, n_slots)

        has_spread = (lambda b: dynamic_sampling_keep(shaped_rewards(b, algo, args), b.group_index))
        filled = fill_groups(sample_round, args.prompts_per_step, keep=has_spread if algo.dynamic_sampling else None,
                             max_rounds=args.max_gen_rounds if algo.dynamic_sampling else 1)
        batch = filled.batch
        t_rollout = time.perf_counter() - t0

        # -- rewards -> advantages (GRASP compares each group with the accuracy of earlier batches)
        rewards = shaped_rewards(batch, algo, args)
        correct = torch.tensor([float(bool(t.correct)) for t in batch.trajectories])
        adv = compute_advantages(algo.advantage, AdvantageInput(rewards, batch.group_index, correct,
                                                                state["running_accuracy"]), algo.config)
        own = [t for t in filled.sampled if not t.off_policy]  # the policy's samples, not the demonstrations
        sampled_acc = sum(bool(t.correct) for t in own) / max(1, len(own))
        state["running_accuracy"] = 0.9 * state["running_accuracy"] + 0.1 * sampled_acc

        # -- update
        t0 = time.perf_counter()
        keep = (adv > 0) if algo.keep_rewarded else None  # RFT: the correct episodes only
        losses = (update_policy(model, reference, encoder, optimizer, batch, adv, keep, algo, args, correct)
                  if batch.trajectories else {"losses/skipped": 1.0})
        t_update = time.perf_counter() - t0

        # -- end of the batch: the run's reward state (ARMed thresholds) moves once, here
        thresholds = reward_thresholds(pool.state_dict())  # what scored this step's episodes
        pool.end_batch(batch_id=step)

        # -- log / evaluate / checkpoint
        done = step + 1
        metrics = {**rollout_metrics(own), **losses,
                   "rollout/advantage_abs": float(adv.abs().mean()) if len(adv) else 0.0,
                   "rollout/kept_share": len(batch.trajectories) / max(1, len(filled.sampled)),
                   **({"rollout/guidance_accuracy": float(np.mean([bool(t.correct) for t in filled.sampled if t.off_policy]))}
                      if args.guidance else {}),
                   "rollout/gen_rounds": filled.rounds, "rollout/groups": len({t.group for t in batch.trajectories}),
                   "time/rollout_s": t_rollout, "time/generation_s": batch.timings.get("generation_s", 0.0),
                   "time/env_wait_s": batch.timings.get("env_wait_s", 0.0), "time/update_s": t_update,
                   "time/tokens_per_s": batch.timings.get("generated_tokens", 0) / max(1e-9, batch.timings.get("generation_s", 0.0)),
                   "time/wall_s": time.perf_counter() - t_start, "time/cpu_s": time.process_time(),
                   "grasp/running_accuracy": state["running_accuracy"],
                   **thresholds}
        if (args.eval_every and done % args.eval_every == 0) or done == args.steps:
            t0 = time.perf_counter()
            metrics.update(evaluate_heldout(model, encoder, eval_pool, eval_idx, args.max_new_tokens,
                                            answers_path=answers_path, step=done))
            if done == args.steps:
                metrics.update(evaluate_ablations(model, encoder, args, eval_idx, answers_path, done))
            metrics["time/eval_s"] = time.perf_counter() - t0
            bar.write(eval_line(done, metrics))
        logger.log(done, metrics)
        bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.2f}", acc=f"{metrics['rollout/accuracy']:.2f}")
        if (args.save_every and done % args.save_every == 0) or done == args.steps:
            state["wall_s"] = time.perf_counter() - t_start
            state["reward_state"] = pool.state_dict()
            save_checkpoint(out, done, model, optimizer, state, keep=args.keep, encoder=encoder,
                            run_info={**saved, "step": done})
    return metrics


def cli(argv: list[str] | None = None) -> int:
    """``python -m train.grpo ...``: parse (strictly, unless ``--engine verl``), run, exit code.

    With ``--engine verl`` the native flags that have a verl counterpart (``--group-size``,
    ``--algo``, ``--lr``, ...) are translated by the launcher; its own flags (``--dry-run``) and
    ``key=value`` overrides pass through untouched."""
    prog = "python -m train.grpo"
    argv = list(sys.argv[1:] if argv is None else argv)
    if verl_requested(argv):
        args, rest = parse_args_known(argv, prog)

        def launch() -> int:
            from train.verl_integration.launch import argv_from_native, run

            given = {a[2:].split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")}
            return run(argv_from_native(args, given) + rest)
        return run_cli(prog, launch)
    args = parse_args(Args, argv, prog=prog)
    return run_cli(prog, lambda: main(args))


def verl_requested(argv: list[str]) -> bool:
    """``--engine verl`` (or ``--engine=verl``) in ``argv``.

    >>> verl_requested(["--engine", "verl", "--dry-run"]), verl_requested(["--steps", "3"])
    (True, False)
    """
    return "--engine=verl" in argv or any(a == "--engine" and argv[i + 1:i + 2] == ["verl"]
                                          for i, a in enumerate(argv))


def parse_args_known(argv: list[str], prog: str):
    from medvqa_env.cli import parse_dataclass

    return parse_dataclass(Args, argv, prog=prog, known_only=True)


if __name__ == "__main__":
    sys.exit(cli())
