"""Medical image formats -> the 2-D pixel array a record's image shows, before windowing.

DICOM (pydicom: rescale slope/intercept, the file's window, MONOCHROME1, multi-frame) and NIfTI
(nibabel: one slice of a volume, in a fixed orientation), imported lazily from the ``medical``
extra. :mod:`medvqa_env.images` turns the array into the 8-bit RGB picture the agent sees with
:func:`window_to_uint8`.

A record says which slice and which window through a fragment on its image path::

    ct/case3.dcm#window=40,400          mr/brain.nii.gz#slice=80&axis=coronal
    xr/chest16.png#window=auto          stack.tif#slice=2&invert=1

>>> split_image_ref("mr/brain.nii.gz#slice=80&axis=coronal&window=40,400")
('mr/brain.nii.gz', ImageOptions(slice=80, axis=1, volume=0, window=(40.0, 400.0), invert=None))
>>> image_ref("ct.dcm", window=(40, 400))
'ct.dcm#window=40,400'
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import io
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medvqa_env.errors import DatasetError, DecodeError

MAX_VOLUME_BYTES = 1 << 30
"""A DICOM's, NIfTI's or TIFF stack's decoded pixels may take at most this much memory (1 GiB);
lower with a lower pixel limit (:func:`volume_limit`)."""
VOLUME_PIXELS = 64_000_000
"""The pixel limit at which a file may take all of :data:`MAX_VOLUME_BYTES` (the default one)."""


def volume_limit(max_pixels: int) -> int:
    """The most bytes one DICOM, NIfTI or TIFF stack may decode (or decompress) to: 1 GiB at the
    default pixel limit, proportionally less under a lower one (~17 bytes a pixel of the limit),
    checked from the file's header before anything is decompressed.

    >>> volume_limit(64_000_000) == MAX_VOLUME_BYTES, volume_limit(4_000_000) >> 20
    (True, 64)
    """
    return min(MAX_VOLUME_BYTES, MAX_VOLUME_BYTES * int(max_pixels) // VOLUME_PIXELS)

AXES = {"sagittal": 0, "coronal": 1, "axial": 2, "0": 0, "1": 1, "2": 2}
WINDOW_WORDS = ("file", "auto", "minmax")
AUTO_PERCENTILES = (0.5, 99.5)
DICOM_SUFFIXES = (".dcm", ".dicom")
NIFTI_SUFFIXES = (".nii", ".nii.gz")

Window = "tuple[float, float] | str | None"


@dataclass(frozen=True)
class ImageOptions:
    """How to turn a file into a 2-D picture; parsed from the path fragment (module docstring).

    ``slice``: NIfTI slice along ``axis`` (default the middle one), or the frame of a multi-frame
    DICOM / page of a multi-page TIFF (default 0); negative counts from the end. ``axis``: 0
    sagittal, 1 coronal, 2 axial, of the volume reoriented to the closest canonical (RAS+)
    orientation. ``volume``: the volume of a 4-D NIfTI. ``window``: ``(centre, width)`` in the
    file's rescaled units (Hounsfield for CT), ``"file"`` (the DICOM's own), ``"auto"`` (the
    0.5-99.5 percentiles) or ``"minmax"``; ``None`` is the format's default (the DICOM's own window
    when it has one, else ``"auto"``; 8-bit images are not windowed). ``invert``: ``None`` inverts
    MONOCHROME1 DICOMs only.
    """

    slice: int | None = None
    axis: int = 2
    volume: int = 0
    window: Any = None
    invert: bool | None = None


def _parse_window(value: str) -> tuple[float, float] | str:
    if value in WINDOW_WORDS:
        return value
    parts = value.split(",")
    try:
        centre, width = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"expected window=centre,width (e.g. 40,400) or one of {list(WINDOW_WORDS)}, "
                         f"got {value!r}") from None
    if not (np.isfinite(centre) and np.isfinite(width)) or width <= 0:
        raise ValueError(f"expected a finite window centre and a width > 0, got {value!r}")
    return centre, width


def parse_options(fragment: str) -> ImageOptions:
    """``"slice=3&window=40,400"`` -> :class:`ImageOptions`; a bad key or value -> ValueError."""
    fields: dict[str, Any] = {}
    for part in filter(None, fragment.split("&")):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not value:
            raise ValueError(f"expected key=value in the image path fragment, got {part!r}")
        try:
            if key in ("slice", "volume"):
                fields[key] = int(value)
            elif key == "axis":
                if value.lower() not in AXES:
                    raise ValueError(f"expected axis in {sorted(k for k in AXES if not k.isdigit())} or 0/1/2, "
                                     f"got {value!r}")
                fields[key] = AXES[value.lower()]
            elif key == "window":
                fields[key] = _parse_window(value.lower())
            elif key == "invert":
                if value.lower() not in ("0", "1", "true", "false"):
                    raise ValueError(f"expected invert=1 or invert=0, got {value!r}")
                fields[key] = value.lower() in ("1", "true")
            else:
                raise ValueError(f"unknown image option {key!r}; known: ['axis', 'invert', 'slice', 'volume', "
                                 "'window']")
        except ValueError as e:
            if "invalid literal" in str(e):
                raise ValueError(f"expected an integer for {key}, got {value!r}") from None
            raise
    if fields.get("volume", 0) < 0:
        raise ValueError(f"expected volume >= 0, got {fields['volume']}")
    return ImageOptions(**fields)


def split_image_ref(path: str | Path) -> tuple[str, ImageOptions]:
    """``"file#key=value&..."`` -> (file, options). A path that names an existing file as a whole
    is never split, so a ``#`` inside a real file name still works."""
    text = str(path)
    if "#" not in text or Path(text).exists():
        return text, ImageOptions()
    file, _, fragment = text.rpartition("#")
    return file, parse_options(fragment)


