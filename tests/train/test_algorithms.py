"""Advantage estimators and policy losses on hand-built tensors."""

from __future__ import annotations

import math

import pytest
import torch

from medvqa_env.errors import ConfigError
from train.algorithms import (ADVANTAGES, LOSSES, AdvantageInput, AlgoConfig, LossInput, aggregate,
                              compute_advantages, dynamic_sampling_keep, get_algorithm, grasp_sft_weight, k3_kl,
                              overlong_penalty, policy_loss)

R = torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0])
G = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def test_grpo_advantage_is_group_normalised():
    adv = compute_advantages("grpo", AdvantageInput(R, G), AlgoConfig())
    # group 0: mean -0.5, std (unbiased) 1.0 -> (1.5, -0.5, -0.5, -0.5); group 1 has no variance -> 0
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0]), atol=1e-4)


def test_drgrpo_advantage_is_not_std_normalised():
    adv = compute_advantages("drgrpo", AdvantageInput(R * 3, G), AlgoConfig())
    assert torch.allclose(adv[:4], torch.tensor([4.5, -1.5, -1.5, -1.5]))


def test_egc_corrects_extreme_groups_from_running_accuracy():
    rewards = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    correct = (rewards > 0).float()
    adv = compute_advantages("grasp_egc", AdvantageInput(rewards, groups, correct, running_accuracy=0.8),
                             AlgoConfig(egc_scale=1.0))
    assert adv[:2].tolist() == pytest.approx([0.2, 0.2])  # all correct: + (1 - 0.8)
    assert adv[2:4].tolist() == pytest.approx([-0.8, -0.8])  # all wrong: - 0.8
    assert adv[4] > 0 > adv[5]  # mixed group: the usual normalised advantage
    with pytest.raises(ValueError, match="correct"):
        compute_advantages("grasp_egc", AdvantageInput(rewards, groups), AlgoConfig())


