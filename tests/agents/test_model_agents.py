"""The transformers agents on real weights (SmolLM2-135M-Instruct) and tiny random Qwen-VLs.

The tiny VLMs' text is gibberish; these tests check the plumbing: prompts, image tokens, pixel
inputs, batching and that the env accepts whatever comes out.
"""

from __future__ import annotations

import copy

import pytest
import torch

from agents.text_llm import TextLLMAgent
from agents.vlm import VLMAgent
from medvqa_env.chat import Conversation
from medvqa_env.env import MedVQAEnv
from medvqa_env.errors import ConfigError
from rewards import RuleReward

ZOOM = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 60, 60]}}</tool_call>'
QWEN_LIKE_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{{ messages[0]['content'] }}\n# Tools\n<tools>"
    "{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if not (tools and loop.first) %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Generation on a shared 2-core machine is ~5x faster on one thread (no OpenMP spinning)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def smollm2():
    return TextLLMAgent("smollm2", max_new_tokens=16, temperature=0.7, top_p=0.9, seed=0)


@pytest.fixture(scope="module")
def embedded_env():
    env = MedVQAEnv(reward=RuleReward(), max_turns=1)
    yield env
    env.close()


def _conversations(env, n, zoom_in_second=True):
    convs = []
    for i in range(n):
        obs, info = env.reset(options={"index": i})
        conv = Conversation.start(obs, info)
        if zoom_in_second and i == 1:
            obs, *_ = env.step(ZOOM)
            conv.add_turn(ZOOM, obs)
        convs.append(conv)
    return convs


@pytest.mark.slow
def test_smollm2_plays_episodes_batched(smollm2, embedded_env, episodes):
    results = episodes(embedded_env, smollm2, [0, 1])
    assert all(r["end_reason"] in ("answer", "max_turns") for r in results)
    assert all(isinstance(a, str) and a.strip() for r in results for a in r["actions"])


def test_smollm2_prompt_shows_tools_and_images_as_text(smollm2, embedded_env):
    conv = _conversations(embedded_env, 2)[1]
    prompt = smollm2.render(conv)
    assert prompt.count('"type": "function"') == 1  # SmolLM2's template ignores tools=: the env's prompt lists them
    assert "[image 0]" in prompt and "[image 1]" in prompt  # the crop, as text
    assert "Zoomed into region" in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_a_template_that_renders_tools_gets_a_tool_free_system_prompt(smollm2, embedded_env):
    tok = copy.deepcopy(smollm2.tokenizer)
    tok.chat_template = QWEN_LIKE_TEMPLATE
    agent = TextLLMAgent(smollm2.model, tokenizer=tok, max_new_tokens=4, temperature=0.0)
    prompt = agent.render(_conversations(embedded_env, 1)[0])
    assert prompt.count('"image_zoom_in"') == 1 and "# Tools" in prompt  # listed once, by the template
    assert "\\boxed{answer}" in prompt  # the answer protocol is still stated


def test_sampling_is_seeded_and_greedy_batching_matches_single(smollm2, embedded_env):
    convs = _conversations(embedded_env, 2)
    short = {"system_prompt": "Answer briefly.", "max_new_tokens": 5}  # short prompts keep this test cheap
    a = TextLLMAgent(smollm2.model, tokenizer=smollm2.tokenizer, temperature=1.0, seed=5, **short)
    b = TextLLMAgent(smollm2.model, tokenizer=smollm2.tokenizer, temperature=1.0, seed=5, **short)
    assert a.act_batch(convs) == b.act_batch(convs)
    greedy = TextLLMAgent(smollm2.model, tokenizer=smollm2.tokenizer, temperature=0.0, **short)
    assert greedy.render(convs[0]).startswith("<|im_start|>system\nAnswer briefly.<|im_end|>")
    assert greedy.act_batch(convs) == [greedy.act(convs[0]), greedy.act(convs[1])]  # left padding is inert


def test_text_agent_refuses_a_vlm_and_bad_settings(smollm2):
    with pytest.raises(ConfigError, match="use the 'vlm' agent"):
        TextLLMAgent("tiny-qwen2-vl")
    with pytest.raises(ValueError, match="batch_size"):
        TextLLMAgent(smollm2.model, tokenizer=smollm2.tokenizer, batch_size=0)
    with pytest.raises(ConfigError, match="tokenizer="):
        TextLLMAgent(smollm2.model)


@pytest.mark.parametrize("name", ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_tiny_vlm_sees_every_image_and_the_env_accepts_its_turns(name, embedded_env, episodes):
    agent = VLMAgent(name, max_new_tokens=6, temperature=0.0, max_image_side=112)
    convs = _conversations(embedded_env, 2)
    batch = agent.encode(convs)
    grid = batch["image_grid_thw"]
    assert grid.shape[0] == 3  # question image + question image + zoom crop
    per_image = (grid.prod(-1) // agent.merge_size**2).tolist()
    pads = (batch["input_ids"] == agent.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum(-1).tolist()
    assert pads == [per_image[0], per_image[1] + per_image[2]]
    assert batch["pixel_values"].shape[0] == int(grid.prod(-1).sum())
    turns = agent.act_batch(convs)
    assert len(turns) == 2 and all(isinstance(t, str) for t in turns)
    results = episodes(embedded_env, agent, [0, 1])
    assert all(r["end_reason"] in ("answer", "max_turns") for r in results)


def test_vlm_batching_matches_single_and_refuses_text_models(embedded_env):
    agent = VLMAgent("tiny-qwen2-vl", max_new_tokens=6, temperature=0.0, max_image_side=112)
    convs = _conversations(embedded_env, 2)
    assert agent.act_batch(convs) == [agent.act(convs[0]), agent.act(convs[1])]
    with pytest.raises(ConfigError, match="use the 'text-llm' agent"):
        VLMAgent("smollm2")
    with pytest.raises(ConfigError, match="image_processor="):
        VLMAgent(agent.model, tokenizer=agent.tokenizer)
    assert agent.model.dtype == torch.float32


def test_vlm_loads_a_checkpoint_folder_like_a_real_one(tmp_path, embedded_env):
    """Save a tiny Qwen2.5-VL as a Hugging Face folder and load it by path (the real-checkpoint path)."""
    from agents.models import load_policy

    model, encoder, _ = load_policy("tiny-qwen2.5-vl", seed=3)
    model.save_pretrained(tmp_path)
    encoder.save_pretrained(tmp_path)
    agent = VLMAgent(str(tmp_path), max_new_tokens=4, temperature=0.0, max_image_side=112)
    assert agent.config()["model"] == str(tmp_path)
    assert type(agent.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    conv = _conversations(embedded_env, 1)[0]
    assert isinstance(agent.act(conv), str)
