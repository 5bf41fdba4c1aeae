"""What travels between a tool client and a tool server: images, results, calls.

Images go one of three ways (the client's ``transport`` option; measured in
``benchmarks/bench_tools.py``, discussed in ``docs/tools.md``):

* ``png``  -- ``{"png": base64}``: lossless and compact; encoding costs CPU on big images.
* ``raw``  -- ``{"raw": base64, "size": [w, h]}``: RGB bytes; the cheapest to encode, ~3x larger.
* ``path`` -- ``{"path": "/shared/<digest>.bmp"}``: for a client and server on one machine; the
  client writes each distinct image once, the server reads it only from under its image roots.

Every upload also carries the image's ``digest``; the server keeps recently seen images in an
:class:`ImageStore`, and a client that has sent an image once sends only ``{"ref": digest}``
afterwards (a multi-turn episode, a GRPO group). A server that no longer holds it answers 409 and
the client sends the image again.

A result image that is a pure function of the source image and the result's ``data`` (a mask
overlay, boxes drawn, a zoom's enlarged crop, ``hires_render``'s classical re-render) names its
``data["image_recipe"]``; for clients that ask (``derived_ok``), the server sends ``{"derived":
recipe}`` instead of pixels and the client redraws it from the image it already holds, with the
same function, so the pixels are identical. Tools return such images as a :class:`LazyImage` and
the redraw is one too: drawn on first pixel access, so neither a server that sends the recipe nor
a caller that never looks at the image (a text policy, a log) pays for drawing it.

>>> from PIL import Image
>>> im = Image.new("RGB", (3, 2), (10, 20, 30))
>>> all(decode_image_entry(encode_image(im, k)).tobytes() == im.tobytes() for k in ("png", "raw"))
True
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping, Sequence

from PIL import Image

from medvqa_env.errors import DatasetError
from medvqa_env.images import DEFAULT_MAX_PIXELS, LazyImage, decode_image, image_digest, image_pixels
from tool_backends.base import ToolResult

TRANSPORTS = ("png", "raw", "path")


class WireError(ValueError):
    """A request or response part is malformed (the server answers 4xx with this message)."""


class UnknownImage(LookupError):
    """An ``{"ref": digest}`` names an image the server does not hold (the server answers 409)."""


class ImageStore:
    """A thread-safe LRU of decoded images by digest, bounded by total pixel bytes."""

    def __init__(self, max_bytes: int = 512 * 1024 * 1024) -> None:
        self.max_bytes = int(max_bytes)
        self._images: OrderedDict[str, Image.Image] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, digest: str) -> Image.Image | None:
        with self._lock:
            image = self._images.get(digest)
            if image is not None:
                self._images.move_to_end(digest)
            return image

    def put(self, digest: str, image: Image.Image) -> None:
        size = image.size[0] * image.size[1] * 3
        if size > self.max_bytes:
            return
        with self._lock:
            if digest in self._images:
                return
            self._images[digest] = image
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, old = self._images.popitem(last=False)
                self._bytes -= old.size[0] * old.size[1] * 3

    def __len__(self) -> int:
        return len(self._images)


def encode_image(image: Image.Image, transport: str = "png", shared_dir: str | os.PathLike | None = None,
                 digest: bool = True, written: list[str] | None = None) -> dict[str, Any]:
    """One image as a JSON-able entry (see the module docstring); ``digest=False`` leaves out its
    digest (result images: nobody refers to them later), except that ``path`` files are named by it.
    ``written`` collects the ``path`` files this call created (not those it found there already)."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    if transport == "png":
        buf = io.BytesIO()
        rgb.save(buf, format="PNG", compress_level=1)
        entry = {"png": base64.b64encode(buf.getvalue()).decode("ascii")}
        return {**entry, "digest": image_digest(rgb)} if digest else entry
    if transport == "raw":
        pixels = image_pixels(rgb)  # an ImageCache image's array: its bytes without another copy
        data = pixels.data if pixels is not None and pixels.flags.c_contiguous else rgb.tobytes()
        entry = {"raw": base64.b64encode(data).decode("ascii"), "size": list(rgb.size)}
        return {**entry, "digest": image_digest(rgb)} if digest else entry
    if transport == "path":
        if shared_dir is None:
            raise ValueError("expected a shared_dir for the 'path' transport, got None")
        path = Path(shared_dir) / f"{image_digest(image)}.bmp"
        if not path.exists():  # content-addressed: written once, never changed
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                rgb.save(f, format="BMP")
            os.replace(tmp, path)
            if written is not None:
                written.append(str(path))
        return {"path": str(path), "digest": image_digest(image)}
    raise ValueError(f"expected a transport in {list(TRANSPORTS)}, got {transport!r}")


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise WireError(f"expected base64 text for {what}, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise WireError(f"{what} is not valid base64") from None


def is_under(path: str | os.PathLike, roots: Sequence[str | os.PathLike]) -> bool:
    """Whether ``path`` resolves (symlinks followed) to somewhere inside one of ``roots``."""
    try:
        real = Path(path).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # ValueError: an embedded NUL byte
        return False
    for root in roots:
        r = Path(root).resolve()
        if real == r or r in real.parents:
            return True
    return False


ENTRY_KEYS = {"ref": {"ref"}, "png": {"png", "digest"}, "raw": {"raw", "size", "digest"},
              "path": {"path", "digest"}}
"""The keys each kind of image entry may have: an entry is a reference, an upload or a path, never a mix."""


def entry_kind(entry: Any) -> str:
    """Which kind of image entry ``entry`` is (``ref``, ``png``, ``raw`` or ``path``); a
    :class:`WireError` for anything else. An entry is decoded as exactly what it names, and shared
    (single-flight, cache) under that name only, so a mix -- a ``ref`` carrying a ``digest`` or
    bytes besides, two payloads -- is refused: it would be decoded as one image and shared as
    another's.

    >>> entry_kind({"ref": "ab"}), entry_kind({"png": "...", "digest": "ab"})
    ('ref', 'png')
    >>> entry_kind({"ref": "ab", "digest": "cd", "png": "..."})
    Traceback (most recent call last):
    ...
    tool_backends.wire.WireError: expected an image entry with exactly one of 'png', 'raw', 'path' or 'ref' (keys {'ref'}, {'png', 'digest'?}, {'raw', 'size', 'digest'?} or {'path', 'digest'?}, a string digest), got keys ['digest', 'png', 'ref']
    """
    if not isinstance(entry, Mapping):
        raise WireError(f"expected an image entry object, got {type(entry).__name__}")
    kinds = [k for k in ENTRY_KEYS if k in entry]
    if len(kinds) != 1 or not set(entry) <= ENTRY_KEYS[kinds[0]] or (
            "digest" in entry and not isinstance(entry["digest"], str)) or (
            kinds == ["ref"] and not isinstance(entry["ref"], str)):
        raise WireError("expected an image entry with exactly one of 'png', 'raw', 'path' or 'ref' (keys {'ref'}, "
                        "{'png', 'digest'?}, {'raw', 'size', 'digest'?} or {'path', 'digest'?}, a string digest), "
                        f"got keys {sorted(map(str, entry))}")
    return kinds[0]


def decode_image_entry(entry: Any, roots: Sequence[str | os.PathLike] = (), max_pixels: int = DEFAULT_MAX_PIXELS,
                       store: ImageStore | None = None) -> Image.Image:
    """Inverse of :func:`encode_image`. A ``path`` is opened only if it lies under ``roots``;
    a ``ref`` is looked up in ``store``; an upload is checked against its ``digest`` and stored (an
    upload whose digest the store already holds is not decoded again)."""
    if isinstance(entry, str):  # verl-tool style: a data URL or a file path
        if entry.startswith("data:image"):
            _, _, b64 = entry.partition(",")
            try:
                return decode_image(_b64(b64, "image data URL"), "image", max_pixels)
            except DatasetError as e:
                raise WireError(str(e)) from None
        entry = {"path": entry}
    kind = entry_kind(entry)
    if kind == "ref":
        image = store.get(str(entry["ref"])) if store is not None else None
        if image is None:
            raise UnknownImage(f"unknown image ref {str(entry['ref'])[:40]!r}: send the image itself")
        return image
    claimed = entry.get("digest")
    if claimed is not None and store is not None:  # another client of a GRPO group sent it a moment ago:
        known = store.get(str(claimed))              # the stored pixels were checked against that digest
        if known is not None:
            return known
    image = _decode_payload(entry, roots, max_pixels)
    if claimed is not None and store is not None:
        actual = image_digest(image)
        if claimed != actual:
            raise WireError(f"image digest {str(claimed)[:40]!r} does not match its content")
        store.put(actual, image)
    return image


def _decode_payload(entry: Mapping[str, Any], roots, max_pixels: int) -> Image.Image:
    try:
        if "png" in entry:
            return decode_image(_b64(entry["png"], "image 'png'"), "image", max_pixels)
        if "raw" in entry:
            size = entry.get("size")
            if (not isinstance(size, (list, tuple)) or len(size) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)):
                raise WireError(f"expected 'size': [w, h] with a raw image, got {size!r}")
            w, h = size
            if w * h > max_pixels:
                raise WireError(f"raw image {w}x{h} is over the limit of {max_pixels} pixels")
            data = _b64(entry["raw"], "image 'raw'")
            if len(data) != w * h * 3:
                raise WireError(f"raw image {w}x{h} needs {w * h * 3} bytes, got {len(data)}")
            return Image.frombytes("RGB", (w, h), data)
        if "path" in entry:
            from tool_backends.limits import read_under_roots

            return decode_image(read_under_roots(entry["path"], roots, 4 * max_pixels + (1 << 20)), "image",
                                max_pixels)
    except DatasetError as e:
        raise WireError(str(e)) from None
    raise WireError(f"expected an image entry with 'png', 'raw', 'path' or 'ref', got keys {sorted(entry)}")


