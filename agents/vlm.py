"""``VLMAgent``: Qwen2-VL / Qwen2.5-VL / Qwen3-VL through transformers, seeing every image.

Every image of the conversation -- the question's image(s) and each tool crop or overlay, in
episode order -- goes in as pixels: the prompt is rendered with the tokenizer's chat template
(``tools=`` the tools' schemas, as :class:`~agents.text_llm.TextLLMAgent` does), each image part
becomes ``<|vision_start|><|image_pad|><|vision_end|>``, and each ``<|image_pad|>`` is expanded to
the image's merged patch count (``grid_t * grid_h * grid_w // merge_size**2``), exactly as Qwen's
processor does (its processor class needs torchvision, which this project cannot install beside
the CPU torch, so the PIL image processor is used and the expansion done here).

Batched generation left-pads the token rows and concatenates all images' patches in batch order;
Qwen's rope index uses the attention mask, so padding does not shift positions.

``model`` is a local checkpoint folder (e.g. a downloaded ``Qwen/Qwen2.5-VL-7B-Instruct``) or one
of the tiny randomly initialised test models (``"tiny-qwen2-vl"``, ``"tiny-qwen2.5-vl"``,
``"tiny-qwen3-vl"``), whose output is gibberish but runs through the very same code.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from PIL import Image

from agents.models import expand_image_pads
from agents.text_llm import TextLLMAgent, _left_pad
from medvqa_env.chat import Conversation
from medvqa_env.errors import ConfigError

VISION_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


class VLMAgent(TextLLMAgent):
    """A Qwen-VL chat model as an agent. Arguments as :class:`TextLLMAgent`, plus:

    Args:
        model: a checkpoint folder or a tiny test model name (see the module docstring).
        image_processor: the image processor when ``model`` is a loaded model.
        merge_size: the vision tower's spatial merge size when ``model`` is a loaded model.
        max_image_side: images are shrunk to this side before patching (a CPU budget knob; real
            runs may raise it to the processor's own ``max_pixels``); default: what a trainer's
            checkpoint was trained with (``medvqa_run.json``), else 448.
        model_seed: seed for the random initialisation of tiny test models.
    """

    name = "vlm"

    def __init__(self, model: Any = "tiny-qwen2-vl", tokenizer: Any = None, image_processor: Any = None,
                 merge_size: int = 2, max_image_side: int | None = None, model_seed: int = 0, **options: Any) -> None:
        self._image_processor, self.merge_size = image_processor, int(merge_size)
        self._model_seed = int(model_seed)
        super().__init__(model=model, tokenizer=tokenizer, **options)
        self.max_image_side = int(self._trained_or_given("max_image_side", max_image_side, 448))

    def _load(self, model: Any, tokenizer: Any, dtype: torch.dtype, device: str):
        if not isinstance(model, str):
            if tokenizer is None or self._image_processor is None:
                raise ConfigError("expected tokenizer= and image_processor= together with a loaded model")
            return model.to(device), tokenizer
        from agents.models import load_policy

        loaded, encoder, kind = load_policy(model, dtype=dtype, seed=self._model_seed, device=device)
        self.saved_system_prompt = encoder.system_prompt
        if kind != "vlm":
            raise ConfigError(f"expected a vision-language model for 'vlm', got a {kind} model from {model!r}; "
                              "use the 'text-llm' agent for text-only models")
        self._image_processor, self.merge_size = encoder.image_processor, encoder.merge_size
        return loaded, encoder.tokenizer

    # ---- prompts: images become vision placeholders, in the order they appear -----------------
    def _image_token(self, index: int) -> str:
        return VISION_PLACEHOLDER

    def image_order(self, conversation: Conversation) -> list[int]:
        """Episode image indices in the order their placeholders appear in the prompt."""
        order = []
        for m in conversation.messages:
            content = m["content"]
            if m["role"] == "tool":
                order.extend(m.get("images") or ())
            elif isinstance(content, list):
                order.extend(p["image_index"] for p in content if p.get("type") == "image")
        return order

    def pixel_inputs(self, images: Sequence[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pixel_values, image_grid_thw)`` for ``images`` (copies are shrunk, never the originals)."""
        small = []
        for im in images:
            im = im.convert("RGB")  # convert() returns a new image
            if max(im.size) > self.max_image_side:
                im.thumbnail((self.max_image_side, self.max_image_side))
            small.append(im)
        out = self._image_processor(images=small, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    def encode(self, conversations: Sequence[Conversation]) -> dict[str, torch.Tensor]:
        pad_image = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        rows, pixels, grids = [], [], []
        for conv in conversations:
            ids = self.tokenizer(self.render(conv), add_special_tokens=False)["input_ids"]
            order = self.image_order(conv)
            found = sum(1 for t in ids if t == pad_image)
            if found != len(order):
                raise ValueError(f"expected {len(order)} image placeholders in the rendered prompt, got {found} "
                                 "(does the chat template drop message text?)")
            if order:
                pv, grid = self.pixel_inputs([conv.images[i] for i in order])
                ids = expand_image_pads(ids, pad_image, grid, self.merge_size)
                pixels.append(pv)
                grids.append(grid)
            rows.append(ids)
        batch = _left_pad(rows, self._pad_id())
        batch["mm_token_type_ids"] = (batch["input_ids"] == pad_image).to(torch.int32)
        if pixels:
            batch["pixel_values"] = torch.cat(pixels).to(self.model.dtype)
            batch["image_grid_thw"] = torch.cat(grids)
        return batch

    def config(self) -> dict[str, Any]:
        return {**super().config(), "max_image_side": self.max_image_side, "merge_size": self.merge_size}