def image_ref(path: str | Path, *, slice: int | None = None, axis: str | int | None = None,
              volume: int | None = None, window: tuple[float, float] | str | None = None,
              invert: bool | None = None) -> str:
    """Build the path-with-fragment a record stores (the inverse of :func:`split_image_ref`)."""
    parts = []
    if slice is not None:
        parts.append(f"slice={int(slice)}")
    if axis is not None:
        parts.append(f"axis={axis}")
    if volume is not None:
        parts.append(f"volume={int(volume)}")
    if window is not None:
        parts.append("window=" + (window if isinstance(window, str) else f"{window[0]:g},{window[1]:g}"))
    if invert is not None:
        parts.append(f"invert={int(bool(invert))}")
    ref = str(path) + ("#" + "&".join(parts) if parts else "")
    split_image_ref(ref)  # validates
    return ref


# ----------------------------------------------------------------------------------------------
# Format detection and the optional packages.
# ----------------------------------------------------------------------------------------------
def sniff_format(data: bytes, name: str = "") -> str:
    """``"dicom"``, ``"nifti"`` or ``"other"`` (left to Pillow), from magic bytes or the name."""
    lower = name.lower()
    if data[128:132] == b"DICM" or lower.endswith(DICOM_SUFFIXES):
        return "dicom"
    if lower.endswith(NIFTI_SUFFIXES) or _nifti_magic(data):
        return "nifti"
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                head = f.read(548)
        except (OSError, EOFError):
            return "other"
        if _nifti_magic(head):
            return "nifti"
    return "other"


def _nifti_magic(head: bytes) -> bool:
    return head[344:348] in (b"n+1\x00", b"ni1\x00") or head[4:8] == b"n+2\x00"


