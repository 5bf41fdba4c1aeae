"""Which pixels reach a vision tower: one JSON line per Qwen2-VL vision-tower call, in vLLM (the
rollout) and in transformers (verl's FSDP actor and reference), so that a run can show the env's
images reached both -- and with the same pixels.

``MEDVQA_VISION_TRACE=<folder>`` turns it on. The launcher then forwards the variable to every Ray
worker and names this module in ``VERL_USE_EXTERNAL_MODULES`` (verl imports it in every process that
imports verl, vLLM's worker processes included). Each call appends

    {"side": "vllm" | "hf", "pid": ..., "grad": <autograd on>, "features": <image tokens filled>,
     "images": [{"grid": [t, h, w], "sha1": ...}, ...]}

to ``<folder>/vision.<pid>.jsonl``. An image's digest (:func:`digests`) is the SHA-1 of its patch
rows as float32 bytes: equal digests are bit-identical pixels. The agent loop writes the digests of
the images the env handed it (``medvqa.image_sha1`` in the episode log) with the same function.
Works on GPU too (nothing here is CPU-specific); off, it costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from train.verl_integration.cpu_platform import Patch, arm

ENV_VAR = "MEDVQA_VISION_TRACE"
MODULE = "train.verl_integration.vision_trace"


def folder() -> str | None:
    return os.environ.get(ENV_VAR) or None


def digests(pixel_values: Any, grid_thw: Any) -> list[dict[str, Any]]:
    """Per image: its grid and the SHA-1 of its ``t*h*w`` patch rows (float32) in ``pixel_values``."""
    import torch

    grids = [[int(v) for v in g] for g in (grid_thw.tolist() if hasattr(grid_thw, "tolist") else grid_thw)]
    rows = pixel_values.detach().to("cpu", torch.float32).contiguous()
    out, start = [], 0
    for t, h, w in grids:
        n = t * h * w
        out.append({"grid": [t, h, w], "sha1": hashlib.sha1(rows[start:start + n].numpy().tobytes()).hexdigest()})
        start += n
    if start != rows.shape[0]:
        raise ValueError(f"expected {start} patch rows for grids {grids}, got {rows.shape[0]}")
    return out


def image_digests(processor: Any, images: list[Any]) -> list[str]:
    """Digests of ``images`` as ``processor`` (verl's ``hf_processor``) turns them into pixels."""
    if not images:
        return []
    out = processor.image_processor(images=list(images), return_tensors="pt")
    return [d["sha1"] for d in digests(out["pixel_values"], out["image_grid_thw"])]


def weight_digests(tower: Any) -> list[str]:
    """SHA-1 of each parameter of a vision tower (float32 bytes), sorted: the same weights give the
    same list in vLLM and in transformers (Qwen2-VL's vision tower has the same tensors in both)."""
    import torch

    return sorted(hashlib.sha1(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()).hexdigest()
                  for p in tower.parameters())


def _write(side: str, pixel_values: Any, grid_thw: Any, merge_size: int, tower: Any = None) -> None:
    import torch

    path = folder()
    if path is None:
        return
    images = digests(pixel_values, grid_thw)
    row = {"side": side, "pid": os.getpid(), "grad": torch.is_grad_enabled(),
           "features": sum(t * h * w for t, h, w in (d["grid"] for d in images)) // merge_size**2,
           "images": images, "weights": weight_digests(tower) if tower is not None else None}
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, f"vision.{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def _trace_hf(modeling) -> None:
    cls = modeling.Qwen2VisionTransformerPretrainedModel
    original = cls.forward
    if getattr(original, "_medvqa_trace", False):
        return

    def forward(self, hidden_states, grid_thw, *args, **kwargs):
        _write("hf", hidden_states, grid_thw, self.spatial_merge_size)  # FSDP flattens its weights
        return original(self, hidden_states, grid_thw, *args, **kwargs)

    forward._medvqa_trace = True
    cls.forward = forward


def _trace_vllm(qwen2_vl) -> None:
    cls = qwen2_vl.Qwen2VisionTransformer
    original = cls.forward
    if getattr(original, "_medvqa_trace", False):
        return

    def forward(self, x, grid_thw, *args, **kwargs):
        _write("vllm", self.input_norm(x, self.dtype), grid_thw, self.spatial_merge_size, self)  # what patch_embed reads
        return original(self, x, grid_thw, *args, **kwargs)

    forward._medvqa_trace = True
    cls.forward = forward


HOOKS: tuple[Patch, ...] = (
    Patch("vision_trace_hf", "transformers.models.qwen2_vl.modeling_qwen2_vl",
          "transformers Qwen2VisionTransformerPretrainedModel.forward (verl's actor and reference)",
          "records which pixels the actor's vision tower read", "instrumentation, off unless " + ENV_VAR,
          _trace_hf),
    Patch("vision_trace_vllm", "vllm.model_executor.models.qwen2_vl",
          "vLLM Qwen2VisionTransformer.forward (the rollout)",
          "records which pixels the rollout's vision tower read", "instrumentation, off unless " + ENV_VAR,
          _trace_vllm),
)


def read(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every row the processes of a run wrote under ``path``."""
    from pathlib import Path

    return [json.loads(line) for p in sorted(Path(path).glob("vision.*.jsonl"))
            for line in p.read_text().splitlines() if line.strip()]


if folder() is not None:
    arm(HOOKS)

