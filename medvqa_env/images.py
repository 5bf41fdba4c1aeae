"""Loading a record's image as the 8-bit RGB picture the agent sees.

Formats: anything Pillow reads (8-bit as is; 16-bit, 32-bit and float greyscale PNG/TIFF are
windowed, never clipped), DICOM and NIfTI (the ``medical`` extra, see
:mod:`medvqa_env.medical_images`). The path may carry a fragment that picks the slice and the
window: ``ct.nii.gz#slice=40&window=40,400`` (:func:`image_ref` builds one).

A missing, truncated, corrupt, unreadable or decompression-bomb file becomes a
:class:`DatasetError` that names the record and the file (a :class:`DecodeError` when the file is
there but its pixels cannot be decoded).

Also here, because every layer above needs them: :class:`ImageCache` (decoded images by file, so
the copies of a GRPO group decode their question's image once), :func:`image_digest` (the content
hash that tool caches and the tool wire key images by) and :class:`LazyImage` (an image drawn on
first pixel access). Episode images are never modified in place -- tools make new images -- which
is what lets copies share a cached image and memoise its digest.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import threading
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from medvqa_env.errors import DatasetError, DecodeError
from medvqa_env.medical_images import (ImageOptions, Pixels, image_ref, read_medical, resolve_window, sniff_format,
                                       split_image_ref, volume_limit, window_to_uint8)

DEFAULT_MAX_PIXELS = 64_000_000  # 8000x8000; whole-slide pathology should be tiled first
EIGHT_BIT_MODES = ("1", "L", "P", "RGB", "RGBA", "RGBX", "RGBa", "LA", "La", "PA", "CMYK", "YCbCr", "LAB", "HSV")
_OBJECT_REPR = re.compile(r"<_io\.\w+ object at 0x[0-9a-fA-F]+>")

__all__ = ["DEFAULT_MAX_PIXELS", "ImageCache", "ImageOptions", "LazyImage", "decode_image", "image_digest",
           "image_file", "image_pixels", "image_ref", "load_image"]


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
    del img  # its pixels are in ``array`` now
    # 16-bit values stay integers (int16 widened so percentile arithmetic cannot wrap): the same
    # window as float64 at a quarter of the memory
    if array.dtype.kind == "u" and array.dtype.itemsize <= 2:
        pixels = array
    elif array.dtype.kind == "i" and array.dtype.itemsize <= 2:
        pixels = array.astype(np.int32)
    else:
        pixels = array.astype(np.float64)
    return to_rgb(Pixels(pixels), options, where)


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
        raise DecodeError(f"{where} is not a readable image: {message}") from None
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
            if int(np.prod(shape)) * dtype.itemsize > volume_limit(max_pixels):
                raise DatasetError(f"{where}: TIFF of shape {shape} is over {volume_limit(max_pixels) >> 20} MiB")
            array = series.asarray()
    except DatasetError:
        raise
    except Exception as e:
        raise DecodeError(f"{where} is not a readable image: {type(e).__name__}: {e}") from None
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


# ==============================================================================================
# Decoded images shared by the copies of a worker, their digests, images drawn on demand
# ==============================================================================================
def image_pixels(image: Image.Image) -> np.ndarray | None:
    """The read-only RGB array an :class:`ImageCache` keeps beside ``image`` (``None`` for any
    other image): observations and digests read it instead of copying the pixels out again."""
    return getattr(image, "_medvqa_pixels", None)


def image_digest(image: Image.Image) -> str:
    """A content hash of an image (mode, size, pixels), memoised on the image object.

    Tool caches key results by it and the tool wire names images by it (a server checks it against
    the pixels it received), so it must depend on the pixels only. The memo is an attribute of this
    object: derived images (``copy``, ``transpose``, crops) and unpickled copies compute their own.
    SHA-256 (truncated to 128 bits) is the fastest cryptographic hash in the standard library on
    CPUs with SHA extensions, ~2.5x BLAKE2b here.

    >>> a = Image.new("RGB", (4, 2), (1, 2, 3))
    >>> image_digest(a) == image_digest(a.copy()) != image_digest(Image.new("RGB", (2, 4), (1, 2, 3)))
    True
    """
    cached = getattr(image, "_medvqa_digest", None)
    if cached is not None:
        return cached
    h = hashlib.sha256(f"{image.mode}:{image.size}".encode())
    pixels = image_pixels(image)
    h.update(pixels.data if pixels is not None else image.tobytes())
    digest = h.hexdigest()[:32]
    image._medvqa_digest = digest
    return digest


class ImageCache:
    """Decoded record images by file, shared by the env copies of one worker (see
    :class:`medvqa_env.services.EnvServices`): a GRPO group's n copies, and an evaluation's K
    samples of one question, decode its image once and hash it at most once.

    Keyed by the path as written (its ``#slice=...&window=...`` fragment changes the pixels), the
    file's modification time, size and inode, and the pixel limit, so a file that changed is read
    again. Bounded by ``max_bytes`` (each entry holds the PIL image and its RGB array, ~7 bytes a
    pixel); the least recently used go first. Load errors are never cached.

    Cached images are shared, so they are never modified in place (tools make new images); their
    arrays (:func:`image_pixels`, also the env's observation) are read-only, so code that tries to
    write into one gets an error instead of changing other episodes' images.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "x.png"
    >>> Image.new("RGB", (4, 3), (9, 9, 9)).save(path)
    >>> cache = ImageCache()
    >>> cache.load(path) is cache.load(path), cache.hits, cache.misses
    (True, 1, 1)
    """

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"expected max_bytes to be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = self.misses = 0
        self._entries: OrderedDict[tuple, Image.Image] = OrderedDict()
        self._lock = threading.Lock()

    def load(self, path: str | os.PathLike, record_id: str | None = None,
             max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
        """:func:`load_image`, from the cache when the file has not changed since it was decoded."""
        try:
            st = os.stat(image_file(path))
        except (OSError, ValueError):  # load_image names the record and the file in its error
            return load_image(path, record_id, max_pixels)
        key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino, max_pixels)
        with self._lock:
            image = self._entries.get(key)
            if image is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return image
            self.misses += 1
        image = load_image(path, record_id, max_pixels)
        pixels = np.asarray(image)  # backed by immutable bytes: read-only
        pixels.flags.writeable = False
        image._medvqa_pixels = pixels
        size = _entry_bytes(image)
        if size > self.max_bytes:
            return image
        with self._lock:
            if key not in self._entries:
                self._entries[key] = image
                self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self.nbytes -= _entry_bytes(old)
        return image

    def __len__(self) -> int:
        return len(self._entries)

    def __getstate__(self) -> dict[str, Any]:  # locks do not pickle; a copy starts empty
        return {"max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        ImageCache.__init__(self, state["max_bytes"])


def _entry_bytes(image: Image.Image) -> int:
    return image.size[0] * image.size[1] * 7  # PIL keeps 4 bytes a pixel, the array 3


class LazyImage(Image.Image):
    """A PIL image whose pixels come from ``draw()`` on first access (any method that reads them).

    Size and mode are known without drawing; ``draw`` runs at most once and must return an image
    of that size and mode. Copies, crops and pickles are ordinary images. Tools return their
    overlays this way and the tool wire redraws them this way, so nobody draws an overlay that no
    one reads.

    >>> calls = []
    >>> lazy = LazyImage(lambda: calls.append(1) or Image.new("RGB", (4, 2), (9, 8, 7)), (4, 2))
    >>> lazy.size, lazy.mode, calls
    ((4, 2), 'RGB', [])
    >>> lazy.getpixel((0, 0)), lazy.tobytes() == Image.new("RGB", (4, 2), (9, 8, 7)).tobytes(), calls
    ((9, 8, 7), True, [1])
    """

    def __init__(self, draw: Callable[[], Image.Image], size: tuple[int, int], mode: str = "RGB") -> None:
        super().__init__()
        self._size = (int(size[0]), int(size[1]))
        self._mode = mode
        self._draw = draw
        self._draw_lock = threading.Lock()

    @property
    def drawn(self) -> bool:
        return self._im is not None

    def expire(self, reason: str) -> None:
        """If the pixels were never drawn, drawing them from now on raises ``RuntimeError(reason)``
        (their source is gone: e.g. shared memory that another episode reuses)."""
        with self._draw_lock:
            if self._im is None:
                def gone() -> Image.Image:
                    raise RuntimeError(reason)

                self._draw = gone

    @property
    def im(self):
        if self._im is None:
            with self._draw_lock:
                if self._im is None:
                    image = self._draw()
                    if image.size != self._size or image.mode != self._mode:
                        raise ValueError(f"expected a drawn {self._mode} image of {self._size}, "
                                         f"got {image.mode} {image.size}")
                    image.load()
                    self._im, self._draw = image.im, None
        return super().im

    @im.setter
    def im(self, value) -> None:
        self._im = value

    def load(self):
        self.im  # noqa: B018  (draw now)
        return super().load()

    def __eq__(self, other: object) -> bool:  # Image.__eq__ demands the same class
        if not isinstance(other, Image.Image):
            return False
        return (self.mode, self.size, self.tobytes()) == (other.mode, other.size, other.tobytes())

    __hash__ = None  # type: ignore[assignment]  (as for any PIL image)

    def __getstate__(self):
        self.load()
        return super().__getstate__()

    def __setstate__(self, state) -> None:
        self._draw, self._draw_lock = None, threading.Lock()
        super().__setstate__(state)