def _optional(module: str, where: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DatasetError(f"{where} needs the {module!r} package to be read: "
                           "pip install 'medvqa-gym[medical]'") from None


def _pick(index: int | None, n: int, default: int, what: str, where: str) -> int:
    i = default if index is None else index
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise DatasetError(f"{where}: {what} {index} is out of range: the file has {what}s 0..{n - 1}")
    return i


# ----------------------------------------------------------------------------------------------
# DICOM
# ----------------------------------------------------------------------------------------------
@dataclass
class Pixels:
    """A decoded picture before windowing: ``array`` is 2-D (greyscale, the file's units after the
    rescale) or HxWx3 ``uint8`` (colour); ``window`` the file's own; ``invert`` MONOCHROME1."""

    array: np.ndarray
    window: tuple[float, float] | None = None
    invert: bool = False


def _first_number(value) -> float | None:
    if value is None or value == "":
        return None
    try:
        if not isinstance(value, (int, float, str)) and hasattr(value, "__len__"):
            value = value[0]
        return float(value)
    except (TypeError, ValueError, IndexError):
        return None


def read_dicom(data: bytes, options: ImageOptions, where: str, max_pixels: int) -> Pixels:
    """One frame of a DICOM: modality rescale (slope/intercept), the file's window, MONOCHROME1."""
    pydicom = _optional("pydicom", where)
    try:
        # garbage read with force=True warns per unknown element; a truncated file warns (and logs)
        # "End of file reached before delimiter": kept for the reason, not printed
        with warnings.catch_warnings(record=True) as caught, _quiet_logger("pydicom"):
            warnings.simplefilter("always")
            ds = pydicom.dcmread(io.BytesIO(data), force=True)
        truncated = next((" ".join(str(w.message).split()) for w in caught
                          if "end of file" in str(w.message).lower()), None)
        if data[128:132] != b"DICM" and not any(pydicom.datadict.dictionary_has_tag(t) for t in ds.keys()):
            raise DatasetError(f"{where} is not a DICOM file: no 'DICM' marker at byte 128 and no DICOM data "
                               f"element in it (it starts {data[:24]!r})")
        has_pixels = any(tag in ds for tag in ("PixelData", "FloatPixelData", "DoubleFloatPixelData"))
        rows, cols = (int(ds.Rows), int(ds.Columns)) if has_pixels else (0, 0)
    except DatasetError:
        raise
    except Exception as e:  # pydicom raises many types on garbage
        raise DecodeError(f"{where} is not a readable DICOM image: {type(e).__name__}: {e}") from None
    cut = truncated or _cut_short(ds, data, has_pixels)
    if cut or (not has_pixels and "Rows" in ds and "Columns" in ds):  # a header, its pixels gone
        raise DecodeError(f"{where} is a truncated DICOM (transfer syntax {_syntax_name(ds)}): the file ends "
                          f"at byte {len(data)} " + (f"before its pixel data ends (pydicom: {cut.replace(' in file <no filename>', '')})"
                                                     if truncated else cut or "before its pixel data"))
    if not has_pixels or not rows or not cols:
        raise DecodeError(f"{where} is a DICOM without an image (modality {ds.get('Modality')!r}, no pixel data)")
    frames = int(_first_number(ds.get("NumberOfFrames", 1)) or 1)
    samples = int(ds.get("SamplesPerPixel", 1) or 1)
    if rows * cols > max_pixels:
        raise DatasetError(f"{where} has {cols}x{rows} pixels, over the limit of {max_pixels}")
    if frames * rows * cols * samples * 8 > volume_limit(max_pixels):
        raise DatasetError(f"{where} holds {frames} frames of {cols}x{rows}: over the {volume_limit(max_pixels) >> 20} "
                           "MiB limit for one file")
    frame = _pick(options.slice, frames, 0, "frame", where)
    arr = _decode_pixels(ds, data, where)
    if frames > 1:
        arr = arr[frame]
    photometric = str(ds.get("PhotometricInterpretation", "MONOCHROME2")).upper()
    if photometric == "PALETTE COLOR":
        arr = _apply_palette(pydicom, arr, ds, where)
    if samples == 3 or arr.ndim == 3:
        if arr.dtype != np.uint8:
            bits = int(ds.get("BitsStored", 8) or 8)
            arr = np.clip(arr.astype(np.float64) / (2 ** bits - 1) * 255, 0, 255).round().astype(np.uint8)
        return Pixels(arr)
    slope = _first_number(ds.get("RescaleSlope"))
    intercept = _first_number(ds.get("RescaleIntercept"))
    out = arr.astype(np.float64)
    if slope is not None and slope != 0:
        out *= slope
    if intercept:
        out += intercept
    centre, width = _first_number(ds.get("WindowCenter")), _first_number(ds.get("WindowWidth"))
    window = (centre, width) if centre is not None and width is not None and width > 0 else None
    return Pixels(out, window=window, invert=photometric == "MONOCHROME1")


def _cut_short(ds, data: bytes, has_pixels: bool) -> str | None:
    """Where a DICOM pydicom read without complaint was cut off, or ``None``: inside the file meta
    header (it declares its length), inside an element (its value runs past the end), or part-way
    into the header of an element after the last one read (bytes left that are no element)."""
    n = len(data)
    if data[128:132] == b"DICM":
        declared = _first_number(getattr(ds, "file_meta", {}).get("FileMetaInformationGroupLength"))
        if n < 144 or (declared is not None and n < 144 + int(declared)):
            return ("before its file meta header ends" + (f" (it declares {int(declared)} bytes)" if declared else "")
                    + ", long before its pixel data")
    end = None
    for tag in ds.keys():
        try:
            elem = ds.get_item(tag)
        except Exception:  # noqa: BLE001 -- an element pydicom cannot even look at: not a cut
            continue
        tell, length = getattr(elem, "value_tell", None), getattr(elem, "length", None)
        if tell is None or length is None or length == 0xFFFFFFFF:
            continue
        if tell + length > n:
            what = "its pixel data" if int(tag) in (0x7FE00010, 0x7FE00008, 0x7FE00009) else f"element {tag}"
            return f"inside {what}, which declares {length} bytes from byte {tell}"
        end = max(end or 0, tell + length)
    if not has_pixels and end is not None and 0 < n - end < 12:  # a cut element header: 8 or 12 bytes
        return f"in the header of the element after {max(ds.keys())}, before its pixel data"
    return None


def dicom_decoders() -> dict[str, tuple[str, ...]]:
    """Each compressed transfer syntax pydicom knows -> the decoder plugins installed for it here
    (empty: no decoder, such a DICOM cannot be read). Uncompressed syntaxes need no plugin.

    >>> "JPEG 2000 Image Compression (Lossless Only)" in dicom_decoders()
    True
    """
    from pydicom import uid
    from pydicom.pixels import get_decoder

    out = {}
    for syntax in (s for s in uid.AllTransferSyntaxes if s.is_compressed):
        try:
            out[syntax.name] = tuple(get_decoder(syntax).available_plugins)
        except NotImplementedError:  # pydicom has no decoder interface at all (MPEG, ...)
            out[syntax.name] = ()
    return out


def _syntax_name(ds) -> str:
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    return f"{getattr(syntax, 'name', syntax)!r} ({syntax})" if syntax else "unknown (no file meta)"


def _plugins(ds) -> tuple[list[str], list[str]]:
    """The decoder plugins for a DICOM's transfer syntax: ``(in this process, contained)``, each in
    pydicom's order. Plugins that can abort the process (GDCM:
    :data:`medvqa_env.contained_decode.ABORTING_PLUGINS`) are only ever run contained, after the
    in-process ones (Pillow for JPEG, pylibjpeg-openjpeg for JPEG 2000) failed or where they are the
    only ones installed. Uncompressed data: ``([""], [])``, pydicom's own decoder."""
    from medvqa_env.contained_decode import ABORTING_PLUGINS

    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    if syntax is None or not getattr(syntax, "is_compressed", False):
        return [""], []
    available = list(dicom_decoders().get(syntax.name, ()))
    return ([p for p in available if p not in ABORTING_PLUGINS], [p for p in available if p in ABORTING_PLUGINS])


def _decode_pixels(ds, data: bytes, where: str) -> np.ndarray:
    """``ds.pixel_array``, no decoder able to take the process down and none printing: in-process
    plugins first, then the aborting ones in a child process (:mod:`medvqa_env.contained_decode`,
    whose stderr is its own). Nothing here redirects this process's stderr, so other threads'
    output is never lost. A failure is one :class:`DecodeError` line naming the file, the transfer
    syntax and each decoder's reason (what the decoder printed, and how a child died, included)."""
    from medvqa_env.contained_decode import DecodeFailed, shared_decoder

    in_process, contained = _plugins(ds)
    failures: list[str] = []
    for plugin in in_process:
        with _quiet_logger("pydicom"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if plugin:
                    ds.pixel_array_options(decoding_plugin=plugin)
                return np.asarray(ds.pixel_array)
            except Exception as e:  # noqa: BLE001 -- every decoder failure becomes the file's reason
                failures.append(_reason(e, plugin, []))
    for plugin in contained:
        try:
            return shared_decoder().decode(data, plugin)
        except DecodeFailed as e:
            failures.append(_reason(e.error if e.raised else e, plugin if e.raised else "", [e.said]))
    raise DecodeError(_undecodable(ds, where, "; ".join(failures)))


def _reason(error: Exception, plugin: str, said: list[str]) -> str:
    """One decoder failure as text: pydicom's "exceptions were raised by all available plugins"
    list flattened, GDCM's empty buffer named for what it is, the decoder's own output appended
    (a contained decoder's death, :class:`medvqa_env.contained_decode.DecodeFailed`, as it says)."""
    from medvqa_env.contained_decode import DecodeFailed

    text = str(error)
    lines = [line.strip() for line in text.splitlines()]
    if lines and lines[0].startswith("Unable to decode as exceptions were raised by all available plugins"):
        parts = [line for line in lines[1:] if line]
    elif isinstance(error, DecodeFailed):
        parts = [" ".join(lines)]
    else:
        kind = getattr(error, "kind", type(error).__name__)  # a contained decoder's exception keeps its type's name
        parts = [f"{plugin + ': ' if plugin else ''}{kind}: {' '.join(lines)}"]
    # pydicom's GDCM plugin calls .encode() on the frame GDCM returns: None when GDCM could not decode it
    parts = [p.replace("'NoneType' object has no attribute 'encode'", "the decoder returned no pixels (corrupt or "
                       "unsupported data)") for p in parts]
    parts = [re.sub(r"\s*<_io\.\w+ object at 0x[0-9a-f]+>", "", p) for p in parts]  # Pillow names its buffer
    noise = " ".join(" ".join(said).split())
    if noise:
        parts.append(f"decoder output: {noise[:300]}")
    return "; ".join(parts)


@contextlib.contextmanager
def _quiet_logger(name: str):
    """Silence logger ``name`` and its children (pydicom logs a traceback per failing decoder plugin)."""
    import logging

    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _undecodable(ds, where: str, reason: str) -> str:
    """Why a DICOM's pixel data did not decode, naming the file and its transfer syntax."""
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    name = _syntax_name(ds)
    if syntax is not None and getattr(syntax, "is_compressed", False) and not dicom_decoders().get(syntax.name):
        return (f"{where}: cannot decode its pixel data: transfer syntax {name} has no decoder installed "
                f"(the medical extra decodes JPEG, JPEG-LS, JPEG 2000, HTJ2K and RLE; see docs/datasets.md)")
    if "12-bit precision" in reason:  # pydicom's Pillow and GDCM plugins both refuse it
        reason += ("; a 12-bit JPEG Extended image has no decoder in the medical extra (pylibjpeg-libjpeg, GPLv3, "
                   "would decode it; see docs/datasets.md)")
    return f"{where}: cannot decode its pixel data (transfer syntax {name}): {reason}"


def _apply_palette(pydicom, arr: np.ndarray, ds, where: str) -> np.ndarray:
    try:
        try:
            from pydicom.pixels import apply_color_lut
        except ImportError:  # pydicom < 3
            from pydicom.pixel_data_handlers.util import apply_color_lut
        rgb = np.asarray(apply_color_lut(arr, ds))
    except Exception as e:
        raise DatasetError(f"{where}: cannot apply its colour palette: {type(e).__name__}: {e}") from None
    top = 65535.0 if rgb.dtype.itemsize > 1 else 255.0
    return np.clip(rgb.astype(np.float64) / top * 255, 0, 255).round().astype(np.uint8)


# ----------------------------------------------------------------------------------------------
# NIfTI
# ----------------------------------------------------------------------------------------------
def nifti_declared_bytes(head: bytes) -> tuple[int, int] | None:
    """``(bytes up to the end of the voxels, voxels)`` a NIfTI-1/2 header declares, read from its
    first 540 bytes without nibabel; ``None`` if ``head`` is no NIfTI header.

    >>> import struct
    >>> h = bytearray(348); h[0:4] = struct.pack("<i", 348); h[344:348] = b"n+1" + bytes(1)
    >>> h[40:56] = struct.pack("<8h", 3, 100, 100, 50, 1, 1, 1, 1); h[72:74] = struct.pack("<h", 16)
    >>> h[108:112] = struct.pack("<f", 352.0)
    >>> nifti_declared_bytes(bytes(h))
    (1000352, 500000)
    """
    for order in "<>":
        size = np.frombuffer(head[:4], dtype=order + "i4")[0] if len(head) >= 4 else 0
        if size == 348 and len(head) >= 112:
            dims = np.frombuffer(head[40:56], dtype=order + "i2").astype(np.int64)
            bitpix = int(np.frombuffer(head[72:74], dtype=order + "i2")[0])
            offset = float(np.frombuffer(head[108:112], dtype=order + "f4")[0])
        elif size == 540 and len(head) >= 176:
            dims = np.frombuffer(head[16:80], dtype=order + "i8")
            bitpix = int(np.frombuffer(head[14:16], dtype=order + "i2")[0])
            offset = float(np.frombuffer(head[168:176], dtype=order + "i8")[0])
        else:
            continue
        ndim = int(dims[0])
        if not 1 <= ndim <= 7 or not np.isfinite(offset):
            return None
        voxels = 1
        for d in dims[1:ndim + 1]:
            voxels *= max(int(d), 1)
        return max(int(offset), 0) + voxels * max(bitpix, 8) // 8, voxels
    return None


def _gunzip(data: bytes, where: str, limit: int = MAX_VOLUME_BYTES) -> bytes:
    """Decompress a ``.nii.gz``: the header first, and the rest only if what it declares fits
    ``limit`` (a small file that would unzip to gigabytes is refused before it is unzipped);
    never more than it declares."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            head = f.read(540)
            declared = nifti_declared_bytes(head)
            if declared is not None:
                total, voxels = declared
                if max(total, voxels * 4) > limit:
                    raise DatasetError(f"{where} declares {total >> 20} MiB of voxels ({voxels} voxels), over the "
                                       f"{limit >> 20} MiB limit for one file: refused before decompressing it")
                raw = head + f.read(max(total - len(head), 0))
            else:
                raw = head + f.read(limit + 1 - len(head))
    except DatasetError:
        raise
    except (OSError, EOFError, ValueError) as e:
        raise DecodeError(f"{where} is not a readable gzip-compressed NIfTI: {e}") from None
    if len(raw) > limit:
        raise DatasetError(f"{where} decompresses to over {limit >> 20} MiB")
    return raw


@contextlib.contextmanager
def _quiet(logger):
    disabled = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = disabled


def read_nifti(data: bytes, options: ImageOptions, where: str, max_pixels: int) -> Pixels:
    """One slice of a NIfTI volume, shown in radiological convention: the volume is reoriented to
    RAS+ and the slice drawn with anterior / superior up and the patient's right on the left."""
    nib = _optional("nibabel", where)
    limit = volume_limit(max_pixels)
    raw = _gunzip(data, where, limit) if data[:2] == b"\x1f\x8b" else data
    kind = nib.Nifti2Image if raw[4:8] == b"n+2\x00" else nib.Nifti1Image
    try:
        with _quiet(nib.imageglobals.logger):  # nibabel logs header complaints to stderr
            img = kind.from_bytes(raw)
        shape = tuple(int(s) for s in img.shape)
        ornt = nib.orientations.io_orientation(img.affine)
    except Exception as e:
        raise DecodeError(f"{where} is not a readable NIfTI image: {type(e).__name__}: {e}") from None
    while len(shape) > 4 and shape[-1] == 1:
        shape = shape[:-1]
    if not 2 <= len(shape) <= 4:
        raise DatasetError(f"{where} has shape {shape}; expected a 2-D image, a 3-D volume or a 4-D series")
    itemsize = np.dtype(img.header.get_data_dtype()).itemsize
    if int(np.prod(shape)) * max(itemsize, 4) > limit:
        raise DatasetError(f"{where} has shape {shape}: over the {limit >> 20} MiB limit for one file")
    shape3 = (shape + (1, 1))[:3]
    # the stored axis that runs along the asked canonical axis; a single-slice image is its own slice
    source_axis = 2 if shape3[2] == 1 else int(np.nonzero(ornt[:, 0] == options.axis)[0][0])
    n = shape3[source_axis]
    chosen = _pick(options.slice, n, n // 2, "slice", where)
    index: list[Any] = [slice(None)] * 3
    index[source_axis] = chosen if ornt[source_axis, 1] > 0 else n - 1 - chosen
    others = [k for k in range(3) if k != source_axis]
    if shape3[others[0]] * shape3[others[1]] > max_pixels:
        raise DatasetError(f"{where}: a slice has {shape3[others[0]]}x{shape3[others[1]]} pixels, over the limit "
                           f"of {max_pixels}")
    volume = _pick(options.volume, shape[3], 0, "volume", where) if len(shape) == 4 else None
    try:
        if len(img.shape) == 2:
            plane = np.asanyarray(img.dataobj).reshape(shape3)[tuple(index)]
        else:  # slice the proxy: only this plane is read
            full = tuple(index) + ((volume,) if volume is not None else ())
            plane = np.asanyarray(img.dataobj[full + (0,) * (len(img.shape) - len(full))])
    except Exception as e:
        raise DecodeError(f"{where}: cannot read its voxel data: {type(e).__name__}: {e}") from None
    plane = np.asarray(plane, dtype=np.float64)
    for position, k in enumerate(others):  # make each remaining axis run the canonical way
        if ornt[k, 1] < 0:
            plane = np.flip(plane, position)
    if ornt[others[0], 0] > ornt[others[1], 0]:
        plane = plane.T
    return Pixels(np.ascontiguousarray(plane.T[::-1, ::-1]))


def read_medical(kind: str, data: bytes, options: ImageOptions, where: str, max_pixels: int) -> Pixels:
    """Dispatch to :func:`read_dicom` or :func:`read_nifti`."""
    reader = read_dicom if kind == "dicom" else read_nifti
    return reader(data, options, where, max_pixels)


# ----------------------------------------------------------------------------------------------
# Windowing
# ----------------------------------------------------------------------------------------------
def resolve_window(array: np.ndarray, window: Any, file_window: tuple[float, float] | None) -> tuple[float, float]:
    """The (low, high) values that map to black and white.

    >>> resolve_window(np.arange(11.0), (5, 4), None)
    (3.0, 7.0)
    >>> resolve_window(np.arange(11.0), "minmax", None)
    (0.0, 10.0)
    """
    # integers are finite: no masked copy (a 64 M-pixel 16-bit image would copy 512 MB of float64)
    finite = array if array.dtype.kind in "iub" else array[np.isfinite(array)]
    if window is None:
        window = file_window if file_window is not None else "auto"
    if window == "file":
        window = file_window if file_window is not None else "auto"
    if isinstance(window, tuple):
        centre, width = window
        return centre - width / 2, centre + width / 2
    if finite.size == 0:
        return 0.0, 1.0
    if window == "minmax":
        return float(finite.min()), float(finite.max())
    lo, hi = (float(v) for v in np.percentile(finite, AUTO_PERCENTILES))
    if hi <= lo:
        lo, hi = float(finite.min()), float(finite.max())
    return lo, hi


def window_to_uint8(array: np.ndarray, low: float, high: float) -> np.ndarray:
    """Map ``[low, high]`` linearly to 0..255, clipping outside; non-finite values become 0.

    >>> window_to_uint8(np.array([-10.0, 0.0, 5.0, 10.0, 99.0, np.nan]), 0.0, 10.0).tolist()
    [0, 0, 128, 255, 255, 0]
    """
    array = np.asarray(array)
    if array.ndim == 0 or array.size <= _WINDOW_CHUNK:
        return _window_chunk(array, low, high)
    out = np.empty(array.shape, dtype=np.uint8)  # in row chunks: float64 temporaries of ~8 MB, not 8 bytes a pixel
    rows = max(1, _WINDOW_CHUNK // max(1, array[0].size))
    for start in range(0, array.shape[0], rows):
        out[start:start + rows] = _window_chunk(array[start:start + rows], low, high)
    return out


_WINDOW_CHUNK = 1 << 20


def _window_chunk(array: np.ndarray, low: float, high: float) -> np.ndarray:
    a = np.asarray(array, dtype=np.float64)
    if high <= low:
        out = np.where(a > low, 255.0, 0.0)
    else:
        out = (a - low) * (255.0 / (high - low))
    out = np.where(np.isfinite(out), out, 0.0)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)