def target_index(arguments: Mapping[str, Any], n_images: int) -> int | None:
    """The image a call reads (``image_index``, default 0), or ``None`` if it names no valid one.

    >>> target_index({}, 2), target_index({"image_index": -1}, 2), target_index({"image_index": 5}, 2)
    (0, 1, None)
    """
    index = arguments.get("image_index", 0) if isinstance(arguments, Mapping) else 0
    if isinstance(index, float) and index.is_integer():
        index = int(index)
    if not isinstance(index, int) or isinstance(index, bool) or not -n_images <= index < n_images:
        return None
    return index % n_images


def encode_images_for_call(images: Sequence[Image.Image], arguments: Mapping[str, Any], transport: str = "png",
                           shared_dir: str | None = None, encoded_cache: dict | None = None,
                           sent: set | None = None) -> list[Any]:
    """The episode's image list with only the targeted image filled in (the others ``None``):
    every tool reads one image, and the rest can be many enlarged crops. An image whose digest is
    in ``sent`` (the server has it) goes as ``{"ref": digest}``."""
    out: list[Any] = [None] * len(images)
    index = target_index(arguments, len(images))
    if index is not None:
        image = images[index]
        digest = image_digest(image)
        if sent is not None and digest in sent:
            out[index] = {"ref": digest}
            return out
        key = (digest, transport)
        entry = encoded_cache.get(key) if encoded_cache is not None else None
        if entry is None:
            entry = encode_image(image, transport, shared_dir)
            if encoded_cache is not None:
                encoded_cache[key] = entry
        out[index] = entry
    return out


