"""SAM / MedSAM through transformers (``SamModel`` + ``SamImageProcessorPil``).

``model=`` a path or hub name of a checkpoint in HF format (``facebook/sam-vit-base``,
``flaviagiammarino/medsam-vit-base``); the default builds a tiny random SAM (256-pixel input).
"""

from __future__ import annotations

import contextlib
from typing import Any, Mapping, NamedTuple, Sequence

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
        return self.segment_batch([{"image": image, "box": box, "point": point}])[0]

    def segment_batch(self, calls: Sequence[Mapping[str, Any]]) -> list[np.ndarray]:
        """The masks of several calls (each ``segment``'s keyword arguments: ``image``, ``box``,
        ``point``; other keys are ignored), in order, with **one image-encoder forward** for all
        their images (distinct images, any sizes: each is resized and padded to the encoder's
        square input); the prompt encoder and mask decoder, a small share of the work, then run
        call by call. Each mask is the one :meth:`segment` gives for that call alone, pixel for
        pixel (``tests/tool_backends/test_segment_batch.py``): the batch changes how many images
        one forward reads, nothing else (see :func:`rowwise_convolutions`). A dynamic batcher
        (:mod:`tool_backends.ray_serve`) gathers concurrent requests' calls into one such batch."""
        import torch

        if not calls:
            return []
        prepared = [self._prepare(c["image"], c.get("box"), c.get("point")) for c in calls]
        masks = []
        with self.lock, torch.no_grad():
            pixels = torch.cat([p.pixel_values for p in prepared]).to(self.device)
            with rowwise_convolutions(self.model.vision_encoder, len(calls) > 1):
                embeddings = self.model.get_image_embeddings(pixels)
            for i, p in enumerate(prepared):
                kwargs = {}
                if p.box is not None:
                    kwargs["input_boxes"] = p.box.to(self.device)
                if p.point is not None:
                    kwargs["input_points"] = p.point.to(self.device)
                    kwargs["input_labels"] = torch.tensor([[[1]]], device=self.device)
                multimask = p.box is None
                out = self.model(image_embeddings=embeddings[i:i + 1], multimask_output=multimask, **kwargs)
                upsampled = self.processor.post_process_masks(out.pred_masks.cpu(), p.original, p.reshaped,
                                                              mask_threshold=self.mask_threshold)[0]  # (1, k, H, W)
                best = int(out.iou_scores[0, 0].argmax()) if multimask else 0
                masks.append(upsampled[0, best].numpy().astype(bool))
        return masks

    def _prepare(self, image: Image.Image, box, point) -> "_Prepared":
        """One call's encoder input and prompts, scaled to the resized image (batch size 1)."""
        import torch

        inputs = self.processor(images=image.convert("RGB"), return_tensors="pt")
        original, reshaped = inputs["original_sizes"], inputs["reshaped_input_sizes"]
        sy = float(reshaped[0, 0] / original[0, 0])
        sx = float(reshaped[0, 1] / original[0, 1])
        boxes = points = None
        if box is not None:
            x0, y0, x1, y1 = box
            boxes = torch.tensor([[[x0 * sx, y0 * sy, x1 * sx, y1 * sy]]], dtype=torch.float32)
        if point is not None:
            points = torch.tensor([[[[point[0] * sx, point[1] * sy]]]], dtype=torch.float32)
        return _Prepared(inputs["pixel_values"], original, reshaped, boxes, points)


@contextlib.contextmanager
def rowwise_convolutions(model, active: bool = True):
    """Inside, ``model``'s convolutions run one batch row at a time. The rest of SAM's image
    encoder gives a row the same bits whatever else the batch holds, but oneDNN picks a
    convolution algorithm by batch size, and its sums then round differently (the neck's 3x3
    convolution differed by ~2e-6 at batch 4, enough to flip a mask pixel whose logit sits at the
    threshold). The convolutions are a small share of the encoder; its attention and MLP layers,
    most of the work, stay batched. (The prompt encoder's small matmuls are not batch-invariant
    either, which is why the decoder runs call by call.)"""
    import torch

    convs = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))] if active else []
    for m in convs:
        def one_row_at_a_time(x, *args, _m=m, _forward=type(m).forward):
            if x.dim() < 4 or x.shape[0] < 2:
                return _forward(_m, x, *args)
            return torch.cat([_forward(_m, x[i:i + 1], *args) for i in range(x.shape[0])])

        m.forward = one_row_at_a_time
    try:
        yield
    finally:
        for m in convs:
            del m.forward


class _Prepared(NamedTuple):
    pixel_values: Any
    original: Any
    reshaped: Any
    box: Any
    point: Any
