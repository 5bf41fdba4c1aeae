"""Open-vocabulary detection through transformers: OWL-ViT and Grounding DINO.

``model=`` a path or hub name (``google/owlvit-base-patch32``, ``IDEA-Research/grounding-dino-tiny``);
the default builds a tiny random model (offline). Both use their PIL image processors (no
torchvision); Grounding DINO's boxes are post-processed here (sigmoid over the prompt's tokens,
the best token's score per query), which is what its processor does for a single phrase.
"""

from __future__ import annotations

from typing import Any

from PIL import Image

from tool_backends.base import ToolContext
from tool_backends.engines.hf_common import CHAR_VOCAB, EOS_ID, TINY, TorchEngine, build_tiny, tiny_tokenizer


def tiny_owlvit():
    from transformers import OwlViTConfig, OwlViTForObjectDetection, OwlViTImageProcessorPil

    config = OwlViTConfig(
        text_config=dict(vocab_size=len(CHAR_VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=32, pad_token_id=0, bos_token_id=1,
                         eos_token_id=EOS_ID),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=96, patch_size=16),
        projection_dim=32)
    processor = OwlViTImageProcessorPil(size={"height": 96, "width": 96}, crop_size={"height": 96, "width": 96})
    model = build_tiny(lambda: OwlViTForObjectDetection(config))
    import torch

    with torch.no_grad():  # the box head's default init (std ~1) sends every box off the image; keep them near the grid prior
        for param in model.box_head.parameters():
            param.mul_(0.02)
    return model, processor, tiny_tokenizer(32)


def tiny_grounding_dino():
    from transformers import (BertConfig, GroundingDinoConfig, GroundingDinoForObjectDetection,
                              GroundingDinoImageProcessorPil, SwinConfig)

    backbone = SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 1], window_size=4,
                          out_features=["stage1", "stage2"])
    text = BertConfig(vocab_size=len(CHAR_VOCAB), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    config = GroundingDinoConfig(backbone_config=backbone, text_config=text, use_timm_backbone=False, d_model=32,
                                 encoder_layers=1, decoder_layers=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                 encoder_attention_heads=2, decoder_attention_heads=2, num_queries=20,
                                 num_feature_levels=2, max_text_len=64, encoder_n_points=2, decoder_n_points=2)
    processor = GroundingDinoImageProcessorPil(size={"shortest_edge": 64, "longest_edge": 96})
    return build_tiny(lambda: GroundingDinoForObjectDetection(config)), processor, tiny_tokenizer(64)


class OwlViTGrounder(TorchEngine):
    """OWL-ViT: one text query, boxes above ``threshold`` after the processor's post-processing."""

    def __init__(self, model: str = TINY, device: str = "cpu", template: str = "a photo of {}") -> None:
        super().__init__(device)
        self.template = template
        if self.uses_tiny(model):
            self.model, self.processor, self.tokenizer = tiny_owlvit()
        else:
            from transformers import AutoTokenizer, OwlViTForObjectDetection, OwlViTImageProcessorPil

            self.model = OwlViTForObjectDetection.from_pretrained(model).eval()
            self.processor = OwlViTImageProcessorPil.from_pretrained(model)
            self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model.to(device)

    def detect(self, image: Image.Image, *, text: str, context: ToolContext | None = None, image_index: int = 0,
               threshold: float = 0.1, max_boxes: int = 5) -> list[dict[str, Any]]:
        import torch

        pixels = self.processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"]
        tokens = self.tokenizer([self.template.format(text)], padding="max_length", truncation=True,
                                max_length=self.model.config.text_config.max_position_embeddings, return_tensors="pt")
        with self.lock, torch.no_grad():
            out = self.model(input_ids=tokens["input_ids"].to(self.device),
                             attention_mask=tokens["attention_mask"].to(self.device),
                             pixel_values=pixels.to(self.device))
        w, h = image.size
        res = self.processor.post_process_object_detection(out, threshold=threshold, target_sizes=[(h, w)])[0]
        order = res["scores"].argsort(descending=True)[:max_boxes]
        return [{"bbox": res["boxes"][i].tolist(), "label": text, "score": float(res["scores"][i])} for i in order]


class GroundingDinoGrounder(TorchEngine):
    """Grounding DINO (transformers port): the prompt as one phrase ending in '.'."""

    def __init__(self, model: str = TINY, device: str = "cpu") -> None:
        super().__init__(device)
        if self.uses_tiny(model):
            self.model, self.processor, self.tokenizer = tiny_grounding_dino()
        else:
            from transformers import AutoTokenizer, GroundingDinoForObjectDetection, GroundingDinoImageProcessorPil

            self.model = GroundingDinoForObjectDetection.from_pretrained(model).eval()
            self.processor = GroundingDinoImageProcessorPil.from_pretrained(model)
            self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model.to(device)

    def detect(self, image: Image.Image, *, text: str, context: ToolContext | None = None, image_index: int = 0,
               threshold: float = 0.1, max_boxes: int = 5) -> list[dict[str, Any]]:
        import torch

        prompt = text.lower().strip().rstrip(".") + " ."
        inputs = self.processor(images=image.convert("RGB"), return_tensors="pt")
        tokens = self.tokenizer([prompt], truncation=True, max_length=self.model.config.max_text_len,
                                return_tensors="pt")
        with self.lock, torch.no_grad():
            out = self.model(pixel_values=inputs["pixel_values"].to(self.device),
                             pixel_mask=inputs["pixel_mask"].to(self.device),
                             input_ids=tokens["input_ids"].to(self.device),
                             attention_mask=tokens["attention_mask"].to(self.device),
                             token_type_ids=torch.zeros_like(tokens["input_ids"]).to(self.device))
        n = int(tokens["attention_mask"].sum())
        scores = out.logits[0, :, :n].sigmoid().max(-1).values.cpu()
        w, h = image.size
        boxes = []
        for i in scores.argsort(descending=True)[:max_boxes].tolist():
            if float(scores[i]) < threshold:
                break
            cx, cy, bw, bh = out.pred_boxes[0, i].cpu().tolist()
            boxes.append({"bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h],
                          "label": text, "score": float(scores[i])})
        return boxes