RECIPES = ("mask_overlay", "boxes", "crop", "upscale")


def derive_image(recipe: str, source: Image.Image, data: Mapping[str, Any]) -> Image.Image:
    """A derived result image (see the module docstring), drawn when its pixels are first read."""
    from tool_backends.masks import draw_boxes, overlay_mask, rle_to_mask

    if recipe == "mask_overlay":
        rle = data["mask_rle"]
        if not isinstance(rle, Mapping) or list(rle.get("size", ())) != [source.size[1], source.size[0]]:
            raise WireError(f"a mask overlay needs a mask of the source image's size {source.size}")
        return LazyImage(lambda: overlay_mask(source, rle_to_mask(rle)), source.size)
    if recipe == "boxes":
        boxes = data["boxes"]
        return LazyImage(lambda: draw_boxes(source, boxes), source.size)
    if recipe in ("crop", "upscale"):
        box, dims = _region_and_size(recipe, source, data)  # copies: callers may rewrite the result's data later
        if recipe == "crop":  # image_zoom_in: the region of the source, enlarged to the result's size
            from tool_backends.zoom import crop_to_size

            return LazyImage(lambda: crop_to_size(source, box, dims), dims, source.mode)
        from tool_backends.engines.classical import LanczosSharpen  # hires_render's classical engine

        engine = LanczosSharpen(**_render_options(data.get("render")))
        return LazyImage(lambda: engine.upscale(source.crop(box), dims), dims)
    raise WireError(f"expected an image recipe in {list(RECIPES)}, got {recipe!r}")


