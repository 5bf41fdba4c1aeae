"""Loading a record's image as the 8-bit RGB picture the agent sees.

Formats: anything Pillow reads (8-bit as is; 16-bit, 32-bit and float greyscale PNG/TIFF are
windowed, never clipped), DICOM and NIfTI (the ``medical`` extra, see
:mod:`medvqa_env.medical_images`). The path may carry a fragment that picks the slice and the
window: ``ct.nii.gz#slice=40&window=40,400`` (:func:`image_ref` builds one).

A missing, truncated, corrupt, unreadable or decompression-bomb file becomes a
:class:`DatasetError` that names the record and the file.
"""

from __future__ import annotations

import io
import os
import re
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from medvqa_env.errors import DatasetError
from medvqa_env.medical_images import (MAX_VOLUME_BYTES, ImageOptions, Pixels, image_ref, read_medical, resolve_window,
                                       sniff_format, split_image_ref, window_to_uint8)

DEFAULT_MAX_PIXELS = 64_000_000  # 8000x8000; whole-slide pathology should be tiled first
EIGHT_BIT_MODES = ("1", "L", "P", "RGB", "RGBA", "RGBX", "RGBa", "LA", "La", "PA", "CMYK", "YCbCr", "LAB", "HSV")
_OBJECT_REPR = re.compile(r"<_io\.\w+ object at 0x[0-9a-fA-F]+>")

__all__ = ["DEFAULT_MAX_PIXELS", "ImageOptions", "decode_image", "image_file", "image_ref", "load_image"]


def image_file(path: str | os.PathLike) -> str:
    """The file part of an image path that may carry a ``#slice=...`` fragment.

    >>> image_file("scans/ct.nii.gz#slice=4")
    'scans/ct.nii.gz'
    """
    try:
        return split_image_ref(path)[0]
    except ValueError:
        return str(path).rpartition("#")[0]


