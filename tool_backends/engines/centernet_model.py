"""A small CenterNet-style detector for the ``centernet`` ground engine: the network, its config,
and the folder format it is saved in and loaded from by path.

Why not a tiny OWL-ViT: trained from scratch on the phantoms for a few CPU minutes (dense
per-patch focal loss, L1 + GIoU boxes, patch 16 at 256 pixels so small lesions keep their own
patch), it stayed near chance on the validation presence questions, and a wider one was several
times slower a step; a ViT has to learn locality from data, which CPU minutes do not buy. A small
convolutional encoder-decoder has locality built in and learns the task in CPU minutes
(quality and CPU seconds: ``BENCHMARKS.md``, tool quality).

The network maps an image (resized to ``image_size`` square) to one heatmap per trained label at
stride 4 plus a box regression (centre offset, log width, log height, in grid cells) per cell,
as in CenterNet (Zhou et al., 2019, "Objects as Points"). A global pooled feature is added at
the coarsest scale (which phantom, which modality) and the decoder sees normalised x/y
coordinates (left and right are positions).

Folder: ``config.json`` (:class:`GrounderConfig`), ``model.safetensors`` (the weights).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from medvqa_env.errors import ConfigError

FORMAT = "medvqa-centernet-grounder"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
STRIDE = 4


@dataclass
class GrounderConfig:
    """What fixes a saved grounder's network and how its output is read."""

    labels: list[str]
    """the labels it was trained on, one heatmap each (queries are matched to these)"""
    image_size: int = 256
    """input side in pixels (images are resized to a square of this side)"""
    width: int = 16
    """channels of the first full stage (others are multiples)"""
    mean: float = 0.5
    """input normalisation: (pixel / 255 - mean) / std"""
    std: float = 0.25
    """input normalisation"""
    threshold: float = 0.3
    """default score threshold (chosen on validation data by the trainer)"""
    format: str = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)
    """anything else the trainer wants to keep next to the config"""

    def __post_init__(self) -> None:
        if not self.labels or not all(isinstance(x, str) and x for x in self.labels):
            raise ConfigError(f"expected a non-empty list of label strings, got {self.labels!r}")
        if self.image_size % 32:
            raise ConfigError(f"expected image_size to be a multiple of 32, got {self.image_size!r}")

    @property
    def grid(self) -> int:
        return self.image_size // STRIDE


def build_net(config: GrounderConfig):
    """The network for ``config`` (randomly initialised)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    def block(c_in: int, c_out: int, stride: int = 1) -> nn.Module:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out),
                             nn.ReLU(inplace=True))

    w = int(config.width)

    class CenterNetGrounderNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(block(3, w // 2, 2), block(w // 2, w, 2), block(w, 2 * w))  # stride 4
            self.down8 = nn.Sequential(block(2 * w, 4 * w, 2), block(4 * w, 4 * w))
            self.down16 = nn.Sequential(block(4 * w, 4 * w, 2), block(4 * w, 4 * w))
            self.down32 = nn.Sequential(block(4 * w, 4 * w, 2), block(4 * w, 4 * w))
            self.context = nn.Linear(4 * w, 4 * w)
            self.up16 = block(8 * w, 4 * w)
            self.up8 = block(8 * w, 2 * w)
            self.up4 = block(4 * w + 2, w)
            self.heatmap = nn.Conv2d(w, len(config.labels), 1)
            self.box = nn.Conv2d(w, 4, 1)
            nn.init.constant_(self.heatmap.bias, -4.6)  # start near "nothing anywhere" (p ~ 0.01)

        def forward(self, x):
            f4 = self.stem(x)
            f8 = self.down8(f4)
            f16 = self.down16(f8)
            f32 = self.down32(f16)
            f32 = f32 + self.context(f32.mean((2, 3)))[:, :, None, None]
            u = self.up16(torch.cat([F.interpolate(f32, scale_factor=2.0), f16], 1))
            u = self.up8(torch.cat([F.interpolate(u, scale_factor=2.0), f8], 1))
            b, _, h, wd = f4.shape
            yy, xx = torch.meshgrid(torch.linspace(-1, 1, h, device=x.device), torch.linspace(-1, 1, wd, device=x.device),
                                    indexing="ij")
            coords = torch.stack([xx, yy])[None].expand(b, -1, -1, -1)
            u = self.up4(torch.cat([F.interpolate(u, scale_factor=2.0), f4, coords], 1))
            return self.heatmap(u), self.box(u)

    return CenterNetGrounderNet()


def save_grounder(net, config: GrounderConfig, folder: str | Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` into ``folder`` (created if needed)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(asdict(config), indent=2) + "\n", encoding="utf-8")
    save_file({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, str(folder / WEIGHTS_FILE))


def is_grounder_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a grounder saved by :func:`save_grounder`."""
    try:
        data = json.loads((Path(folder) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


def load_grounder(folder: str | Path, device: str = "cpu"):
    """``(net in eval mode, config)`` from a folder written by :func:`save_grounder`; a clear
    :class:`ConfigError` when the folder is not one."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not is_grounder_folder(folder):
        raise ConfigError(f"{str(folder)!r} is not a grounder folder (expected {CONFIG_FILE} with "
                          f"format {FORMAT!r} and {WEIGHTS_FILE}; train one with "
                          "`python -m tool_backends.finetune ground --out DIR`)")
    data = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    data.pop("format", None)
    config = GrounderConfig(**data)
    net = build_net(config)
    try:
        net.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
    except (OSError, RuntimeError) as e:
        raise ConfigError(f"{str(folder)!r}: cannot load {WEIGHTS_FILE}: {e}") from None
    return net.to(device).eval(), config