def _region_and_size(recipe: str, source: Image.Image, data: Mapping[str, Any]):
    """``data``'s ``region`` (inside ``source``) and ``size`` (positive, within the pixel limit)."""
    region, size = data.get("region"), data.get("size")
    if (not isinstance(region, list) or len(region) != 4 or not all(isinstance(v, int) for v in region)
            or not 0 <= region[0] < region[2] <= source.size[0] or not 0 <= region[1] < region[3] <= source.size[1]):
        raise WireError(f"{recipe!r} needs a region inside the source image's {source.size}, got {region!r}")
    if (not isinstance(size, list) or len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size)
            or size[0] * size[1] > DEFAULT_MAX_PIXELS):
        raise WireError(f"{recipe!r} needs a positive size [w, h] within the pixel limit, got {size!r}")
    return tuple(region), tuple(size)


_RENDER_LIMITS = {"radius": (0.0, 50.0), "percent": (0, 1000), "threshold": (0, 255), "autocontrast": (0.0, 49.0)}


def _render_options(render: Any) -> dict[str, float]:
    """The ``upscale`` recipe's engine options, each a number in its range.

    >>> _render_options({"radius": 2.0, "percent": 120, "threshold": 2, "autocontrast": 0.5})["percent"]
    120
    >>> _render_options({"radius": 1e9})
    Traceback (most recent call last):
    ...
    tool_backends.wire.WireError: 'upscale' needs render options radius, percent, threshold, autocontrast within [(0.0, 50.0), (0, 1000), (0, 255), (0.0, 49.0)], got {'radius': 1000000000.0}
    """
    ok = isinstance(render, Mapping) and set(render) == set(_RENDER_LIMITS) and all(
        isinstance(render[k], (int, float)) and not isinstance(render[k], bool) and lo <= render[k] <= hi
        for k, (lo, hi) in _RENDER_LIMITS.items())
    if not ok:
        raise WireError(f"'upscale' needs render options {', '.join(_RENDER_LIMITS)} within "
                        f"{list(_RENDER_LIMITS.values())}, got {render!r}")
    return dict(render)


FRAMES = "application/x-medvqa-result"
"""Media type of a response whose ``raw`` result images follow its JSON as plain bytes: the JSON,
a newline, then the images' RGB bytes; an image entry ``{"bytes_at": [offset, length], "size":
[w, h]}`` points into those bytes. A client that lists it in ``Accept`` gets it (for ``raw``
results): no base64 and no JSON string of the pixels, ~6 ms less CPU for a 0.6 MB crop."""


def result_to_wire(result: ToolResult, transport: str = "png", result_dir: str | None = None,
                   derived_ok: bool = False, parts: list[bytes] | None = None,
                   written: list[str] | None = None) -> dict[str, Any]:
    """A result as JSON; images as ``png``, ``raw``, ``path`` (written under ``result_dir``, for a
    co-located client; without a ``result_dir`` that falls back to ``raw``) or, when the client
    accepts them, ``derived`` recipes. With ``parts`` (a response in :data:`FRAMES`), ``raw``
    images are appended to it as bytes and the entry says where they are."""
    if transport == "path" and not result_dir:
        transport = "raw"
    if transport not in TRANSPORTS:
        transport = "png"
    recipe = result.data.get("image_recipe") if isinstance(result.data, Mapping) else None
    images = []
    for im in result.images:
        if derived_ok and recipe in RECIPES and len(result.images) == 1:
            images.append({"derived": recipe})
            continue
        if transport == "raw" and parts is not None:
            data = (im if im.mode == "RGB" else im.convert("RGB")).tobytes()
            offset = sum(len(p) for p in parts)
            parts.append(data)
            images.append({"bytes_at": [offset, len(data)], "size": list(im.size)})
            continue
        entry = encode_image(im, transport, result_dir, digest=False, written=written)
        entry.pop("digest", None)
        images.append(entry)
    return {"text": result.text, "error": result.error, "data": result.data, "images": images}