def load_image(path: str | os.PathLike, record_id: str | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Open ``path`` (optionally ``path#options``) as an RGB image, fully decoded (so a truncated
    file fails here, not later)."""
    where = f"record {record_id!r}: image {str(path)!r}" if record_id else f"image {str(path)!r}"
    try:
        file, options = split_image_ref(path)
    except ValueError as e:
        raise DatasetError(f"{where}: {e}") from None
    p = Path(file)
    if p.is_dir():
        raise DatasetError(f"{where} is a directory, not an image file")
    if not p.is_file():
        raise DatasetError(f"{where} does not exist")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise DatasetError(f"{where} cannot be read: {e}") from None
    return decode_image(data, where, max_pixels, options=options, name=p.name)


def decode_image(data: bytes, where: str = "image", max_pixels: int = DEFAULT_MAX_PIXELS,
                 options: ImageOptions | None = None, name: str = "") -> Image.Image:
    """Decode encoded bytes to RGB, refusing bombs (> ``max_pixels``) and truncated data.

    ``options`` picks the slice / frame and the window (see :class:`ImageOptions`); ``name`` (the
    file name) helps recognise DICOMs without a preamble and NIfTIs.
    """
    options = options or ImageOptions()
    kind = sniff_format(data, name)
    if kind != "other":
        return to_rgb(read_medical(kind, data, options, where, max_pixels), options, where)
    img = _open_with_pillow(data, where, max_pixels, options)
    if isinstance(img, Pixels):
        return to_rgb(img, options, where)
    if img.mode in EIGHT_BIT_MODES:
        if options.window is not None and img.mode not in ("L", "1", "P"):
            raise DatasetError(f"{where}: a window applies to greyscale images; this one is {img.mode}")
        if options.window is not None:
            return to_rgb(Pixels(np.asarray(img.convert("L"), dtype=np.float64)), options, where)
        rgb = img if img.mode == "RGB" else img.convert("RGB")
        return ImageOps.invert(rgb) if options.invert else rgb
    try:  # I;16*, I (32-bit), F (float): keep the values, window them
        array = np.asarray(img)
    except (TypeError, ValueError) as e:
        raise DatasetError(f"{where} has pixel mode {img.mode!r}, which cannot be read as numbers: {e}") from None
    if array.ndim != 2:
        raise DatasetError(f"{where} has pixel mode {img.mode!r} with shape {array.shape}; expected greyscale")
    return to_rgb(Pixels(array.astype(np.float64)), options, where)


def to_rgb(pixels: Pixels, options: ImageOptions, where: str = "image") -> Image.Image:
    """Window a greyscale array (colour passes through), apply inversion, return RGB."""
    array = pixels.array
    if array.ndim == 3:
        if options.window is not None:
            raise DatasetError(f"{where}: a window applies to greyscale images; this one is colour")
        out = np.ascontiguousarray(array[..., :3]).astype(np.uint8)
    else:
        low, high = resolve_window(array, options.window, pixels.window)
        grey = window_to_uint8(array, low, high)
        out = np.repeat(grey[..., None], 3, axis=2)
    invert = pixels.invert if options.invert is None else options.invert
    if invert:
        out = 255 - out
    return Image.fromarray(out, "RGB")


def _open_with_pillow(data: bytes, where: str, max_pixels: int, options: ImageOptions) -> Image.Image | Pixels:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            frames = int(getattr(img, "n_frames", 1) or 1)
            if options.slice is not None or frames > 1:
                index = options.slice if options.slice is not None else 0
                if not -frames <= index < frames:
                    raise DatasetError(f"{where}: slice {index} is out of range: the file has slices 0..{frames - 1}")
                img.seek(index % frames)
            w, h = img.size
            if w * h > max_pixels:
                raise DatasetError(f"{where} has {w}x{h} pixels, over the limit of {max_pixels}")
            img.load()
    except DatasetError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise DatasetError(f"{where} is over the limit of {max_pixels} pixels (a decompression bomb?)") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as e:
        if data[:4] in (b"II*\x00", b"MM\x00*"):  # a TIFF Pillow cannot read (e.g. an ImageJ stack)
            return _open_tiff_stack(data, where, max_pixels, options)
        if isinstance(e, UnidentifiedImageError):
            message = "not a format Pillow, pydicom or nibabel recognise"
        else:
            message = _OBJECT_REPR.sub("the data", str(e)) or type(e).__name__
        raise DatasetError(f"{where} is not a readable image: {message}") from None
    return img


def _open_tiff_stack(data: bytes, where: str, max_pixels: int, options: ImageOptions) -> Pixels:
    """Fallback for TIFFs Pillow refuses, through ``tifffile`` (installed with scikit-image)."""
    try:
        import tifffile
    except ImportError:
        raise DatasetError(f"{where} is a TIFF Pillow cannot read; pip install tifffile to read it") from None
    try:
        with tifffile.TiffFile(io.BytesIO(data)) as tif:
            series = tif.series[0]
            shape, dtype = tuple(series.shape), np.dtype(series.dtype)
            colour = len(shape) == 3 and shape[-1] in (3, 4) and dtype == np.uint8
            plane = shape[-3:-1] if colour else shape[-2:]
            if len(plane) != 2 or int(np.prod(plane)) > max_pixels:
                raise DatasetError(f"{where}: TIFF of shape {shape}: not one image of at most {max_pixels} pixels")
            if int(np.prod(shape)) * dtype.itemsize > MAX_VOLUME_BYTES:
                raise DatasetError(f"{where}: TIFF of shape {shape} is over {MAX_VOLUME_BYTES >> 20} MiB")
            array = series.asarray()
    except DatasetError:
        raise
    except Exception as e:
        raise DatasetError(f"{where} is not a readable image: {type(e).__name__}: {e}") from None
    if colour:
        array = array.reshape((-1,) + array.shape[-3:])
    else:
        array = array.reshape((-1,) + array.shape[-2:])
    frames = array.shape[0]
    index = options.slice if options.slice is not None else 0
    if not -frames <= index < frames:
        raise DatasetError(f"{where}: slice {index} is out of range: the file has slices 0..{frames - 1}")
    array = array[index]
    return Pixels(array[..., :3] if colour else array.astype(np.float64))
