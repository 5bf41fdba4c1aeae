"""TRL's own GRPOTrainer trains against the env through train/trl_hook.py (a real trainer step on a
tiny random causal LM), and the tool-environment adapter exposes the env's tools as TRL reads them."""

from __future__ import annotations

import pytest

pytest.importorskip("trl", reason="the 'trl' extra (pip install 'medvqa-gym[trl]') is not installed")

from train.trl_hook import EnvReward, completion_text, environment_class, prompt_dataset  # noqa: E402

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ENV = {"dataset": "embedded", "split": "train", "tools": [], "reward": "rule"}  # the docstring's, defaults included


def tiny_causal_lm():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agents.models import tiny_bpe_tokenizer

    tok = tiny_bpe_tokenizer()
    tok.chat_template = CHATML
    tok.padding_side = "left"
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id)
    return Qwen2ForCausalLM(config), tok


def test_env_reward_scores_completions_with_the_env_reward():
    data = prompt_dataset(ENV, indices=range(8), answer_types="CLOSED")
    reward = EnvReward(ENV)
    assert reward.env.max_turns == 3  # the env's default, not a test-only 0
    gold = [r.answer for r in reward.env.dataset][:8]
    rows = list(zip(data["record_index"], data["prompt"]))
    prompts, index = [p for _, p in rows], [i for i, _ in rows]
    right = [f"\\boxed{{{gold[i]}}}" for i, _ in rows]
    wrong = [[{"role": "assistant", "content": "\\boxed{maybe}"}] for _ in rows]  # conversational form
    silent = ["I would need to look more closely."] * len(rows)
    calls = ['<tool_call>{"name": "zoom", "arguments": {}}</tool_call>'] * len(rows)
    assert reward(prompts, right, record_index=index) == [1.0] * len(rows)
    assert reward(prompts, wrong, record_index=index) == [-1.0] * len(rows)
    for no_answer in (silent, calls):  # no answer scores at most a wrong answer, and the episode ends
        scores = reward(prompts, no_answer, record_index=index)
        assert all(s <= -1.0 for s in scores) and reward.env.done
        assert reward.env.turn == reward.env.max_turns + 1  # ran out of turns: the env's "max_turns" end
        assert all(not t["action"]["answers"] for t in reward.env.trace)
    assert completion_text(wrong[0]) == "\\boxed{maybe}"
    assert data[0]["prompt"][0]["role"] == "system" and "\\boxed" in data[0]["prompt"][0]["content"]


def test_trl_grpo_trainer_trains_against_the_env(tmp_path):
    import torch
    from trl import GRPOConfig, GRPOTrainer

    model, tok = tiny_causal_lm()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = prompt_dataset(ENV, indices=range(12), answer_types="CLOSED")
    calls = []

    class Counting(EnvReward):
        def __call__(self, prompts, completions, **columns):
            out = super().__call__(prompts, completions, **columns)
            calls.append(out)
            return out

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=6, max_steps=1, learning_rate=1e-2, logging_steps=1,
                      save_strategy="no", report_to=[], use_cpu=True, seed=0, temperature=1.0,
                      dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=Counting(ENV), train_dataset=data, args=args)
    trainer.train()
    # the env scored every completion of the step (each episode ended: the rule's -1 or +1, never
    # the 0.0 of an episode left open), and TRL's advantages/loss used those scores
    assert len(calls) == 1 and len(calls[0]) == 4 and all(r in (-1.0, 1.0) for r in calls[0])
    logged = trainer.state.log_history[0]
    assert float(logged["rewards/medvqa_rule/mean"]) == pytest.approx(sum(calls[0]) / 4)
    assert trainer.state.global_step == 1 and "loss" in logged
    # (an untrained model never answers, so its group rewards tie and the step's gradient is zero --
    # the native trainer warns about exactly this; the weights moving is tested there)
    assert all(torch.isfinite(p).all() for p in model.parameters()) and before


def test_tool_environment_exposes_the_env_tools_as_trl_reads_them():
    from transformers.utils import get_json_schema

    cls = environment_class({**ENV, "tools": "image_zoom_in,ground=oracle", "max_turns": 2})
    env = cls()
    zoom = get_json_schema(env.image_zoom_in)["function"]
    assert zoom["parameters"]["properties"]["bbox"]["type"] == "array"
    assert zoom["parameters"]["required"] == ["bbox"]
    assert get_json_schema(env.ground)["function"]["parameters"]["properties"]["text"]["type"] == "string"
    env.reset(record_index=1)
    assert env.ground(text="lesion").lstrip().startswith("<observation>")


def test_tool_environments_of_one_class_share_services_and_processes_scoring_alone_are_told(monkeypatch):
    cls = environment_class({**ENV, "tools": "image_zoom_in", "max_turns": 2})
    a, b = cls(), cls()
    assert a.env.services is b.env.services                              # one toolbox and cache for the group
    monkeypatch.setenv("WORLD_SIZE", "2")                                # TRL under accelerate: one per process
    with pytest.warns(UserWarning, match="2 processes scores alone.*ray_actor_name"):
        EnvReward({**ENV, "reward": "default"})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        EnvReward(ENV)                                                   # the rule reward has no state to share


def test_env_reward_ends_each_batch_with_its_number(monkeypatch):
    reward = EnvReward(ENV)
    seen = []
    monkeypatch.setattr(reward.env.reward_fn, "end_batch", lambda batch_id=None: seen.append(batch_id) or {})
    data = prompt_dataset(ENV, indices=range(2))
    for _ in range(3):
        reward(data["prompt"], ["\\boxed{yes}"] * 2, record_index=data["record_index"])
    assert seen == [0, 1, 2]                                             # ids a shared state moves once per
