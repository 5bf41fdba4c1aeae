"""The native objective equals verl 0.9.1's on the same tensors: GRPO/Dr.GRPO advantages (groups of
one included), the vanilla PPO loss with its dual clip, GSPO, the k3 KL and the loss aggregations.
The two cases the native trainer once got wrong are also checked by hand, without verl."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from train.algorithms import (AdvantageInput, AlgoConfig, LossInput, aggregate, compute_advantages, get_algorithm,
                              k3_kl, policy_loss)


# ---- by hand (always run) -------------------------------------------------------------------
def test_dual_clip_caps_a_negative_advantage_loss_at_clip_ratio_c():
    one = torch.ones(1, 1)
    logp = (2 * one).requires_grad_()                                   # ratio e^2 against old log-prob 0
    loss, metrics = policy_loss("grpo", LossInput(logp, 0 * one, -one[0], one), AlgoConfig(kl_coef=0.0))
    assert float(loss) == pytest.approx(3.0)                             # not e^2 = 7.39
    assert metrics["losses/clip_frac_lower"] == 1.0
    loss.backward()
    assert float(logp.grad) == 0.0                                       # a capped token pushes nothing
    positive, _ = policy_loss("grpo", LossInput(2 * one, 0 * one, one[0], one), AlgoConfig(kl_coef=0.0))
    assert float(positive) == pytest.approx(-1.2)                        # A > 0: the usual clip only
    with pytest.raises(ValueError, match="clip_ratio_c > 1"):
        policy_loss("grpo", LossInput(2 * one, 0 * one, -one[0], one), AlgoConfig(kl_coef=0.0, clip_ratio_c=1.0))


def test_a_group_of_one_gets_verls_advantage():
    rewards, groups = torch.tensor([1.0, -1.0, 1.0, 0.5]), torch.tensor([0, 0, 1, 2])
    adv = compute_advantages("grpo", AdvantageInput(rewards, groups), AlgoConfig())
    assert adv[2:].tolist() == pytest.approx([1.0 / (1 + 1e-6), 0.5 / (1 + 1e-6)], abs=1e-7)  # mean 0, std 1
    assert adv[:2].tolist() == pytest.approx([1 / (math.sqrt(2) + 1e-6), -1 / (math.sqrt(2) + 1e-6)])
    dr = compute_advantages("drgrpo", AdvantageInput(rewards, groups), AlgoConfig())
    assert dr.tolist() == pytest.approx([1.0, -1.0, 1.0, 0.5])


# ---- against verl ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def verl():
    core = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config.actor import FSDPActorConfig

    def actor(cfg: AlgoConfig):
        return FSDPActorConfig(clip_ratio=cfg.clip_low, clip_ratio_low=cfg.clip_low, clip_ratio_high=cfg.clip_high,
                               clip_ratio_c=cfg.clip_ratio_c, loss_agg_mode=cfg.loss_agg, rollout_n=1,
                               ppo_micro_batch_size_per_gpu=1, use_dynamic_bsz=False,
                               global_batch_info={"loss_scale_factor": cfg.norm_len})
    return core, actor


def _tensors(seed: int = 0, batch: int = 6, width: int = 7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=g) * 3
    logp = old + torch.randn(batch, width, generator=g) * 1.2           # ratios from ~e^-3 to ~e^3
    logp[0, 0], old[0, 0] = 2.0, 0.0                                     # the case: ratio e^2 ...
    adv = torch.tensor([-1.0, 0.7, -0.3, 1.5, -2.0, 0.0])                # ... with A < 0
    mask = (torch.rand(batch, width, generator=g) > 0.25).float()
    mask[0, 0] = 1.0
    mask[5] = 0.0                                                        # a sequence with no trained token
    return logp, old, adv, mask


@pytest.mark.parametrize("groups", [[0, 0, 1, 1, 1, 2, 3, 3], [0, 1, 2, 3, 4, 5, 6, 7], [5, 5, 5, 5, 5, 5, 5, 9]])
@pytest.mark.parametrize("algo", ["grpo", "drgrpo"])
def test_advantages_equal_verls(verl, groups, algo):
    core, _ = verl
    rewards = torch.tensor([1.0, -1.0, 0.3, 0.9, -0.2, 2.0, 1.0, 1.0])
    mask = torch.ones(8, 3)
    token_rewards = torch.zeros(8, 3)
    token_rewards[:, -1] = rewards
    cfg = get_algorithm(algo).config
    theirs, _ = core.compute_grpo_outcome_advantage(token_rewards, mask, np.array(groups), epsilon=cfg.eps,
                                                    norm_adv_by_std_in_grpo=cfg.std_normalize)
    ours = compute_advantages(get_algorithm(algo).advantage, AdvantageInput(rewards, torch.tensor(groups)), cfg)
    assert ours.tolist() == pytest.approx(theirs[:, 0].tolist(), abs=1e-6)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("preset", ["grpo", "dapo"])
def test_vanilla_policy_loss_and_gradient_equal_verls(verl, loss_agg, preset):
    core, actor = verl
    cfg = get_algorithm(preset, kl_coef=0.0, loss_agg=loss_agg, norm_len=7).config
    logp, old, adv, mask = _tensors()
    ours_logp, theirs_logp = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    ours, metrics = policy_loss("grpo", LossInput(ours_logp, old, adv, mask), cfg)
    theirs, verl_metrics = core.compute_policy_loss_vanilla(old, theirs_logp, adv[:, None].expand_as(mask), mask,
                                                            loss_agg, actor(cfg))
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours_logp.grad, theirs_logp.grad, atol=1e-7)
    assert metrics["losses/clip_frac"] == pytest.approx(verl_metrics["actor/pg_clipfrac"])
    assert metrics["losses/clip_frac_lower"] == pytest.approx(verl_metrics["actor/pg_clipfrac_lower"])
    assert verl_metrics["actor/pg_clipfrac_lower"] > 0                     # the dual clip acted


def test_gspo_loss_and_gradient_equal_verls(verl):
    core, actor = verl
    cfg = get_algorithm("gspo", kl_coef=0.0).config
    logp, old, adv, mask = _tensors(seed=1)
    logp[1] = old[1] + 11.0                                              # a sequence ratio past verl's cap
    ours_logp, theirs_logp = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    ours, _ = policy_loss("gspo", LossInput(ours_logp, old, adv, mask), cfg)
    theirs, _ = core.compute_policy_loss_gspo(old, theirs_logp, adv[:, None].expand_as(mask), mask,
                                              cfg.loss_agg, actor(cfg))
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours_logp.grad, theirs_logp.grad, atol=1e-7)


def test_k3_kl_and_aggregation_equal_verls(verl):
    core, _ = verl
    logp, ref, _, mask = _tensors(seed=2)
    ref = ref.clone()
    ref[0, :3] = torch.tensor([-40.0, 30.0, 15.0])                       # clamps at both ends, and the cap
    assert torch.allclose(k3_kl(logp, ref), core.kl_penalty(logp, ref, "low_var_kl"), atol=1e-6)
    losses = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3))
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        ours = aggregate(losses, mask, AlgoConfig(loss_agg=mode, norm_len=7))
        theirs = core.agg_loss(losses, mask, mode, loss_scale_factor=7)
        assert float(ours) == pytest.approx(float(theirs), rel=1e-6), mode
