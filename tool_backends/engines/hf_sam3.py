"""Text-prompted segmentation with SAM 3 (``Sam3Model``, MedSAM3's concept model) through
transformers: a phrase -> instance masks with scores.

``model=`` a path or hub name of a checkpoint in HF format (``facebook/sam3``, a MedSAM3 converted
to HF format); the default builds a tiny random model offline with a character tokenizer.
Pre- and post-processing follow ``Sam3Processor`` without its torchvision dependency (see
:mod:`tool_backends.engines.hf_sam2`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from tool_backends.base import ToolContext
from tool_backends.engines.hf_common import CHAR_VOCAB, EOS_ID, TINY, TorchEngine, build_tiny, tiny_tokenizer
from tool_backends.engines.hf_sam2 import (HALF, HALF_STD, preprocessor_settings, save_with_preprocessor,
                                          square_pixels, tiny_sam3_vision, upsample_logits)


def tiny_sam3():
    from transformers import Sam3Config, Sam3Model

    small = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64)
    config = Sam3Config(
        vision_config=tiny_sam3_vision(),
        text_config=dict(vocab_size=len(CHAR_VOCAB), hidden_size=32, intermediate_size=64, projection_dim=32,
                         num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=32, pad_token_id=0,
                         bos_token_id=1, eos_token_id=EOS_ID),
        geometry_encoder_config=dict(num_layers=1, **small), detr_encoder_config=dict(num_layers=1, **small),
        detr_decoder_config=dict(num_layers=1, num_queries=10, **small),
        mask_decoder_config=dict(hidden_size=32, num_attention_heads=2))
    return build_tiny(lambda: Sam3Model(config)), tiny_tokenizer(32), 112


class Sam3TextSegmenter(TorchEngine):
    """``segment_text(image, text=...)`` -> instances ``{"mask", "score", "label"}`` above
    ``threshold``, best first (score = query score x presence score, as SAM 3 scores them)."""

    def __init__(self, model: str = TINY, device: str = "cpu", mask_threshold: float = 0.5,
                 max_text_tokens: int = 32) -> None:
        super().__init__(device)
        self.side, self.mean, self.std = 1008, HALF, HALF_STD
        if self.uses_tiny(model):
            self.model, self.tokenizer, self.side = tiny_sam3()
        else:
            from transformers import AutoTokenizer, Sam3Model

            self.model = Sam3Model.from_pretrained(model).eval()
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.side, self.mean, self.std = preprocessor_settings(model, self.side, self.mean, self.std)
        self.model.to(device)
        self.mask_threshold = float(mask_threshold)
        self.max_text_tokens = int(max_text_tokens)

    def save_pretrained(self, path: str) -> None:
        """Write model, tokenizer and preprocessing, loadable again with ``model=path``."""
        save_with_preprocessor(self.model, path, self.side, self.mean, self.std)
        self.tokenizer.save_pretrained(path)

    def segment_text(self, image: Image.Image, *, text: str, threshold: float = 0.3, max_instances: int = 5,
                     context: ToolContext | None = None, image_index: int = 0) -> list[dict[str, Any]]:
        import torch

        w, h = image.size
        tokens = self.tokenizer([text], padding="max_length", max_length=self.max_text_tokens, truncation=True,
                                return_tensors="pt")
        pixels = square_pixels(image, self.side, self.mean, self.std)
        with self.lock, torch.no_grad():
            out = self.model(pixel_values=pixels.to(self.device), input_ids=tokens["input_ids"].to(self.device),
                             attention_mask=tokens["attention_mask"].to(self.device))
        scores = out.pred_logits[0].float().sigmoid().cpu()
        if out.presence_logits is not None:
            scores = scores * out.presence_logits[0].float().sigmoid().cpu()
        order = [int(i) for i in scores.argsort(descending=True) if float(scores[i]) >= threshold][:max_instances]
        if not order:
            return []
        probs = upsample_logits(out.pred_masks[0, order].cpu(), (w, h)).sigmoid()
        return [{"mask": (probs[k] > self.mask_threshold).numpy(), "score": float(scores[i]), "label": text}
                for k, i in enumerate(order)]