def request_json(body: Mapping[str, Any]) -> bytes:
    """``json.dumps(body).encode()``, byte for byte, for a ``/call`` or ``/call_batch`` body: the
    base64 of its uploaded images is spliced in, not run through the JSON encoder, which checks
    every character for escaping (for one 256x256 RGB image on the 2-core VM, longer than encoding
    the base64 itself). Base64's alphabet needs no escaping, so the bytes are the same.

    >>> body = {"tool": "zoom", "images": [{"raw": "QUJD" * 300, "size": [30, 10]}, None]}
    >>> request_json(body) == json.dumps(body).encode()
    True
    """
    import secrets

    blobs: dict[str, str] = {}
    mark = secrets.token_hex(8)

    def swapped(images: Any) -> Any:
        if not isinstance(images, list):
            return images
        out = []
        for entry in images:
            if isinstance(entry, dict):
                for key in ("raw", "png"):
                    value = entry.get(key)
                    if isinstance(value, str) and len(value) > 1024:
                        name = f"{mark}-{len(blobs)}"
                        blobs[name] = value
                        entry = {**entry, key: name}
            out.append(entry)
        return out

    if "calls" in body and isinstance(body["calls"], list):
        shallow = {**body, "calls": [{**c, "images": swapped(c.get("images"))} if isinstance(c, dict) and "images" in c
                                     else c for c in body["calls"]]}
    else:
        shallow = {**body, "images": swapped(body["images"])} if "images" in body else body
    text = json.dumps(shallow)
    if not blobs:
        return text.encode()
    pieces, at = [], 0
    for name, value in blobs.items():  # in the order json.dumps wrote them: the order they were found
        where = text.index(f'"{name}"', at)
        pieces += [text[at:where + 1], value]
        at = where + 1 + len(name)
    pieces.append(text[at:])
    return "".join(pieces).encode()


def pack_frames(payload_json: bytes, parts: Sequence[bytes]) -> bytes:
    """A :data:`FRAMES` body: compact JSON (which never holds a raw newline), ``\\n``, the parts."""
    return b"".join([payload_json, b"\n", *parts])


def unpack_frames(body: bytes) -> tuple[Any, memoryview]:
    """``(JSON payload, the bytes after it)`` of a :data:`FRAMES` body.

    >>> unpack_frames(pack_frames(b'{"a":1}', [b"xy", b"z"]))[0], bytes(unpack_frames(b'[]\\nxyz')[1])
    ({'a': 1}, b'xyz')
    """
    end = body.find(b"\n")
    if end < 0:
        raise WireError("a framed result has no newline after its JSON")
    try:
        payload = json.loads(body[:end])
    except ValueError:
        raise WireError("a framed result does not start with JSON") from None
    return payload, memoryview(body)[end + 1:]


def _framed_image(entry: Mapping[str, Any], frames: memoryview | None, max_pixels: int) -> Image.Image:
    where, size = entry.get("bytes_at"), entry.get("size")
    if frames is None:
        raise WireError("a result image points into bytes the response did not carry")
    if (not isinstance(where, list) or len(where) != 2 or not all(isinstance(v, int) and v >= 0 for v in where)
            or not isinstance(size, list) or len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size)):
        raise WireError(f"expected 'bytes_at': [offset, length] and 'size': [w, h], got {where!r}, {size!r}")
    (offset, length), (w, h) = where, size
    if w * h > max_pixels or length != w * h * 3 or offset + length > len(frames):
        raise WireError(f"a framed {w}x{h} image of {length} bytes at {offset} does not fit the response")
    return Image.frombytes("RGB", (w, h), frames[offset:offset + length])


def result_from_wire(payload: Any, roots: Sequence[str | os.PathLike] = (),
                     images_sent: Sequence[Image.Image] | None = None, frames: memoryview | None = None,
                     max_pixels: int = DEFAULT_MAX_PIXELS) -> ToolResult:
    """Inverse of :func:`result_to_wire`; ``path`` images are read only from under ``roots``;
    ``derived`` ones are redrawn from ``images_sent[data["image_index"]]``; ``bytes_at`` ones are
    read from ``frames`` (the bytes after a :data:`FRAMES` response's JSON)."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("text"), str):
        raise WireError(f"expected a result object with 'text', got {str(payload)[:80]!r}")
    data = payload.get("data") or {}
    if not isinstance(data, dict):
        raise WireError("expected result 'data' to be an object")
    images = []
    for entry in payload.get("images") or []:
        if isinstance(entry, Mapping) and "derived" in entry:
            index = data.get("image_index")
            if images_sent is None or not isinstance(index, int) or not 0 <= index < len(images_sent):
                raise WireError("a derived result image names no source image the client holds")
            images.append(derive_image(str(entry["derived"]), images_sent[index], data))
            continue
        if isinstance(entry, Mapping) and "bytes_at" in entry:
            images.append(_framed_image(entry, frames, max_pixels))
            continue
        try:
            images.append(decode_image_entry(entry, roots, max_pixels))
        except PermissionError as e:
            raise WireError(str(e)) from None
    return ToolResult(text=payload["text"], images=images, data=data, error=payload.get("error"))
