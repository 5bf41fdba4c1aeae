"""The native trainer's objective on a tiny real model: behaviour log-probs taken once per rollout
batch (so ratios and clipping act across update epochs), log-probs at the sampling temperature,
and the presets (GSPO, DAPO's clip-higher, GRASP) changing the update they claim to change."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from agents.models import Encoded, load_policy
from train import grpo
from train.algorithms import get_algorithm
from train.batching import Sequence_, pad_batch, response_logprobs
from train.rollout import RolloutBatch, Trajectory

ANSWERS = ["I think so. \\boxed{yes}", "No lesion seen \\boxed{no}", "maybe \\boxed{yes}", "hmm hmm \\boxed{no}"]


@pytest.fixture(scope="module")
def tiny():
    model, enc, _ = load_policy("tiny-qwen2-vl", seed=0)
    return model, enc


def _batch(enc) -> RolloutBatch:
    """Two groups of two text-only rollouts with hand-written answers (answer turns only)."""
    tok = enc.tokenizer
    prompt = tok("Question: Is there a lesion in the liver?", add_special_tokens=False)["input_ids"]
    trajs, prompts = [], []
    for i, text in enumerate(ANSWERS):
        ids = tok(text, add_special_tokens=False)["input_ids"] + [enc.eos_token_id]
        trajs.append(Trajectory(slot=i, group=i // 2, prompt_ids=list(prompt), response_ids=ids,
                                response_mask=[1] * len(ids), turn_texts=[text], turn_starts=[0],
                                end_reason="answer", ground_truth="yes", correct=i % 2 == 0))
        prompts.append(Encoded(list(prompt)))
    return RolloutBatch(trajs, prompts, {})


def _update(tiny, algo_name, epochs=2, lr=0.05, temperature=0.7, **algo_overrides):
    """One call of the trainer's update on a fresh copy of the tiny model; (metrics, model)."""
    model, enc = copy.deepcopy(tiny[0]), tiny[1]
    algo = get_algorithm(algo_name, kl_coef=0.0, **algo_overrides)
    args = grpo.Args(update_epochs=epochs, temperature=temperature, micro_batch=2, max_grad_norm=1e9)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    batch = _batch(enc)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    correct = torch.tensor([float(t.correct) for t in batch.trajectories])
    keep = torch.ones(len(advantages), dtype=torch.bool)
    metrics = grpo.update_policy(model, None, enc, optimizer, batch, advantages, keep, algo, args, correct)
    return metrics, model


def _distance(a, b) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def test_logprobs_are_taken_at_the_sampling_temperature(tiny):
    model, enc = tiny
    tok = enc.tokenizer
    seq = Sequence_(tok("Is there a lesion?", add_special_tokens=False)["input_ids"],
                    tok("\\boxed{yes}", add_special_tokens=False)["input_ids"], [1] * 5)
    seq.response_mask = [1] * len(seq.response_ids)
    tb = pad_batch([seq], enc.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=tb.input_ids, attention_mask=tb.attention_mask).logits.float()
        r = tb.response_ids.shape[1]
        step_logits = logits[:, -r - 1:-1]
        expected = torch.log_softmax(step_logits / 0.5, -1).gather(-1, tb.response_ids.unsqueeze(-1)).squeeze(-1)
        got = response_logprobs(model, tb, enc, temperature=0.5)
        at_one = response_logprobs(model, tb, enc)
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got, at_one, atol=1e-3)
    with pytest.raises(ValueError, match="temperature"):
        response_logprobs(model, tb, enc, temperature=0.0)


@pytest.mark.parametrize("algo", ["grpo", "dapo", "gspo", "grasp"])
def test_second_epoch_sees_the_ratio_move_and_clipping_act(tiny, algo):
    one, _ = _update(tiny, algo, epochs=1)
    two, _ = _update(tiny, algo, epochs=2)
    # averaged over the two epochs: the second one moved away from the behaviour policy and clipped
    assert one["losses/clip_frac"] == 0.0 < two["losses/clip_frac"]
    assert one["losses/ratio_dev"] < 1e-4 < 1e-3 < two["losses/ratio_dev"]  # first epoch: on-policy
    assert two["losses/approx_kl"] != 0.0


