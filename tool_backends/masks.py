"""Binary masks and boxes: measurements and the pictures tools send back.

The run-length encoding (COCO's uncompressed, column-major form) lives in :mod:`medvqa_env.masks`
and is re-exported here, so tools and the renderer share one format.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from PIL import Image, ImageDraw

from medvqa_env.masks import mask_to_rle, rle_to_mask  # noqa: F401  (one RLE for the project)

OVERLAY_COLOR = (255, 48, 48)
BOX_COLORS = ((255, 64, 64), (64, 200, 255), (255, 220, 0), (80, 255, 120), (255, 120, 255))


def mask_bbox(mask: np.ndarray) -> list[int] | None:
    """Tight [x0, y0, x1, y1] (exclusive ends) of the mask's pixels, ``None`` when empty.

    >>> m = np.zeros((5, 5), bool); m[1:3, 2:5] = True
    >>> mask_bbox(m)
    [2, 1, 5, 3]
    """
    ys, xs = np.nonzero(mask)
    if ys.size == 0:
        return None
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]


def count_components(mask: np.ndarray) -> int:
    """Number of 8-connected components.

    >>> m = np.zeros((4, 6), bool); m[0, 0] = m[3, 5] = m[2, 2] = m[1, 1] = True
    >>> count_components(m)
    2
    """
    from scipy import ndimage

    _, n = ndimage.label(np.asarray(mask, bool), structure=np.ones((3, 3), bool))
    return int(n)


def overlay_mask(image: Image.Image, mask: np.ndarray, color: tuple[int, int, int] = OVERLAY_COLOR,
                 alpha: float = 0.45) -> Image.Image:
    """The image with ``mask`` tinted in ``color`` and its outline drawn fully opaque."""
    from scipy import ndimage

    out = np.array(image.convert("RGB"), dtype=np.uint8)
    m = np.asarray(mask, bool)
    box = mask_bbox(m)
    if box is None:
        return Image.fromarray(out)
    x0, y0, x1, y1 = box  # work on the mask's bounding box only: most masks are small
    sub, sm = out[y0:y1, x0:x1], m[y0:y1, x0:x1]
    blend = (1 - alpha) * sub[sm].astype(np.float32) + alpha * np.asarray(color, np.float32)
    sub[sm] = np.round(blend).astype(np.uint8)
    edge = sm & ~ndimage.binary_erosion(np.pad(sm, 1))[1:-1, 1:-1]
    sub[edge] = color
    return Image.fromarray(out)


def draw_boxes(image: Image.Image, boxes: Sequence[Mapping[str, Any]]) -> Image.Image:
    """The image with each ``{"bbox", "label", "score"}`` drawn as a numbered rectangle."""
    out = image.convert("RGB").copy()
    draw = ImageDraw.Draw(out)
    width = max(1, round(max(out.size) / 256))
    for i, box in enumerate(boxes):
        color = BOX_COLORS[i % len(BOX_COLORS)]
        x0, y0, x1, y1 = (float(v) for v in box["bbox"])
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], outline=color, width=width)
        draw.text((x0 + 2, y0 + 1), str(i + 1), fill=color)
    return out


_MASK_READER: contextvars.ContextVar[Callable[[str], bytes] | None] = contextvars.ContextVar("mask_reader",
                                                                                             default=None)


@contextlib.contextmanager
def confined_mask_reads(reader: Callable[[str], bytes] | None) -> Iterator[None]:
    """While inside, :func:`load_mask` reads a mask file's bytes only through ``reader(file)``
    (the tool server's :func:`~tool_backends.limits.read_under_roots`: opened without following a
    symlink, then checked on the descriptor: a regular file, within the size cap, still under a
    root), never by ``open(name)``; a refusal is an unreadable mask (``OSError``). A context
    variable: it holds for the thread (or task) that entered it, so each server's calls read under
    that server's roots."""
    token = _MASK_READER.set(reader)
    try:
        yield
    finally:
        _MASK_READER.reset(token)


def _mask_bytes(file: str) -> bytes:
    reader = _MASK_READER.get()
    if reader is None:  # a local dataset's own annotation: the caller chose the file
        with open(file, "rb") as f:
            return f.read()
    from tool_backends.wire import WireError

    try:
        return reader(file)
    except WireError as e:  # not a regular file, over the size cap, unreadable
        raise OSError(str(e)) from None


def load_mask(path: str, size: tuple[int, int]) -> np.ndarray:
    """Read an annotated mask file (non-zero = inside), resized to ``size`` = (w, h) if needed.

    Any image format a record's image may use works, with the same path fragment: a NIfTI or DICOM
    label volume names its slice like the image does (``labels.nii.gz#slice=40``). The file is
    opened once, and inside :func:`confined_mask_reads` only through its reader. Unreadable or
    refused files raise ``OSError`` (the oracle then treats the annotation as absent)."""
    from medvqa_env.errors import DatasetError
    from medvqa_env.medical_images import read_medical, sniff_format, split_image_ref

    try:
        file, options = split_image_ref(path)
        data = _mask_bytes(file)
        kind = sniff_format(data[:548], file)
        if kind == "other" and file.lower().endswith(".gz"):
            kind = "nifti"
        if kind != "other":
            labels = read_medical(kind, data, options, f"mask {path!r}", 1 << 30).array
            im = Image.fromarray((np.asarray(labels) != 0).astype(np.uint8) * 255)
        else:
            im = Image.open(io.BytesIO(data))
            if options.slice is not None:
                im.seek(options.slice)
            if im.mode in ("I", "F") or im.mode.startswith("I;"):  # 16/32-bit label maps: any label is inside
                im = Image.fromarray((np.asarray(im) != 0).astype(np.uint8) * 255)
            else:
                im = im.convert("L")
    except (DatasetError, ValueError, EOFError, Image.DecompressionBombError) as e:
        raise OSError(str(e)) from None
    if im.size != tuple(size):
        im = im.resize(tuple(size), Image.Resampling.NEAREST)
    return np.asarray(im) > 0
