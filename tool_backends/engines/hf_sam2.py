"""SAM 2 (MedSAM2's backbone) and SAM 3's promptable tracker (MedSAM3's) through transformers.

``model=`` a path or hub name of a checkpoint in HF format (``facebook/sam2.1-hiera-tiny``,
``facebook/sam3``, a MedSAM2 / MedSAM3 converted to HF format); the default builds a tiny random
model offline. transformers' SAM 2 / SAM 3 image processors need torchvision, which never goes
into this venv, so the few steps they do are done here: resize to the model's square input,
rescale and normalise with the checkpoint's own ``preprocessor_config.json`` values, and
upsample the low-resolution mask logits back to the image.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from tool_backends.base import ToolContext
from tool_backends.engines.hf_common import TINY, TorchEngine, build_tiny

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
HALF, HALF_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


def square_pixels(image: Image.Image, side: int, mean, std):
    """``image`` resized to ``side`` x ``side`` (bilinear), as a normalised 1x3xSxS float tensor."""
    import torch

    arr = np.asarray(image.convert("RGB").resize((side, side), Image.Resampling.BILINEAR), dtype=np.float32) / 255.0
    arr = (arr - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))[None]


def preprocessor_settings(model: str, side: int, mean, std) -> tuple[int, tuple, tuple]:
    """(side, mean, std) from a checkpoint's ``preprocessor_config.json`` (defaults otherwise)."""
    from transformers.image_processing_utils import ImageProcessingMixin

    try:
        config, _ = ImageProcessingMixin.get_image_processor_dict(model)
    except (OSError, ValueError):
        return side, mean, std
    size = config.get("size") or {}
    side = int(size.get("height") or size.get("longest_edge") or side)
    return side, tuple(config.get("image_mean") or mean), tuple(config.get("image_std") or std)


def upsample_logits(logits, size: tuple[int, int]):
    """``(..., h, w)`` mask logits -> ``(..., H, W)`` for ``size`` = (W, H), bilinear."""
    import torch.nn.functional as F

    lead = logits.shape[:-2]
    flat = logits.reshape(1, -1, *logits.shape[-2:]).float()
    out = F.interpolate(flat, (size[1], size[0]), mode="bilinear", align_corners=False)
    return out.reshape(*lead, size[1], size[0])


def save_with_preprocessor(model, path: str, side: int, mean, std) -> None:
    """``model.save_pretrained(path)`` plus the ``preprocessor_config.json`` values
    :func:`preprocessor_settings` reads back."""
    import json
    from pathlib import Path

    model.save_pretrained(path)
    config = {"size": {"height": side, "width": side}, "image_mean": list(mean), "image_std": list(std)}
    (Path(path) / "preprocessor_config.json").write_text(json.dumps(config))


def _tiny_vision_sam2() -> dict:
    backbone = dict(model_type="sam2_hiera_det_model", hidden_size=16, num_attention_heads=1, image_size=[256, 256],
                    blocks_per_stage=[1, 1, 2, 1], embed_dim_per_stage=[16, 32, 64, 128],
                    num_attention_heads_per_stage=[1, 1, 1, 1], window_size_per_stage=[8, 4, 4, 2],
                    global_attention_blocks=[3], window_positional_embedding_background_size=[2, 2])
    return dict(backbone_config=backbone, backbone_channel_list=[128, 64, 32, 16],
                backbone_feature_sizes=[[64, 64], [32, 32], [16, 16]], fpn_hidden_size=32)


def tiny_sam3_vision() -> dict:
    """A tiny SAM 3 vision config (112-pixel input), shared with the text-prompted engine."""
    vit = dict(model_type="sam3_vit_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=2, image_size=112, patch_size=14, window_size=4, global_attn_indexes=[1],
               pretrain_image_size=56)
    return dict(backbone_config=vit, fpn_hidden_size=32, backbone_feature_sizes=[[32, 32], [16, 16], [8, 8]])


_DECODER = dict(hidden_size=32, mlp_dim=64, num_hidden_layers=2, num_attention_heads=2, iou_head_hidden_dim=32)


def tiny_sam2():
    from transformers import Sam2Config, Sam2Model

    config = Sam2Config(vision_config=_tiny_vision_sam2(), mask_decoder_config=_DECODER,
                        prompt_encoder_config=dict(hidden_size=32, image_size=256, patch_size=16, mask_input_channels=4))
    return build_tiny(lambda: Sam2Model(config)), 256


def tiny_sam3_tracker():
    from transformers import Sam3TrackerConfig, Sam3TrackerModel

    config = Sam3TrackerConfig(vision_config=tiny_sam3_vision(), mask_decoder_config=_DECODER,
                               prompt_encoder_config=dict(hidden_size=32, image_size=112, patch_size=14,
                                                          mask_input_channels=4))
    return build_tiny(lambda: Sam3TrackerModel(config)), 112


class Sam2Segmenter(TorchEngine):
    """Box and/or point prompt -> the mask SAM 2 scores highest (three candidates for a point)."""

    family = "sam2"
    mean, std, side = IMAGENET_MEAN, IMAGENET_STD, 1024

    def __init__(self, model: str = TINY, device: str = "cpu", mask_threshold: float = 0.0) -> None:
        super().__init__(device)
        if self.uses_tiny(model):
            self.model, self.side = self._tiny()
        else:
            self.model = self._load(model)
            self.side, self.mean, self.std = preprocessor_settings(model, self.side, self.mean, self.std)
        self.model.to(device)
        self.mask_threshold = float(mask_threshold)

    def _tiny(self):
        return tiny_sam2()

    def save_pretrained(self, path: str) -> None:
        """Write the model and the preprocessing it needs, loadable again with ``model=path``."""
        save_with_preprocessor(self.model, path, self.side, self.mean, self.std)

    def _load(self, path: str):
        from transformers import Sam2Model

        return Sam2Model.from_pretrained(path).eval()

    def segment(self, image: Image.Image, *, box=None, point=None, label=None,
                context: ToolContext | None = None, image_index: int = 0) -> np.ndarray:
        import torch

        w, h = image.size
        sx, sy = self.side / w, self.side / h
        kwargs: dict[str, Any] = {}
        if box is not None:
            x0, y0, x1, y1 = box
            kwargs["input_boxes"] = torch.tensor([[[x0 * sx, y0 * sy, x1 * sx, y1 * sy]]], dtype=torch.float32)
        if point is not None:
            kwargs["input_points"] = torch.tensor([[[[point[0] * sx, point[1] * sy]]]], dtype=torch.float32)
            kwargs["input_labels"] = torch.tensor([[[1]]])
        multimask = box is None
        pixels = square_pixels(image, self.side, self.mean, self.std)
        with self.lock, torch.no_grad():
            out = self.model(pixel_values=pixels.to(self.device), multimask_output=multimask,
                             **{k: v.to(self.device) for k, v in kwargs.items()})
        best = int(out.iou_scores[0, 0].argmax()) if multimask else 0
        logits = upsample_logits(out.pred_masks[0, 0, best].cpu(), (w, h))
        return (logits > self.mask_threshold).numpy()


class Sam3TrackerSegmenter(Sam2Segmenter):
    """SAM 3's promptable (tracker) model: MedSAM3's backbone, a second one beside SAM 2."""

    family = "sam3"
    mean, std, side = HALF, HALF_STD, 1008

    def _tiny(self):
        return tiny_sam3_tracker()

    def _load(self, path: str):
        from transformers import Sam3TrackerModel

        return Sam3TrackerModel.from_pretrained(path).eval()
