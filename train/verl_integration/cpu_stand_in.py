"""A CPU stand-in for verl's rollout server, and the tiny VLM it runs. **Not for training.**

On a GPU machine verl's agent loops generate through ``self.server_manager`` -- an
``AsyncLLMServerManager`` in front of vLLM/SGLang replicas
(``verl.workers.rollout.llm_server.LLMServerClient.generate``). None of that runs without a GPU,
so the tests drive :class:`~train.verl_integration.agent_loop.MedVQAAgentLoop` through
:class:`CPUStandInServerManager`, which implements the same coroutine::

    await generate(request_id, *, prompt_ids, sampling_params, image_data=None, ...) -> TokenOutput

over a real (tiny, randomly initialised) ``Qwen2VLForConditionalGeneration`` on CPU. It checks
what vLLM would check (one image per ``<|vision_start|>`` block, image-pad counts matching the
images' grids) and returns verl's own :class:`~verl.workers.rollout.replica.TokenOutput` with
real log-probabilities.

Because a random model never writes a tool call, ``responses=[...]`` makes the stand-in *score*
given turns instead of sampling them (teacher forcing through the same model: the token ids and
log-probs are real, only the choice of text is scripted). The real path is vLLM behind verl's
``LLMServerClient``; see ``docs/verl.md``.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any, Sequence

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>") + VISION_TOKENS

# Qwen2-VL-style ChatML: image blocks become <|vision_start|><|image_pad|><|vision_end|>.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' or c['type'] == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(corpus: Sequence[str] = (), vocab_size: int = 2000):
    """A byte-level BPE tokenizer (trained in milliseconds) with Qwen's chat and vision tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    base = ["<tool_call>", "</tool_call>", "<observation>", "</observation>", "\\boxed{yes}", "<think>"]
    tok.train_from_iterator(list(corpus) + base * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)
    fast.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    return fast


def build_processor(tokenizer, min_pixels: int = 28 * 28 * 4, max_pixels: int = 28 * 28 * 16):
    """A Qwen2-VL processor without a video processor (which needs torchvision, absent here)."""
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    image_processor = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    return ImageOnlyQwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                     chat_template=CHAT_TEMPLATE)


def bind_rope_index(processor, model_config) -> None:
    """Give the processor Qwen2-VL's M-RoPE ``get_rope_index``, as verl's ``hf_processor`` does for
    a ``Qwen2VLProcessor`` loaded from a checkpoint (verl then computes 3-D position ids)."""
    import types

    from transformers.models.qwen2_vl import Qwen2VLModel

    processor.config = model_config
    processor.get_rope_index = types.MethodType(Qwen2VLModel.get_rope_index, processor)
    if hasattr(Qwen2VLModel, "get_vision_position_ids"):
        processor.get_vision_position_ids = types.MethodType(Qwen2VLModel.get_vision_position_ids, processor)


def build_tiny_qwen2vl(tokenizer, seed: int = 0):
    """A randomly initialised 2-layer Qwen2-VL (the same class that loads real checkpoints)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": None,
        },
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(config).eval()


class CPUStandInServerManager:
    """Stand-in for verl's ``LLMServerClient`` (see the module docstring).

    Args:
        model, tokenizer, processor: a Qwen2-VL-family model and its tokenizer/processor.
        responses: optional scripted turns; the ``k``-th ``generate`` call of a ``request_id``
            teacher-forces ``responses[k]`` (+ ``<|im_end|>``). Past the end, or with ``None``,
            the model samples.

    ``calls`` records every request (request id, prompt length, number of images, max_tokens,
    tokens returned).
    """

    def __init__(self, model, tokenizer, processor, responses: Sequence[str] | None = None) -> None:
        self.model, self.tokenizer, self.processor = model, tokenizer, processor
        self.responses = list(responses) if responses is not None else None
        self.calls: list[dict[str, Any]] = []
        self._turns: dict[str, int] = defaultdict(int)
        self._lock = asyncio.Lock()

    async def generate(self, request_id, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: list[Any] | None = None, video_data: list[Any] | None = None,
                       audio_data: list[Any] | None = None, mm_processor_kwargs: dict[str, Any] | None = None,
                       **kwargs: Any):
        from verl.workers.rollout.replica import TokenOutput

        if video_data or audio_data:
            raise ValueError("the CPU stand-in serves images only, got video/audio data")
        turn = self._turns[request_id]
        self._turns[request_id] += 1
        max_tokens = int(sampling_params.get("max_tokens") or 16)
        if max_tokens < 1:
            raise ValueError(f"expected max_tokens >= 1, got {max_tokens}")
        forced = None
        if self.responses is not None and turn < len(self.responses):
            forced = self.tokenizer.encode(self.responses[turn], add_special_tokens=False)
            forced = (forced + [self.tokenizer.eos_token_id])[:max_tokens]
        call = {"request_id": request_id, "turn": turn, "prompt_len": len(prompt_ids),
                "n_images": len(image_data or []), "max_tokens": max_tokens, "forced": forced is not None}
        self.calls.append(call)
        async with self._lock:  # one forward at a time, off the event loop
            loop = asyncio.get_running_loop()
            token_ids, log_probs = await loop.run_in_executor(
                None, self._run, list(prompt_ids), list(image_data or []), dict(sampling_params), max_tokens, forced)
        call["n_tokens"] = len(token_ids)
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, stop_reason="completed", num_preempted=0)

    # ------------------------------------------------------------------------------------------
    def _vision_inputs(self, prompt_ids: list[int], images: list[Any]) -> dict[str, Any]:
        tok = self.tokenizer
        starts = prompt_ids.count(tok.convert_tokens_to_ids("<|vision_start|>"))
        if starts != len(images):
            raise ValueError(f"prompt has {starts} image blocks but {len(images)} images were sent")
        if not images:
            return {}
        ip = self.processor.image_processor
        out = ip(images=images, return_tensors="pt")
        expected = int((out["image_grid_thw"].prod(dim=-1) // ip.merge_size**2).sum())
        got = prompt_ids.count(tok.convert_tokens_to_ids("<|image_pad|>"))
        if got != expected:
            raise ValueError(f"prompt has {got} image-pad tokens, the images need {expected}")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def _mm_token_type_ids(self, input_ids):
        import torch

        types = torch.zeros_like(input_ids)
        types[input_ids == self.tokenizer.convert_tokens_to_ids("<|image_pad|>")] = 1
        return types

    def _run(self, prompt_ids, images, params, max_tokens, forced):
        import torch

        vision = self._vision_inputs(prompt_ids, images)
        with torch.no_grad():
            if forced is not None:
                ids = torch.tensor([prompt_ids + forced])
                logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                                    mm_token_type_ids=self._mm_token_type_ids(ids), **vision).logits[0]
                logp = torch.log_softmax(logits[len(prompt_ids) - 1:-1].float(), dim=-1)
                return forced, logp.gather(-1, torch.tensor(forced)[:, None])[:, 0].tolist()
            ids = torch.tensor([prompt_ids])
            temperature = float(params.get("temperature", 1.0) or 0.0)
            gen = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=self._mm_token_type_ids(ids),
                max_new_tokens=max_tokens, do_sample=temperature > 0, temperature=temperature or None,
                top_p=None, top_k=None, eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id, return_dict_in_generate=True, output_logits=True, **vision)
            new = gen.sequences[0, len(prompt_ids):].tolist()
            logits = torch.stack(gen.logits, dim=1)[0].float() / max(temperature, 1e-6 if temperature else 1.0)
            logp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(new)[:, None])[:, 0]
            return new, logp.tolist()
