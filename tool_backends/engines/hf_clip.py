"""Zero-shot classification with CLIP or SigLIP through transformers.

``model=`` a path or hub name (``openai/clip-vit-base-patch32``, ``google/siglip-base-patch16-224``,
a PubMedCLIP in HF format); the default builds a tiny random model. Probabilities are a softmax
over the image-text logits of ``template.format(label)`` for each label.

A folder trained by ``python -m tool_backends.finetune classify`` learned a fixed set of labels
(its ``medvqa_tool.json``): the engine exposes them as ``known_labels`` and the ``classify`` tool
flags any label outside them. A zero-shot checkpoint has ``known_labels = None`` (open vocabulary).
"""

from __future__ import annotations

from typing import Sequence

from PIL import Image

from tool_backends.base import ToolContext
from tool_backends.engines.hf_common import CHAR_VOCAB, EOS_ID, TINY, TorchEngine, build_tiny, tiny_tokenizer

_TEXT = dict(vocab_size=len(CHAR_VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=EOS_ID)
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=64,
               patch_size=16)


def tiny_clip(kind: str):
    if kind == "clip":
        from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

        config = CLIPConfig(text_config=_TEXT, vision_config=_VISION, projection_dim=32)
        processor = CLIPImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})
        return build_tiny(lambda: CLIPModel(config)), processor, tiny_tokenizer(64)
    from transformers import SiglipConfig, SiglipImageProcessorPil, SiglipModel

    config = SiglipConfig(text_config=_TEXT, vision_config=_VISION)
    processor = SiglipImageProcessorPil(size={"height": 64, "width": 64})
    return build_tiny(lambda: SiglipModel(config)), processor, tiny_tokenizer(64)


def trained_labels(model: str) -> tuple[str, ...] | None:
    """The labels a folder written by ``tool_backends.finetune`` was trained on, else ``None``."""
    from pathlib import Path

    from tool_backends.finetune.common import read_info

    info = read_info(model) if Path(model).is_dir() else None
    labels = (info or {}).get("labels")
    return tuple(str(lab) for lab in labels) if isinstance(labels, list) and labels else None


class ClipClassifier(TorchEngine):
    """CLIP-style contrastive model: softmax over label prompts."""

    kind = "clip"
    known_labels: tuple[str, ...] | None = None
    """The labels a trained folder learned (``None``: open vocabulary, any label is fair)."""

    def __init__(self, model: str = TINY, device: str = "cpu", template: str = "a medical image of {}",
                 max_length: int = 64) -> None:
        super().__init__(device)
        if "{}" not in template:
            raise ValueError(f"expected a template with '{{}}' for the label, got {template!r}")
        self.template = template
        self.max_length = int(max_length)
        if self.uses_tiny(model):
            self.model, self.processor, self.tokenizer = tiny_clip(self.kind)
        else:
            self.model, self.processor, self.tokenizer = self._load(model)
            self.known_labels = trained_labels(model)
        self.model.to(device)

    def _load(self, path: str):
        from transformers import AutoTokenizer, CLIPImageProcessorPil, CLIPModel

        return CLIPModel.from_pretrained(path).eval(), CLIPImageProcessorPil.from_pretrained(path), \
            AutoTokenizer.from_pretrained(path)

    def classify(self, image: Image.Image, labels: Sequence[str], *, context: ToolContext | None = None,
                 image_index: int = 0) -> dict[str, float]:
        import torch

        pixels = self.processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"]
        text = self.tokenizer([self.template.format(lab) for lab in labels], padding="max_length",
                              max_length=self.max_length, truncation=True, return_tensors="pt")
        with self.lock, torch.no_grad():
            out = self.model(input_ids=text["input_ids"].to(self.device), pixel_values=pixels.to(self.device),
                             **self._extra(text))
        probs = out.logits_per_image[0].float().softmax(-1).cpu().tolist()
        return dict(zip(labels, probs))

    def _extra(self, text) -> dict:
        return {"attention_mask": text["attention_mask"].to(self.device)}


class SiglipClassifier(ClipClassifier):
    """SigLIP: same interface; texts padded to ``max_length`` as SigLIP was trained."""

    kind = "siglip"

    def __init__(self, model: str = TINY, device: str = "cpu", template: str = "a medical image of {}",
                 max_length: int = 64) -> None:
        super().__init__(model, device, template, max_length)

    def _load(self, path: str):
        from transformers import AutoTokenizer, SiglipImageProcessorPil, SiglipModel

        return SiglipModel.from_pretrained(path).eval(), SiglipImageProcessorPil.from_pretrained(path), \
            AutoTokenizer.from_pretrained(path)

    def _extra(self, text) -> dict:
        return {}  # SigLIP attends to the padding on purpose
