r"""GRPO-family advantage estimators and policy losses, in two decorator registries.

Every advantage estimator has one signature, ``fn(inp: AdvantageInput, cfg: AlgoConfig) -> Tensor[B]``
(one advantage per rollout, later broadcast over its tokens); every policy loss has one signature,
``fn(inp: LossInput, cfg: AlgoConfig) -> (loss, metrics)``. An *algorithm* (``grpo``, ``drgrpo``,
``dapo``, ``gspo``, ``grasp``, and the ``rft`` baseline) is a pair of the two plus its default settings.

>>> rewards = torch.tensor([1.0, -1.0, 1.0, 1.0])
>>> groups = torch.tensor([0, 0, 1, 1])
>>> compute_advantages("grpo", AdvantageInput(rewards, groups), AlgoConfig())
tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
>>> get_advantage("grop")
Traceback (most recent call last):
...
medvqa_env.errors.ConfigError: Unknown advantage 'grop'. Available: ['drgrpo', 'grasp_egc', 'grpo', 'rejection']. Did you mean 'grpo'?
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple

import torch

from medvqa_env.errors import ConfigError, unknown_name_message


# ==============================================================================================
# Config and inputs
# ==============================================================================================
@dataclass(frozen=True)
class AlgoConfig:
    """Hyper-parameters shared by the estimators and losses (each reads what it needs)."""

    clip_low: float = 0.2
    """PPO clip range below 1 (GRPO/DAPO: 0.2; GSPO uses 3e-4 on its sequence ratio)."""
    clip_high: float = 0.2
    """Clip range above 1 (DAPO's clip-higher: 0.28; GSPO: 4e-4)."""
    clip_ratio_c: float = 3.0
    """Dual-clip PPO (Ye et al. 2019; verl's ``actor.clip_ratio_c``, default 3): for a negative
    advantage the token loss is at most ``-A * clip_ratio_c``, so a token whose probability grew far
    beyond the behaviour policy's cannot dominate the batch. Must be > 1. The ``grpo`` loss only, as
    in verl (its GSPO loss has no dual clip)."""
    kl_coef: float = 0.01
    """Weight of the k3 KL estimate to the reference policy (seed 000: 0.01; 0 turns it off)."""
    std_normalize: bool = True
    """Divide group-centred rewards by the group's std (GRPO); Dr.GRPO turns it off."""
    eps: float = 1e-6
    """Added to std before dividing (verl's ``epsilon``)."""
    loss_agg: str = "token-mean"
    """How token losses become one number (:data:`LOSS_AGGREGATIONS`): ``token-mean`` (every
    trained token of the batch weighs the same; verl 0.9.1's default ``loss_agg_mode`` and DAPO's
    token-level loss), ``seq-mean-token-mean`` (each sequence's token mean, then the mean over
    sequences: the GRPO and GSPO papers' formula), ``seq-mean-token-sum-norm`` (Dr.GRPO: token sums
    over a constant ``norm_len``, then the mean over sequences)."""
    norm_len: int = 64
    """Dr.GRPO's constant divisor (the generation budget in tokens)."""
    egc_scale: float = 1.0
    """GRASP: size (kappa) of the extreme-group correction."""
    sft_max_weight: float = 0.5
    """GRASP: SFT weight for an all-wrong group (lambda_max)."""
    sft_gamma: float = 1.0
    """GRASP: the SFT weight is ``sft_max_weight * (1 - group_accuracy) ** sft_gamma``."""
    sft_coef: float = 1.0
    """GRASP: scale of the SFT branch relative to the RL branch."""


class AdvantageInput(NamedTuple):
    """``rewards[B]``, ``group_index[B]`` (rollouts of one prompt share an index), and for GRASP
    ``correct[B]`` (0/1) and the running training accuracy in [0, 1]."""

    rewards: torch.Tensor
    group_index: torch.Tensor
    correct: torch.Tensor | None = None
    running_accuracy: float = 0.5


class LossInput(NamedTuple):
    """Per-token tensors ``[B, T]`` over the response: log-probs under the current, rollout
    (``old``) and reference policies, and ``mask`` (1 = a token the model wrote, 0 = prompt, tool
    observation or padding); ``advantages[B]``. GRASP adds ``sft_logp``/``sft_mask`` ``[B, T']``
    over the gold answer placed after each rollout's reasoning and ``sft_weight[B]``."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logp: torch.Tensor | None = None
    sft_logp: torch.Tensor | None = None
    sft_mask: torch.Tensor | None = None
    sft_weight: torch.Tensor | None = None


AdvantageFn = Callable[[AdvantageInput, AlgoConfig], torch.Tensor]
LossFn = Callable[[LossInput, AlgoConfig], "tuple[torch.Tensor, dict[str, float]]"]
ADVANTAGES: dict[str, AdvantageFn] = {}
LOSSES: dict[str, LossFn] = {}


def register_advantage(name: str):
    def deco(fn: AdvantageFn) -> AdvantageFn:
        ADVANTAGES[name] = fn
        return fn
    return deco


def register_loss(name: str):
    def deco(fn: LossFn) -> LossFn:
        LOSSES[name] = fn
        return fn
    return deco


def get_advantage(name: str) -> AdvantageFn:
    if name not in ADVANTAGES:
        raise ConfigError(unknown_name_message("advantage", name, ADVANTAGES))
    return ADVANTAGES[name]


def get_loss(name: str) -> LossFn:
    if name not in LOSSES:
        raise ConfigError(unknown_name_message("policy loss", name, LOSSES))
    return LOSSES[name]


# ==============================================================================================
# Group statistics
# ==============================================================================================
def group_stats(values: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-rollout mean and (unbiased, 0 for singletons) std of its group.

    >>> m, s = group_stats(torch.tensor([1., 3., 5.]), torch.tensor([0, 0, 1]))
    >>> m.tolist(), [round(x, 3) for x in s.tolist()]
    ([2.0, 2.0, 5.0], [1.414, 1.414, 0.0])
    """
    if values.shape != group_index.shape or values.dim() != 1:
        raise ValueError(f"expected 1-d values and group_index of one shape, got {tuple(values.shape)} "
                         f"and {tuple(group_index.shape)}")
    _, inv = torch.unique(group_index, return_inverse=True)
    n_groups = int(inv.max()) + 1 if len(inv) else 0
    values = values.float()
    count = torch.zeros(n_groups).index_add_(0, inv, torch.ones_like(values))
    total = torch.zeros(n_groups).index_add_(0, inv, values)
    mean = total / count
    sq = torch.zeros(n_groups).index_add_(0, inv, (values - mean[inv]) ** 2)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return mean[inv], std[inv]


def zero_variance_groups(rewards: torch.Tensor, group_index: torch.Tensor, tol: float = 1e-8) -> torch.Tensor:
    """Bool per rollout: its group's rewards are all equal (no learning signal for GRPO).

    >>> zero_variance_groups(torch.tensor([1., 1., 0., 1.]), torch.tensor([0, 0, 1, 1])).tolist()
    [True, True, False, False]
    """
    _, std = group_stats(rewards, group_index)
    return std <= tol


def dynamic_sampling_keep(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """DAPO's dynamic sampling: keep only rollouts of groups whose rewards differ."""
    return ~zero_variance_groups(rewards, group_index)


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to ``max_len - buffer``, then linear down to -1 at
    ``max_len``, and -1 beyond.

    >>> overlong_penalty(torch.tensor([10, 15, 20, 25]), max_len=20, buffer=10).tolist()
    [0.0, -0.5, -1.0, -1.0]
    """
    if buffer <= 0 or buffer > max_len:
        raise ValueError(f"expected 0 < buffer <= max_len, got buffer={buffer!r}, max_len={max_len!r}")
    over = (lengths.float() - (max_len - buffer)) / buffer
    return over.clamp(min=0.0, max=1.0) * -1.0 + 0.0


def grasp_sft_weight(group_accuracy: torch.Tensor, cfg: AlgoConfig) -> torch.Tensor:
    """GRASP's group-adaptive SFT weight: largest for all-wrong groups, 0 for all-correct ones.

    >>> grasp_sft_weight(torch.tensor([0.0, 0.5, 1.0]), AlgoConfig(sft_max_weight=0.5)).tolist()
    [0.5, 0.25, 0.0]
    """
    return cfg.sft_max_weight * (1.0 - group_accuracy.clamp(0, 1)) ** cfg.sft_gamma


# ==============================================================================================
# Advantage estimators
# ==============================================================================================
@register_advantage("grpo")
def grpo_advantage(inp: AdvantageInput, cfg: AlgoConfig) -> torch.Tensor:
    """``(r - mean_group) / (std_group + eps)`` with the unbiased std; no std division when
    ``cfg.std_normalize`` is off. A group of one is scored as verl 0.9.1's
    ``compute_grpo_outcome_advantage`` does (mean 0, std 1): its advantage is ``r / (1 + eps)``
    (``r`` without std division), not 0.

    >>> grpo_advantage(AdvantageInput(torch.tensor([1.0, -1.0, 1.0]), torch.tensor([0, 0, 1])), AlgoConfig())
    tensor([ 0.7071, -0.7071,  1.0000])
    """
    mean, std = group_stats(inp.rewards, inp.group_index)
    _, inv, counts = torch.unique(inp.group_index, return_inverse=True, return_counts=True)
    alone = counts[inv] == 1
    mean = torch.where(alone, torch.zeros_like(mean), mean)
    std = torch.where(alone, torch.ones_like(std), std)
    adv = inp.rewards.float() - mean
    if cfg.std_normalize:
        adv = adv / (std + cfg.eps)
    return adv


@register_advantage("drgrpo")
def drgrpo_advantage(inp: AdvantageInput, cfg: AlgoConfig) -> torch.Tensor:
    """Dr.GRPO: ``r - mean_group`` (no std normalisation, whatever ``cfg`` says)."""
    return grpo_advantage(inp, replace(cfg, std_normalize=False))


@register_advantage("grasp_egc")
def egc_advantage(inp: AdvantageInput, cfg: AlgoConfig) -> torch.Tensor:
    """GSPO-EGC (GRASP, seed 002 §3.2 and App. A): group-centred rewards divided by the std of the
    *batch's* rewards (not the group's: a group of nearly identical rewards is not stretched to unit
    variance), plus an extreme-group correction added to every member of a group whose answers are
    all correct (``+egc_scale * (1 - running_accuracy)``) or all wrong (``-egc_scale *
    running_accuracy``); mixed groups get no correction. Solving a usually-failed question is
    rewarded more, failing a usually-solved one is penalised more. Groups are classified by
    ``correct`` (exact-match accuracy), not by the reward.

    >>> r = torch.tensor([2.5, 2.3, 0.1, 0.0])            # group 0 all correct, group 1 all wrong
    >>> inp = AdvantageInput(r, torch.tensor([0, 0, 1, 1]), torch.tensor([1., 1., 0., 0.]), running_accuracy=0.25)
    >>> [round(x, 3) for x in egc_advantage(inp, AlgoConfig(egc_scale=1.0)).tolist()]
    [0.824, 0.676, -0.213, -0.287]
    """
    if inp.correct is None:
        raise ValueError("expected AdvantageInput.correct for grasp_egc, got None")
    rewards = inp.rewards.float()
    mean, _ = group_stats(rewards, inp.group_index)
    batch_std = rewards.std() if rewards.numel() > 1 else torch.zeros(())
    adv = (rewards - mean) / (batch_std + cfg.eps)
    return adv + egc_correction(inp.correct, inp.group_index, inp.running_accuracy, cfg.egc_scale)


def egc_correction(correct: torch.Tensor, group_index: torch.Tensor, running_accuracy: float,
                   scale: float = 1.0) -> torch.Tensor:
    """Per rollout: ``+scale * (1 - acc_run)`` in all-correct groups, ``-scale * acc_run`` in
    all-wrong groups, 0 in mixed ones.

    >>> c = egc_correction(torch.tensor([1., 1., 0., 0., 1., 0.]), torch.tensor([0, 0, 1, 1, 2, 2]), 0.8)
    >>> [round(x, 3) for x in c.tolist()]
    [0.2, 0.2, -0.8, -0.8, 0.0, 0.0]
    """
    acc, _ = group_stats(correct.float(), group_index)
    ra = float(min(1.0, max(0.0, running_accuracy)))
    out = torch.zeros_like(acc)
    out = torch.where(acc >= 1.0, torch.full_like(acc, scale * (1.0 - ra)), out)
    return torch.where(acc <= 0.0, torch.full_like(acc, -scale * ra), out)


@register_advantage("rejection")
def rejection_advantage(inp: AdvantageInput, cfg: AlgoConfig) -> torch.Tensor:
    """Rejection sampling (the ``rft`` baseline): 1 for a rollout whose answer is correct, 0 for the
    rest -- by ``correct`` when given (shaping and format penalties do not move it), else by a
    positive reward. No group centring: a group whose every answer is right still teaches.

    >>> inp = AdvantageInput(torch.tensor([0.8, -1.0, 1.0]), torch.tensor([0, 0, 1]), torch.tensor([1., 0., 1.]))
    >>> rejection_advantage(inp, AlgoConfig()).tolist()
    [1.0, 0.0, 1.0]
    """
    if inp.correct is not None:
        return (inp.correct > 0).float()
    return (inp.rewards > 0).float()


def compute_advantages(name: str, inp: AdvantageInput, cfg: AlgoConfig) -> torch.Tensor:
    """Look up estimator ``name`` and apply it."""
    return get_advantage(name)(inp, cfg)


# ==============================================================================================
# Policy losses
# ==============================================================================================
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate(token_loss: torch.Tensor, mask: torch.Tensor, cfg: AlgoConfig) -> torch.Tensor:
    """Reduce ``[B, T]`` token losses to a scalar by ``cfg.loss_agg`` (padding excluded), as verl's
    ``agg_loss`` does on one data-parallel rank: sequence means are over the sequences that have a
    trained token; ``seq-mean-token-sum-norm`` divides by ``norm_len`` (verl's
    ``loss_scale_factor``)."""
    mask = mask.float()
    if cfg.loss_agg == "token-mean":
        return (token_loss * mask).sum() / mask.sum().clamp(min=1)
    if cfg.loss_agg not in LOSS_AGGREGATIONS:
        raise ConfigError(unknown_name_message("loss aggregation", cfg.loss_agg, LOSS_AGGREGATIONS))
    tokens = mask.sum(-1)
    sequences = (tokens > 0).float().sum().clamp(min=1)
    per_seq = (token_loss * mask).sum(-1)
    if cfg.loss_agg == "seq-mean-token-mean":
        return (per_seq / tokens.clamp(min=1)).sum() / sequences
    return per_seq.sum() / sequences / cfg.norm_len


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's low-variance, non-negative KL(pi || ref) estimate per token:
    ``exp(ref - logp) - (ref - logp) - 1``, capped at 10 as verl's ``low_var_kl``."""
    d = (ref_logp - logp).clamp(-20, 20)
    return (torch.exp(d) - d - 1).clamp(min=-10, max=10)


def _with_kl(loss: torch.Tensor, inp: LossInput, cfg: AlgoConfig, metrics: dict[str, float]) -> torch.Tensor:
    if cfg.kl_coef and inp.ref_logp is not None:
        kl = aggregate(k3_kl(inp.logp, inp.ref_logp), inp.mask, cfg)
        metrics["losses/kl"] = float(kl.detach())
        loss = loss + cfg.kl_coef * kl
    return loss


def _ppo_clip(ratio: torch.Tensor, adv: torch.Tensor, inp: LossInput, cfg: AlgoConfig, dual_clip: bool = False):
    """Token losses ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` -- with ``dual_clip``,
    at most ``-A * clip_ratio_c`` where ``A < 0`` (verl's ``compute_policy_loss_vanilla``) -- and the
    ratio metrics: the share of trained tokens whose loss is clipped (``clip_frac``; by the dual
    clip: ``clip_frac_lower``), and the mean ``|r - 1|`` (0 on-policy)."""
    a = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    unclipped = -a * ratio
    clipped = -a * ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    token_loss = torch.maximum(unclipped, clipped)
    m = inp.mask.float()
    n = m.sum().clamp(min=1)
    metrics = {"losses/clip_frac": float(((clipped > unclipped).float() * m).sum() / n),
               "losses/ratio_dev": float(((ratio.detach() - 1).abs() * m).sum() / n),
               "losses/approx_kl": float(((inp.old_logp - inp.logp.detach()) * m).sum() / n)}
    if dual_clip:
        if not cfg.clip_ratio_c > 1.0:
            raise ValueError(f"expected clip_ratio_c > 1 for the dual clip, got {cfg.clip_ratio_c!r}")
        lower = -a * cfg.clip_ratio_c
        negative = (a < 0).expand_as(token_loss)
        metrics["losses/clip_frac_lower"] = float(((token_loss > lower) & negative).float().mul(m).sum() / n)
        token_loss = torch.where(negative, torch.minimum(token_loss, lower), token_loss)
    return token_loss, metrics


@register_loss("grpo")
def grpo_loss(inp: LossInput, cfg: AlgoConfig):
    """Token-level clipped ratio (PPO) with group advantages and the dual clip (verl's ``vanilla``
    policy loss), plus ``kl_coef`` * k3 KL.

    >>> one = torch.ones(1, 1)
    >>> float(grpo_loss(LossInput(2 * one, 0 * one, -one[0], one), AlgoConfig(kl_coef=0.0))[0])  # r = e^2, A = -1
    3.0
    """
    ratio = torch.exp((inp.logp - inp.old_logp).clamp(-20, 20))
    token_loss, metrics = _ppo_clip(ratio, inp.advantages, inp, cfg, dual_clip=True)
    pg = aggregate(token_loss, inp.mask, cfg)
    metrics["losses/policy"] = float(pg.detach())
    loss = _with_kl(pg, inp, cfg, metrics)
    metrics["losses/total"] = float(loss.detach())
    return loss, metrics


@register_loss("gspo")
def gspo_loss(inp: LossInput, cfg: AlgoConfig):
    """GSPO: one length-normalised ratio per sequence, ``s_i = exp(mean_t(logp - old_logp))``,
    clipped at sequence level; the gradient flows through every token (``sg(s_i) * exp(logp -
    sg(logp))``, as verl's ``compute_policy_loss_gspo``). Aggregated by ``cfg.loss_agg`` (the
    ``gspo`` preset: ``seq-mean-token-mean``, the paper's sequence-level objective)."""
    m = inp.mask.float()
    seq_log_ratio = ((inp.logp - inp.old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1)
    # verl's form: the value is the sequence ratio, the gradient each token's (none past the cap)
    log_ratio = inp.logp - inp.logp.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(log_ratio.clamp(max=10.0))
    token_loss, metrics = _ppo_clip(ratio, inp.advantages, inp, cfg)
    pg = aggregate(token_loss, inp.mask, cfg)
    metrics["losses/policy"] = float(pg.detach())
    loss = _with_kl(pg, inp, cfg, metrics)
    metrics["losses/total"] = float(loss.detach())
    return loss, metrics


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy on masked tokens, token-normalised per sequence, optionally weighted.

    >>> float(sft_loss(torch.log(torch.tensor([[0.5, 0.5]])), torch.tensor([[1, 1]])))
    0.6931...
    """
    m = mask.float()
    per_seq = -(logp * m).sum(-1) / m.sum(-1).clamp(min=1)
    if weight is None:
        return per_seq.mean()
    return (per_seq * weight).sum() / max(1, per_seq.numel())


@register_loss("grasp")
def grasp_loss(inp: LossInput, cfg: AlgoConfig):
    """GRASP: the GSPO loss on the rollouts (advantages from ``grasp_egc``) plus
    ``sft_coef`` * weighted cross-entropy on the gold answer after each rollout's own reasoning."""
    loss, metrics = gspo_loss(inp, cfg)
    if inp.sft_logp is not None and inp.sft_mask is not None and inp.sft_weight is not None:
        sft = sft_loss(inp.sft_logp, inp.sft_mask, inp.sft_weight)
        metrics["losses/sft"] = float(sft.detach())
        metrics["grasp/sft_weight_mean"] = float(inp.sft_weight.float().mean())
        loss = loss + cfg.sft_coef * sft
        metrics["losses/total"] = float(loss.detach())
    return loss, metrics


def policy_loss(name: str, inp: LossInput, cfg: AlgoConfig):
    """Look up loss ``name`` and apply it; returns ``(loss, metrics)``."""
    return get_loss(name)(inp, cfg)


# ==============================================================================================
# Algorithms = estimator + loss + defaults
# ==============================================================================================
@dataclass(frozen=True)
class Algorithm:
    advantage: str
    """Name in :data:`ADVANTAGES`."""
    loss: str
    """Name in :data:`LOSSES`."""
    config: AlgoConfig = field(default_factory=AlgoConfig)
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more questions until the batch holds
    the requested number of groups (bounded rounds: ``train.rollout.fill_groups``)."""
    overlong_buffer: int = 0
    """DAPO: tokens per turn of the soft overlong penalty (0 = off)."""
    needs_sft_branch: bool = False
    """GRASP: also build gold-answer sequences for the SFT branch."""
    keep_rewarded: bool = False
    """RFT: update on the rollouts with a positive advantage only (the rest are dropped, not pushed down)."""


# Loss aggregation per preset (``--loss_agg`` overrides it):
# * grpo: ``token-mean``, verl 0.9.1's default ``loss_agg_mode``, so the native and verl engines
#   optimise the same objective out of the box. DeepSeekMath's GRPO formula is
#   ``seq-mean-token-mean`` (1/G sum_i 1/|o_i| sum_t); verl (like DAPO) defaults to token-mean
#   because per-sequence means let long sequences' tokens weigh less.
# * drgrpo: ``seq-mean-token-sum-norm``: Dr.GRPO removes the 1/|o_i| length bias by dividing token
#   sums by a constant (the generation budget, ``norm_len``); verl's Dr.GRPO recipe sets this mode.
# * dapo: ``token-mean``: DAPO's "token-level policy gradient loss" (§3.3 of the DAPO paper).
# * gspo: ``seq-mean-token-mean``: GSPO's objective averages sequence-level terms over the group;
#   verl's GSPO docstring recommends this mode.
# * grasp: ``seq-mean-token-mean``: seed 002 App. A, "the main run averages policy gradients over
#   rollouts" (its RL branch is GSPO).
# * rft: online rejection-sampling fine-tuning (RAFT-style), the baseline issue 46 asks for: each
#   step samples exactly as GRPO does (same questions, group size, temperature), keeps the episodes
#   whose answer is right and takes one step of cross-entropy on their sampled tokens. It is the
#   ``grpo`` loss at ratio 1 with advantage 1 on the kept rollouts: ``-d/dtheta exp(logp - sg(logp))
#   = -d logp``, token-mean over the kept tokens, i.e. SFT on them (log-probs at the sampling
#   temperature, the trainer's one log-prob path); KL to the reference as every reward-trained run.
ALGORITHMS: dict[str, Algorithm] = {
    "grpo": Algorithm("grpo", "grpo", AlgoConfig(loss_agg="token-mean")),
    "drgrpo": Algorithm("drgrpo", "grpo", AlgoConfig(std_normalize=False, loss_agg="seq-mean-token-sum-norm")),
    "dapo": Algorithm("grpo", "grpo", AlgoConfig(clip_high=0.28, kl_coef=0.0, loss_agg="token-mean"),
                      dynamic_sampling=True, overlong_buffer=8),
    "gspo": Algorithm("grpo", "gspo", AlgoConfig(clip_low=3e-4, clip_high=4e-4, loss_agg="seq-mean-token-mean")),
    "grasp": Algorithm("grasp_egc", "grasp", AlgoConfig(clip_low=3e-4, clip_high=4e-4, loss_agg="seq-mean-token-mean"),
                       needs_sft_branch=True),
    "rft": Algorithm("rejection", "grpo", AlgoConfig(loss_agg="token-mean"), keep_rewarded=True),
}


def get_algorithm(name: str, **overrides) -> Algorithm:
    """Preset ``name`` with ``AlgoConfig`` fields in ``overrides`` replaced (``None`` = keep)."""
    if name not in ALGORITHMS:
        raise ConfigError(unknown_name_message("algorithm", name, ALGORITHMS))
    algo = ALGORITHMS[name]
    changes = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(changes) - set(AlgoConfig.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"expected AlgoConfig fields, got {sorted(unknown)}")
    if "loss_agg" in changes and changes["loss_agg"] not in LOSS_AGGREGATIONS:
        raise ConfigError(unknown_name_message("loss aggregation", changes["loss_agg"], LOSS_AGGREGATIONS))
    return replace(algo, config=replace(algo.config, **changes))