def test_gspo_changes_the_update_against_grpo(tiny):
    wide = {"clip_low": 10.0, "clip_high": 10.0, "loss_agg": "seq-mean-token-mean"}  # isolate the ratio
    _, grpo_model = _update(tiny, "grpo", **wide)
    _, gspo_model = _update(tiny, "gspo", **wide)
    # identical first epoch (ratio 1), so any difference comes from the second epoch's ratios:
    # per token (GRPO) vs one length-normalised ratio per sequence (GSPO)
    _, grpo_one = _update(tiny, "grpo", epochs=1, **wide)
    _, gspo_one = _update(tiny, "gspo", epochs=1, **wide)
    assert _distance(grpo_one, gspo_one) < 1e-6
    assert _distance(grpo_model, gspo_model) > 1e-4


def test_dapo_clip_higher_changes_the_update(tiny):
    common = {"loss_agg": "token-mean"}
    m_sym, sym = _update(tiny, "grpo", epochs=3, lr=0.02, clip_high=0.2, **common)
    m_high, high = _update(tiny, "grpo", epochs=3, lr=0.02, clip_high=0.28, **common)
    assert m_high["losses/clip_frac"] < m_sym["losses/clip_frac"]
    assert _distance(sym, high) > 1e-5


def test_grasp_gspo_branch_clips_at_its_tight_range(tiny):
    tight, tight_model = _update(tiny, "grasp", epochs=2)
    wide, wide_model = _update(tiny, "grasp", epochs=2, clip_low=10.0, clip_high=10.0)
    assert tight["losses/clip_frac"] > wide["losses/clip_frac"] == 0.0
    assert "losses/sft" in tight
    assert _distance(tight_model, wide_model) > 1e-5


def test_loss_aggregation_default_is_verls():
    assert get_algorithm("grpo").config.loss_agg == "token-mean"
    assert get_algorithm("dapo").config.loss_agg == "token-mean"
    assert get_algorithm("drgrpo").config.loss_agg == "seq-mean-token-sum-norm"
    assert get_algorithm("gspo").config.loss_agg == "seq-mean-token-mean"
    assert get_algorithm("grasp").config.loss_agg == "seq-mean-token-mean"
    assert get_algorithm("grpo", loss_agg="seq-mean-token-mean").config.loss_agg == "seq-mean-token-mean"
    from medvqa_env.errors import ConfigError

    with pytest.raises(ConfigError, match="Unknown loss aggregation 'token_mean'.*Did you mean 'token-mean'"):
        get_algorithm("grpo", loss_agg="token_mean")


def test_loss_aggregation_default_matches_the_installed_verl():
    actor = pytest.importorskip("verl.workers.config.actor")  # verl is an optional extra
    fields = {f.name: f for f in dataclasses.fields(actor.ActorConfig)}
    assert fields["loss_agg_mode"].default == get_algorithm("grpo").config.loss_agg


# ---- the update trains the distribution the rollouts were sampled from ----------------------
def _expected_gradient(model, batch, advantages, temperature):
    """The token-mean policy gradient at ratio 1, from each unpadded sequence's own logits divided
    by ``temperature``: ``d/dθ mean_t(-A_i * exp(logp_T - sg(logp_T)))``."""
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    total = sum(sum(t.response_mask) for t in batch.trajectories)
    for traj, a in zip(batch.trajectories, advantages.tolist()):
        ids = torch.tensor([traj.prompt_ids + traj.response_ids])
        logits = model(input_ids=ids).logits[0].float()
        r = len(traj.response_ids)
        step_logits = logits[-r - 1:-1] / temperature
        logp = torch.log_softmax(step_logits, -1).gather(-1, torch.tensor(traj.response_ids)[:, None]).squeeze(-1)
        mask = torch.tensor(traj.response_mask, dtype=torch.float32)
        (-a * torch.exp(logp - logp.detach()) * mask).sum().div(total).backward()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in model.parameters() if p.requires_grad])


def _update_gradient(tiny, temperature, lr=1.0):
    """The gradient one on-policy ``update_policy`` step applied (plain SGD: ``Δθ = -lr * g``)."""
    before = copy.deepcopy(tiny[0])
    _, after = _update(tiny, "grpo", epochs=1, lr=lr, temperature=temperature, loss_agg="token-mean")
    grads = [(p0 - p1).detach().flatten() / lr for p0, p1 in zip(before.parameters(), after.parameters())
             if p0.requires_grad]
    return torch.cat(grads)


