"""Multi-turn rollouts: masks, observations as context, tool images for VLMs, GRASP sequences,
and log-probs of padded batches."""

from __future__ import annotations

import pytest
import torch

from agents.models import ChatEncoder, load_policy, tiny_bpe_tokenizer
from train.batching import from_trajectory, gold_answer_sequence, pad_batch, response_logprobs
from medvqa_env.pool import EnvPool
from train.algorithms import dynamic_sampling_keep
from train.rollout import (HFGenerator, RolloutBatch, ScriptedGenerator, Trajectory, collect_rollouts, fill_groups,
                           group_requests)

ZOOM = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 64, 64]}}</tool_call>'


def _script(conv):
    return ZOOM if conv.turns == 0 else "Looks clear. \\boxed{no}"


@pytest.fixture(scope="module")
def vlm():
    model, enc, _ = load_policy("tiny-qwen2-vl", seed=0)
    return model, enc


@pytest.fixture(scope="module")
def pool():
    p = EnvPool({"dataset": "embedded", "split": "test", "tools": ["image_zoom_in"], "max_turns": 1}, size=4)
    yield p
    p.close()


def test_group_requests_repeat_each_question():
    req, groups = group_requests([(1, 4), (1, 9)], n=3)
    assert groups == [0, 0, 0, 1, 1, 1] and req[3] == (1, {"index": 9})
    with pytest.raises(ValueError, match="group size"):
        group_requests([(1, 4)], n=0)


def test_model_tokens_are_trained_and_observations_are_context(pool):
    enc = ChatEncoder(tiny_bpe_tokenizer(), system_prompt="Short.")
    req, groups = group_requests([(0, 1), (0, 5)], n=2)
    batch = collect_rollouts(ScriptedGenerator(enc, _script), pool, enc, req, groups)
    t = batch.trajectories[0]
    assert t.end_reason == "answer" and t.tool_calls == ["image_zoom_in"] and len(t.turn_texts) == 2
    trained = enc.tokenizer.decode([i for i, m in zip(t.response_ids, t.response_mask) if m])
    context = enc.tokenizer.decode([i for i, m in zip(t.response_ids, t.response_mask) if not m])
    assert trained == ZOOM + "<|im_end|>" + "Looks clear. \\boxed{no}<|im_end|>"
    assert "<observation>" in context and "[image_zoom_in]" in context and "<|im_start|>assistant" in context
    assert t.turn_starts[1] > t.turn_starts[0] == 0
    rewards = [x.reward for x in batch.trajectories]
    assert rewards[0] == rewards[1] and rewards[2] == rewards[3]  # a group replays one episode
    assert batch.group_index.tolist() == groups


