"""Where a model runs and in what precision, spelt as on the command line.

>>> resolve_dtype("bf16"), resolve_device("auto", cuda_available=False)
(torch.bfloat16, 'cpu')
"""

from __future__ import annotations

import torch

from medvqa_env.errors import ConfigError, unknown_name_message

__all__ = ["DTYPES", "resolve_device", "resolve_dtype"]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """``"bfloat16"`` / ``"bf16"`` / ``torch.bfloat16`` -> ``torch.bfloat16`` (``None``: float32).

    >>> resolve_dtype("bf16"), resolve_dtype(None)
    (torch.bfloat16, torch.float32)
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ConfigError(unknown_name_message("dtype", str(dtype), ("float32", "bfloat16", "float16")))
    return DTYPES[key]


def resolve_device(device: str | torch.device | None = "auto", cuda_available: bool | None = None) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; ``cuda``/``cuda:N`` demand one.

    >>> resolve_device("auto", cuda_available=False), resolve_device("cuda:1", cuda_available=True)
    ('cpu', 'cuda:1')
    """
    text = "auto" if device is None else str(device).strip().lower()
    has_cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if text == "auto":
        return "cuda" if has_cuda else "cpu"
    if text == "cpu":
        return "cpu"
    if text == "cuda" or text.startswith("cuda:"):
        if not has_cuda:
            raise ConfigError(f"device {text!r} asked for, but torch sees no CUDA GPU (torch {torch.__version__}; "
                              "a CPU-only build, or no GPU on this machine); use --device cpu or auto")
        return text
    if text == "mps":
        return text
    raise ConfigError(f"expected device auto, cpu, cuda or cuda:N, got {device!r}")