def _relative_error(got, expected) -> float:
    return float((got - expected).norm() / expected.norm())


def test_the_update_uses_the_sampling_temperature(tiny):
    batch, advantages = _batch(tiny[1]), torch.tensor([1.0, -1.0, 1.0, -1.0])
    at_t = _expected_gradient(tiny[0], batch, advantages, 0.7)
    at_one = _expected_gradient(tiny[0], batch, advantages, 1.0)
    assert _relative_error(at_one, at_t) > 0.05                  # the two objectives really differ
    got = _update_gradient(tiny, temperature=0.7)
    assert _relative_error(got, at_t) < 1e-3


def test_an_update_forced_to_temperature_one_is_caught(tiny, monkeypatch):
    """The check above is sharp: an update that drops the temperature (the bug it guards against)
    fails it."""
    real = grpo.response_logprobs
    monkeypatch.setattr(grpo, "response_logprobs", lambda model, mb, enc, temperature=1.0, *a, **k:
                        real(model, mb, enc, 1.0, *a, **k))
    batch, advantages = _batch(tiny[1]), torch.tensor([1.0, -1.0, 1.0, -1.0])
    got = _update_gradient(tiny, temperature=0.7)
    assert _relative_error(got, _expected_gradient(tiny[0], batch, advantages, 0.7)) > 0.05
    assert _relative_error(got, _expected_gradient(tiny[0], batch, advantages, 1.0)) < 1e-3


def test_rft_is_one_sft_step_on_the_correct_rollouts_only(tiny):
    """Issue 46's rejection-sampling baseline: ``--algo rft`` keeps the correct rollouts (by
    ``correct``, not the shaped reward) and its update is a token-mean cross-entropy step on their
    sampled tokens at the sampling temperature; the wrong ones do not move the model at all."""
    model0, enc = tiny
    algo = get_algorithm("rft", kl_coef=0.0)
    args = grpo.Args(update_epochs=1, temperature=0.7, micro_batch=4, max_grad_norm=1e9)
    batch = _batch(enc)
    correct = torch.tensor([float(t.correct) for t in batch.trajectories])  # rollouts 0 and 2
    rewards = torch.tensor([0.8, 1.0, 1.0, -1.0])  # a shaped reward that would keep rollout 1 too
    from train.algorithms import AdvantageInput, compute_advantages
    adv = compute_advantages(algo.advantage, AdvantageInput(rewards, batch.group_index, correct), algo.config)
    assert adv.tolist() == [1.0, 0.0, 1.0, 0.0]

    rft = copy.deepcopy(model0)
    opt = torch.optim.SGD(rft.parameters(), lr=0.05)
    grpo.update_policy(rft, None, enc, opt, batch, adv, adv > 0, algo, args, correct)

    sft = copy.deepcopy(model0)
    opt = torch.optim.SGD(sft.parameters(), lr=0.05)
    from train.batching import from_trajectory
    kept = [from_trajectory(batch.trajectories[i], batch.prompts[i]) for i in (0, 2)]
    tb = pad_batch(kept, enc.pad_token_id)
    logp = response_logprobs(sft, tb, enc, temperature=0.7)
    m = tb.response_mask.float()
    (-(logp * m).sum() / m.sum()).backward()
    opt.step()
    assert _distance(rft, model0) > 1e-4
    assert _distance(rft, sft) < 1e-6

    # the rejected rollouts' tokens do not matter
    other = _batch(enc)
    tok = enc.tokenizer
    for i in (1, 3):
        ids = tok("something else entirely \\boxed{no}", add_special_tokens=False)["input_ids"] + [enc.eos_token_id]
        other.trajectories[i] = dataclasses.replace(other.trajectories[i], response_ids=ids, response_mask=[1] * len(ids))
    again = copy.deepcopy(model0)
    opt = torch.optim.SGD(again.parameters(), lr=0.05)
    grpo.update_policy(again, None, enc, opt, other, adv, adv > 0, algo, args, correct)
    assert _distance(again, rft) < 1e-6
