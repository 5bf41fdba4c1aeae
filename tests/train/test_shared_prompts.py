"""A GRPO group's rollouts share their prompt: computing it once gives the same log-probs and the
same gradients as one full forward per row (tiny random Llama, the SmolLM2 architecture)."""

from __future__ import annotations

import types

import pytest
import torch

from train.batching import Sequence_, pad_batch, prompt_groups, response_logprobs


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).train()


def _batch():
    a, b = [5, 6, 7, 8, 9], [11, 12]
    seqs = [Sequence_(a, [20, 21, 22], [1, 1, 1]), Sequence_(a, [23], [1]), Sequence_(b, [24, 25, 26, 27], [1, 0, 1, 1]),
            Sequence_(a, [28, 29], [1, 1]), Sequence_(b, [30], [1])]
    return pad_batch(seqs, pad_id=0)


def test_groups_are_found_by_prompt():
    first, inverse = prompt_groups(_batch())
    inv = inverse.tolist()
    assert inv[0] == inv[1] == inv[3] != inv[2] == inv[4] and len(first) == 2
    assert prompt_groups(pad_batch([Sequence_([1], [2], [1]), Sequence_([3], [4], [1])], 0)) is None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompts_give_the_same_logprobs_and_gradients(tiny_llama, temperature):
    batch = _batch()
    enc = types.SimpleNamespace(image_pad_id=lambda: None)
    out = {}
    for share in (False, True):
        tiny_llama.zero_grad()
        logp = response_logprobs(tiny_llama, batch, enc, temperature, share_prompts=share)
        (logp * batch.response_mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in tiny_llama.parameters() if p.grad is not None])
        out[share] = (logp.detach() * batch.response_mask, grads)
    assert torch.allclose(out[True][0], out[False][0], atol=1e-5)
    assert torch.allclose(out[True][1], out[False][1], atol=1e-5, rtol=1e-4)


def _full_logits_logprobs(model, batch, temperature):
    """The definition: every response position's logits, ``log_softmax``, the target's entry."""
    pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos).logits
    rw = batch.response_ids.shape[1]
    logits = logits[:, -(rw + 1):-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("share", [False, True])
def test_logits_only_at_trained_tokens_match_the_full_logits_and_their_gradients(tiny_llama, share):
    """Context tokens inside the response (mask 0: a tool's observation) get no logits; the trained
    tokens' log-probs and the gradients equal those from every position's logits."""
    batch = _batch()
    enc = types.SimpleNamespace(image_pad_id=lambda: None)
    got, want = {}, {}
    for name, fn in (("got", lambda: response_logprobs(tiny_llama, batch, enc, 0.7, share_prompts=share)),
                     ("want", lambda: _full_logits_logprobs(tiny_llama, batch, 0.7))):
        tiny_llama.zero_grad()
        logp = fn()
        (logp * batch.response_mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in tiny_llama.parameters() if p.grad is not None])
        (got if name == "got" else want).update(logp=logp.detach(), grads=grads)
    trained = batch.response_mask > 0
    assert (~trained).any()  # the batch has a context token inside a response (row 2) and padding
    assert torch.allclose(got["logp"][trained], want["logp"][trained], atol=1e-5)
    assert torch.all(got["logp"][~trained] == 0)
    assert torch.allclose(got["grads"], want["grads"], atol=1e-5, rtol=1e-4)


def test_a_model_that_transforms_its_logits_keeps_the_full_logits(tiny_llama, monkeypatch):
    """A soft-capped (Gemma 2) or scaled head is more than ``lm_head``: its logits are used as they are."""
    from train.batching import output_head

    assert output_head(tiny_llama) is tiny_llama.lm_head
    monkeypatch.setattr(tiny_llama.config, "final_logit_softcapping", 30.0, raising=False)
    assert output_head(tiny_llama) is None
    batch = _batch()
    enc = types.SimpleNamespace(image_pad_id=lambda: None)
    with torch.no_grad():
        got = response_logprobs(tiny_llama, batch, enc, 1.0, share_prompts=False)
        want = _full_logits_logprobs(tiny_llama, batch, 1.0)
    assert torch.allclose(got, want, atol=1e-5)  # every position, as the model computes its logits
