"""``widen_heads``: the native tiny Qwen2-VL (text head_dim 16) as the same function with head_dim 64,
which vLLM-CPU serves -- how the learning protocol's warm start runs through verl (docs/verl.md)."""

from __future__ import annotations

import json

import pytest
import torch

from agents.models import build_tiny_vlm, load_policy, model_inputs
from train.verl_integration.widen_heads import _episodes, head_map, widen, widen_config, widen_state

PROMPT = "You answer questions about medical images. Give the final answer as \\boxed{answer}."


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A native tiny Qwen2-VL saved as the trainers save one, with a demo prompt in medvqa_run.json."""
    folder = tmp_path_factory.mktemp("native") / "ckpt"
    model, encoder = build_tiny_vlm("tiny-qwen2-vl", seed=3)
    model.save_pretrained(folder)
    encoder.save_pretrained(folder)
    (folder / "medvqa_run.json").write_text(json.dumps({
        "system_prompt": PROMPT, "system_prompt_source": "override", "kind": "vlm",
        "encoder": {"chat_format": "chatml", "max_image_side": 224, "image_token": "<image>"}}))
    return folder


@pytest.fixture(scope="module")
def widened(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("wide") / "policy"
    return out, widen(checkpoint, out)


def test_same_logits_with_heads_vllm_cpu_serves(checkpoint, widened):
    out, report = widened
    config = json.loads((out / "config.json").read_text())["text_config"]
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert sum(config["rope_parameters"]["mrope_section"]) == 32
    assert config["tie_word_embeddings"] is False
    assert report["head_dim"] == [16, 64] and report["max_logit_difference"] < 1e-4
    # the saved prompt and encoder settings travel with it, and the prompt is what load_policy keeps
    _, encoder, kind = load_policy(out)
    assert kind == "vlm" and encoder.system_prompt == PROMPT


def test_the_zero_coordinates_stay_zero_under_training(checkpoint, widened):
    """Each new coordinate's gradient is a product with another zero: after AdamW steps on real
    episodes (images included) the widened model still computes the original's function class --
    every added coordinate of every weight is still exactly 0."""
    from safetensors.torch import load_file

    out, _ = widened
    text = json.loads((checkpoint / "config.json").read_text())["text_config"]
    ones = {k: torch.ones_like(v) for k, v in load_file(str(checkpoint / "model.safetensors")).items()}
    ones.setdefault("lm_head.weight", ones["model.embed_tokens.weight"])
    added = {k: v == 0 for k, v in widen_state(ones, text).items()}  # 0 exactly where a coordinate was added
    model, encoder, _ = load_policy(out)
    saved = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(saved[k][m], torch.zeros_like(saved[k][m])) for k, m in added.items())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for conv in _episodes(checkpoint, n=2):
        inputs = model_inputs(encoder, conv)
        loss = model(**inputs, labels=inputs["input_ids"]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = model.state_dict()
    def loaded(name: str) -> str:  # the checkpoint's (legacy) names -> transformers' module names
        if name.startswith("visual."):
            return "model." + name
        return "model.language_model." + name[len("model."):] if name.startswith("model.") else name

    names = {k: loaded(k) for k in saved}
    assert set(names.values()) <= set(after)
    checked = 0
    for file_name, mask in added.items():
        w = after[names[file_name]]
        assert w.shape == mask.shape, file_name
        if mask.any():
            assert torch.count_nonzero(w[mask]) == 0, file_name
            checked += 1
    assert checked > 10
    assert sum(not torch.equal(after[k], before[k]) for k in after) > 10  # the real weights did move


def test_rotary_pairs_keep_their_frequency():
    """Coordinate k of a 16-wide head pairs with k + 8 at frequency theta^(-2k/16); in the 64-wide
    head they sit at 4k and 32 + 4k, whose frequency theta^(-2*4k/64) is the same."""
    m = head_map(16, 64)
    for k in range(8):
        assert m[k + 8] - m[k] == 32 and m[k] == 4 * k
        assert 10000.0 ** (-2 * k / 16) == pytest.approx(10000.0 ** (-2 * m[k] / 64))


def test_refuses_what_it_cannot_widen(checkpoint):
    from medvqa_env.errors import ConfigError

    config = json.loads((checkpoint / "config.json").read_text())
    with pytest.raises(ConfigError, match="Qwen2-VL"):
        widen_config({**config, "model_type": "qwen3_vl"})
    wide = widen_config(config)
    with pytest.raises(ConfigError, match="already 64"):
        widen_config(wide)
