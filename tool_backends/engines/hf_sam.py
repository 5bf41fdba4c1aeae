"""SAM / MedSAM through transformers (``SamModel`` + ``SamImageProcessorPil``).

``model=`` a path or hub name of a checkpoint in HF format (``facebook/sam-vit-base``,
``flaviagiammarino/medsam-vit-base``); the default builds a tiny random SAM (256-pixel input).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from tool_backends.base import ToolContext
from tool_backends.engines.hf_common import TINY, TorchEngine, build_tiny


def tiny_sam(seed: int = 0):
    from transformers import SamConfig, SamImageProcessorPil, SamModel

    config = SamConfig(
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=256, patch_size=16,
                           output_channels=32, window_size=4, global_attn_indexes=[1], mlp_dim=64, num_pos_feats=16,
                           initializer_range=0.02),
        prompt_encoder_config=dict(hidden_size=32, image_size=256, patch_size=16, mask_input_channels=4,
                                   image_embedding_size=16),
        mask_decoder_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_dim=64,
                                 iou_head_hidden_dim=32),
        initializer_range=0.02)
    processor = SamImageProcessorPil(size={"longest_edge": 256}, pad_size={"height": 256, "width": 256})
    return build_tiny(lambda: SamModel(config), seed), processor


class SamSegmenter(TorchEngine):
    """Box and/or point prompt -> the mask SAM scores highest (``multimask_output`` for points)."""

    def __init__(self, model: str = TINY, device: str = "cpu", mask_threshold: float = 0.0) -> None:
        super().__init__(device)
        if self.uses_tiny(model):
            self.model, self.processor = tiny_sam()
        else:
            from transformers import SamImageProcessorPil, SamModel

            self.model = SamModel.from_pretrained(model).eval()
            self.processor = SamImageProcessorPil.from_pretrained(model)
        self.model.to(device)
        self.mask_threshold = float(mask_threshold)

    def segment(self, image: Image.Image, *, box=None, point=None, label=None,
                context: ToolContext | None = None, image_index: int = 0) -> np.ndarray:
        import torch

        inputs = self.processor(images=image.convert("RGB"), return_tensors="pt")
        original, reshaped = inputs["original_sizes"], inputs["reshaped_input_sizes"]
        sy = float(reshaped[0, 0] / original[0, 0])
        sx = float(reshaped[0, 1] / original[0, 1])
        kwargs = {}
        if box is not None:
            x0, y0, x1, y1 = box
            kwargs["input_boxes"] = torch.tensor([[[x0 * sx, y0 * sy, x1 * sx, y1 * sy]]], dtype=torch.float32)
        if point is not None:
            kwargs["input_points"] = torch.tensor([[[[point[0] * sx, point[1] * sy]]]], dtype=torch.float32)
            kwargs["input_labels"] = torch.tensor([[[1]]])
        multimask = box is None
        with self.lock, torch.no_grad():
            out = self.model(pixel_values=inputs["pixel_values"].to(self.device), multimask_output=multimask,
                             **{k: v.to(self.device) for k, v in kwargs.items()})
        masks = self.processor.post_process_masks(out.pred_masks.cpu(), original, reshaped,
                                                  mask_threshold=self.mask_threshold)[0]  # (1, k, H, W)
        best = int(out.iou_scores[0, 0].argmax()) if multimask else 0
        return masks[0, best].numpy().astype(bool)