def test_vlm_rollout_feeds_tool_crops_back(vlm, pool):
    model, enc = vlm
    batch = collect_rollouts(ScriptedGenerator(enc, _script), pool, enc, [(0, {"index": 2})])
    t = batch.trajectories[0]
    assert len(t.pixel_values) == 1 and t.image_grid_thw[0].shape == (1, 3)  # the crop, after the prompt image
    seq = from_trajectory(t, batch.prompts[0])
    pads = (seq.prompt_ids + seq.response_ids).count(enc.image_pad_id())
    assert pads == sum(int(g.prod()) // 4 for g in torch.cat(seq.image_grid_thw))
    sampled = collect_rollouts(HFGenerator(model, enc, max_new_tokens=4), pool, enc, [(0, {"index": 2})] * 2)
    assert all(x.done for x in sampled.trajectories) and sampled.timings["generated_tokens"] > 0


def test_padded_logprobs_match_unpadded_forward(vlm, pool):
    model, enc = vlm
    batch = collect_rollouts(ScriptedGenerator(enc, _script), pool, enc, [(0, {"index": 2}), (0, {"index": 3})])
    seqs = [from_trajectory(t, p) for t, p in zip(batch.trajectories, batch.prompts)]
    seqs[1].response_ids, seqs[1].response_mask = seqs[1].response_ids[:5], seqs[1].response_mask[:5]
    seqs[1].pixel_values, seqs[1].image_grid_thw = seqs[1].pixel_values[:1], seqs[1].image_grid_thw[:1]  # no crop yet
    tb = pad_batch(seqs, enc.pad_token_id)
    assert tb.response_mask[1, 5:].sum() == 0 and tb.attention_mask[1, -1] == 0
    with torch.no_grad():
        both = response_logprobs(model, tb, enc)
        one = response_logprobs(model, pad_batch(seqs[1:], enc.pad_token_id), enc)
    assert torch.allclose(both[1, :5], one[0, :5], atol=1e-4)


def test_grasp_sequence_puts_gold_answer_after_own_reasoning(pool):
    enc = ChatEncoder(tiny_bpe_tokenizer())
    batch = collect_rollouts(ScriptedGenerator(enc, _script), pool, enc, [(0, {"index": 1})])
    t = batch.trajectories[0]
    seq = gold_answer_sequence(t, batch.prompts[0], enc, "\\boxed{yes}")
    trained = enc.tokenizer.decode([i for i, m in zip(seq.response_ids, seq.response_mask) if m])
    context = enc.tokenizer.decode([i for i, m in zip(seq.response_ids, seq.response_mask) if not m])
    assert trained == "\\boxed{yes}<|im_end|>"
    assert context.endswith("<|im_start|>assistant\nLooks clear. ") and "boxed{no}" not in context


def _round_of(rewards_per_group):
    """A generation round whose group g has the rewards ``rewards_per_group[g]``."""
    trajs = [Trajectory(slot=len(rewards_per_group[0]) * g + k, group=g, prompt_ids=[g], reward=float(r))
             for g, rs in enumerate(rewards_per_group) for k, r in enumerate(rs)]
    return RolloutBatch(trajs, [None] * len(trajs), {"generation_s": 1.0})


def _spread(batch):
    return dynamic_sampling_keep(batch.rewards, batch.group_index)


def test_dynamic_sampling_refills_to_the_requested_group_count():
    rounds = [[[1, 1], [1, -1], [-1, -1]], [[-1, -1], [-1, -1], [1, 1]], [[1, -1], [-1, 1], [1, -1]]]
    calls = []
    out = fill_groups(lambda r: calls.append(r) or _round_of(rounds[r]), want_groups=3, keep=_spread, max_rounds=5)
    assert calls == [0, 1, 2] and out.rounds == 3
    assert [t.group for t in out.batch.trajectories] == [0, 0, 1, 1, 2, 2]  # renumbered, extras of round 2 dropped
    assert all(float(torch.tensor([t.reward for t in out.batch.trajectories[i:i + 2]]).std()) > 0 for i in (0, 2, 4))
    assert len(out.sampled) == 18 and out.batch.timings["generation_s"] == 3.0


def test_dynamic_sampling_is_bounded_and_says_so():
    out = fill_groups(lambda r: _round_of([[1, 1], [-1, -1]]), want_groups=2, keep=_spread, max_rounds=4)
    assert out.rounds == 4 and out.batch.trajectories == [] and len(out.sampled) == 16
    everything = fill_groups(lambda r: _round_of([[1, 1], [-1, -1]]), want_groups=2)  # no filter: one round
    assert everything.rounds == 1 and len(everything.batch.trajectories) == 4
    with pytest.raises(ValueError, match="max_rounds"):
        fill_groups(lambda r: _round_of([[1, 1]]), want_groups=1, max_rounds=0)


def test_a_group_prompt_is_prefilled_once_and_generation_is_unchanged():
    """Copies of one context (a GRPO group) share one prefill; the sampled tokens do not change."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    enc = ChatEncoder(tiny_bpe_tokenizer(), system_prompt="Short.")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(enc.tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2))
    a = enc.tokenizer("Is there a lesion in the liver?")["input_ids"]
    b = enc.tokenizer("Which organ?")["input_ids"]
    contexts = [SimpleNamespace(ids=x, pixel_values=None, image_grid_thw=None) for x in (a, a, b, a)]
    prefill_rows = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: prefill_rows.append(kw["input_ids"].shape),
                                           with_kwargs=True)
    shared = HFGenerator(model, enc, max_new_tokens=6, greedy=True).generate(contexts)
    first_forward = prefill_rows[0]
    hook.remove()
    plain = HFGenerator(model, enc, max_new_tokens=6, greedy=True, share_prompts=False).generate(contexts)
    assert first_forward == (2, len(a) - 1)  # two distinct contexts, all but the last token
    assert shared == plain and shared[0] == shared[1] == shared[3]
    sampled = []
    for share in (True, False):  # sampling draws the same random numbers either way
        torch.manual_seed(1)
        sampled.append(HFGenerator(model, enc, max_new_tokens=6, temperature=0.7, share_prompts=share).generate(contexts))
    assert sampled[0] == sampled[1]
