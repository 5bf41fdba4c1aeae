"""Loading images safely: a missing, truncated, corrupt or decompression-bomb file becomes a
:class:`DatasetError` that names the record and the file."""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from medvqa_env.errors import DatasetError

DEFAULT_MAX_PIXELS = 64_000_000  # 8000x8000; whole-slide pathology should be tiled first


def load_image(path: str | os.PathLike, record_id: str | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Open ``path`` as an RGB image, fully decoded (so a truncated file fails here, not later)."""
    where = f"record {record_id!r}: image {str(path)!r}" if record_id else f"image {str(path)!r}"
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"{where} does not exist")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise DatasetError(f"{where} cannot be read: {e}") from None
    return decode_image(data, where, max_pixels)


def decode_image(data: bytes, where: str = "image", max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Decode encoded bytes to RGB, refusing bombs (> ``max_pixels``) and truncated data."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            w, h = img.size
            if w * h > max_pixels:
                raise DatasetError(f"{where} has {w}x{h} pixels, over the limit of {max_pixels}")
            img.load()
    except DatasetError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DatasetError(f"{where} is over the limit of {max_pixels} pixels (decompression bomb?): {e}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise DatasetError(f"{where} is not a readable image: {e}") from None
    if img.mode != "RGB":
        img = img.convert("RGB")
    return img