def test_egc_adds_its_correction_to_batch_normalised_advantages():
    # group 0 all correct with a reward spread (e.g. GRASP's EM + synonym terms), group 1 all wrong,
    # group 2 mixed with nearly identical rewards
    rewards = torch.tensor([2.6, 2.2, 0.3, 0.1, 2.05, 2.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    correct = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    adv = compute_advantages("grasp_egc", AdvantageInput(rewards, groups, correct, running_accuracy=0.8),
                             AlgoConfig(egc_scale=1.0))
    batch_std = float(rewards.std())
    centred = torch.tensor([0.2, -0.2, 0.1, -0.1, 0.025, -0.025])
    expected = centred / batch_std + torch.tensor([0.2, 0.2, -0.8, -0.8, 0.0, 0.0])
    assert adv.tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    assert adv[0] > adv[1]  # the correction keeps the group's own ordering (it is added, not substituted)
    # per-batch std: a group of nearly equal rewards is not stretched to unit variance (GRPO would give +-0.71)
    assert abs(float(adv[4])) < 0.05
    assert compute_advantages("grpo", AdvantageInput(rewards, groups), AlgoConfig())[4] == pytest.approx(0.7071, abs=1e-3)


def test_unknown_names_suggest_the_right_one():
    with pytest.raises(ConfigError, match="Did you mean 'grpo'"):
        compute_advantages("grop", AdvantageInput(R, G), AlgoConfig())
    with pytest.raises(ConfigError, match="Unknown policy loss 'gpso'.*Did you mean 'gspo'"):
        policy_loss("gpso", None, AlgoConfig())
    with pytest.raises(ConfigError, match="Unknown algorithm"):
        get_algorithm("ppo2")
    assert {"grpo", "drgrpo", "grasp_egc"} <= set(ADVANTAGES) and {"grpo", "gspo", "grasp"} <= set(LOSSES)


def _inp(logp, old, adv, mask, ref=None, **kw):
    return LossInput(logp=logp, old_logp=old, advantages=adv, mask=mask, ref_logp=ref, **kw)


def test_grpo_loss_clips_the_ratio():
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)  # ratios e^.5, e^-.5
    mask = torch.tensor([[1, 0, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, -1.0])
    loss, metrics = policy_loss("grpo", _inp(logp, old, adv, mask), AlgoConfig(kl_coef=0.0))
    # positive advantage: ratio clipped at 1.2 -> -1.2; negative advantage: clipped at 0.8 -> +0.8
    assert float(loss) == pytest.approx((-1.2 + 0.8) / 2)
    assert metrics["losses/clip_frac"] == 1.0
    loss.backward()
    assert torch.count_nonzero(logp.grad) == 0  # both tokens are clipped: no gradient


def test_grpo_loss_gradient_sign_and_kl():
    old = torch.zeros(1, 2)
    logp = torch.zeros(1, 2, requires_grad=True)
    mask = torch.ones(1, 2)
    loss, _ = policy_loss("grpo", _inp(logp, old, torch.tensor([1.0]), mask), AlgoConfig(kl_coef=0.0))
    loss.backward()
    assert (logp.grad < 0).all()  # descending raises the log-prob of a positive-advantage sequence
    ref = torch.full((1, 2), -1.0)
    lk, m = policy_loss("grpo", _inp(torch.zeros(1, 2), old, torch.tensor([0.0]), mask, ref), AlgoConfig(kl_coef=0.5))
    expected_kl = math.exp(-1) + 1 - 1
    assert m["losses/kl"] == pytest.approx(expected_kl, rel=1e-5)
    assert float(lk) == pytest.approx(0.5 * expected_kl, rel=1e-5)


def test_k3_is_nonnegative_and_zero_at_equality():
    a = torch.randn(50)
    assert (k3_kl(a, a + torch.randn(50)) >= 0).all()
    assert torch.allclose(k3_kl(a, a), torch.zeros(50))


def test_loss_aggregations_differ_as_documented():
    tl = torch.tensor([[1.0, 1.0, 1.0, 1.0], [2.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert float(aggregate(tl, mask, AlgoConfig(loss_agg="token-mean"))) == pytest.approx(6 / 5)
    assert float(aggregate(tl, mask, AlgoConfig(loss_agg="seq-mean-token-mean"))) == pytest.approx(1.5)
    assert float(aggregate(tl, mask, AlgoConfig(loss_agg="seq-mean-token-sum-norm", norm_len=4))) == pytest.approx(0.75)
    with pytest.raises(ConfigError, match="loss aggregation"):
        aggregate(tl, mask, AlgoConfig(loss_agg="mean"))


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    old = torch.zeros(1, 4)
    # token log-ratios average to 0 over the 2 real tokens -> sequence ratio 1 -> never clipped
    logp = torch.tensor([[0.3, -0.3, 5.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0]])
    loss, metrics = policy_loss("gspo", _inp(logp, old, torch.tensor([1.0]), mask), AlgoConfig(kl_coef=0.0))
    assert metrics["losses/clip_frac"] == 0.0
    assert float(loss) == pytest.approx(-1.0)
    loss.backward()
    assert logp.grad[0, :2].tolist() == pytest.approx([-0.5, -0.5])  # equal per-token gradient
    assert logp.grad[0, 2:].tolist() == [0.0, 0.0]
    # a sequence ratio outside [1-3e-4, 1+4e-4] is clipped for a positive advantage
    _, m2 = policy_loss("gspo", _inp(torch.full((1, 2), 0.01), torch.zeros(1, 2), torch.tensor([1.0]),
                                     torch.ones(1, 2)), get_algorithm("gspo").config)
    assert m2["losses/clip_frac"] == 1.0


def test_dapo_pieces():
    algo = get_algorithm("dapo")
    assert algo.config.clip_high > algo.config.clip_low and algo.dynamic_sampling
    keep = dynamic_sampling_keep(R, G)
    assert keep.tolist() == [True] * 4 + [False] * 4
    assert overlong_penalty(torch.tensor([4, 8, 12]), max_len=12, buffer=8).tolist() == [0.0, -0.5, -1.0]
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), max_len=4, buffer=0)


def test_grasp_adds_weighted_sft_on_the_gold_answer():
    weight = grasp_sft_weight(torch.tensor([0.0, 1.0]), AlgoConfig(sft_max_weight=0.5))
    assert weight.tolist() == [0.5, 0.0]
    sft_logp = torch.log(torch.tensor([[0.25, 0.25], [0.5, 0.5]])).requires_grad_()
    inp = _inp(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 2),
               sft_logp=sft_logp, sft_mask=torch.ones(2, 2), sft_weight=weight)
    loss, metrics = policy_loss("grasp", inp, AlgoConfig(kl_coef=0.0, sft_coef=1.0))
    assert metrics["losses/sft"] == pytest.approx(0.5 * math.log(4) / 2)
    assert float(loss) == pytest.approx(metrics["losses/sft"])
    loss.backward()
    assert sft_logp.grad[1].abs().sum() == 0  # an all-correct group gets no answer supervision
    assert (sft_logp.grad[0] < 0).all()


def test_algorithm_overrides_and_validation():
    algo = get_algorithm("grpo", kl_coef=0.0, clip_low=None)
    assert algo.config.kl_coef == 0.0 and algo.config.clip_low == 0.2
    assert get_algorithm("grpo").config.kl_coef == 0.01  # the seed's coefficient
    with pytest.raises(ConfigError, match="AlgoConfig fields"):
        get_algorithm("grpo", kl=0.1)
