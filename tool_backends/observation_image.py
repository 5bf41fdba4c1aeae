"""The image a tool returns, sized and encoded for the policy that will read it.

A tool image (a zoom's crop, a re-render) is read by a policy whose processor resizes it to its
own patch grid anyway, so shipping it larger, or lossless when the policy was trained on JPEG,
costs encode time and bytes for nothing: verl-tool's crop tool answers with a JPEG of the crop
(PIL's default quality), this project's zoom with a lossless PNG of the crop enlarged to 336 px.
The ``observation_image`` setting says what the policy gets:

* ``max_side``: the longest side a tool image may have (``None``: as the tool makes it);
* ``format``: ``png`` (lossless), ``jpeg`` or ``webp`` (lossy);
* ``quality``: 1-100, for the lossy formats (PIL's JPEG default is 75).

:func:`policy_image` is the one encoder every tool image goes through. For a lossy format the
pixels the policy sees *are* the decoded JPEG/WebP (so a policy reading the env in-process sees
what a rollout worker decodes from ``/get_observation``'s data URL), and the encoded bytes stay
with the image, so :func:`data_url` sends them without a second encode. An image that must stay
exact (a mask overlay, drawn boxes: ``exact=True``) keeps its size and goes lossless whatever the
setting says.

No setting (``None``) is today's behaviour: images at the tool's own size, data URLs as PNG at
zlib level 1, so figures recorded before this setting existed do not move.
:func:`for_policy` gives the default for a configured policy (its ``max_image_side``, lossless),
and the setting is a tool option (``{"image_zoom_in": {"observation_image": {...}}}``), so run
records hold it with the tool (:func:`tool_backends.identity.describe_tools`).

>>> setting = ObservationImage.parse({"max_side": 168, "format": "jpeg"})
>>> setting.fit((400, 200)), setting.lossless, setting.mime
((168, 84), False, 'image/jpeg')
>>> from PIL import Image
>>> im = policy_image(Image.new("RGB", (400, 200), (90, 120, 30)), setting)
>>> im.size, data_url(im)[:23]
((168, 84), 'data:image/jpeg;base64,')
"""

from __future__ import annotations

import base64
import io
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from PIL import Image

from medvqa_env.errors import ConfigError, unknown_name_message

FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
"""Format names the setting takes -> PIL's."""
_ALIASES = {"jpg": "jpeg"}
_FIELDS = ("max_side", "format", "quality")


@dataclass(frozen=True)
class ObservationImage:
    """How a tool image reaches the policy. See the module docstring."""

    max_side: int | None = None
    """Longest side of a tool image, in pixels; ``None``: the tool's own size."""
    format: str = "png"
    """``png`` (lossless), ``jpeg`` or ``webp``."""
    quality: int = 75
    """1-100, for ``jpeg`` and ``webp`` (ignored for ``png``)."""

    def __post_init__(self) -> None:
        if self.max_side is not None and (isinstance(self.max_side, bool) or not isinstance(self.max_side, int)
                                          or not 8 <= self.max_side <= 16384):
            raise ConfigError(f"expected observation_image max_side to be an int in 8..16384 or None, "
                              f"got {self.max_side!r}")
        fmt = _ALIASES.get(str(self.format).lower(), str(self.format).lower())
        if fmt not in FORMATS:
            raise ConfigError(unknown_name_message("observation_image format", str(self.format), list(FORMATS)))
        object.__setattr__(self, "format", fmt)
        if isinstance(self.quality, bool) or not isinstance(self.quality, int) or not 1 <= self.quality <= 100:
            raise ConfigError(f"expected observation_image quality to be an int in 1..100, got {self.quality!r}")

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def parse(cls, value: Any) -> "ObservationImage":
        """A setting from ``None`` (today's default), a format name (``"jpeg"``), a dict with
        :data:`_FIELDS`, or a setting. Anything else is a :class:`ConfigError` naming what came.

        >>> ObservationImage.parse("jpg").format, ObservationImage.parse(None) == DEFAULT
        ('jpeg', True)
        >>> ObservationImage.parse({"max_sid": 168})
        Traceback (most recent call last):
        ...
        medvqa_env.errors.ConfigError: Unknown observation_image field 'max_sid'. Available: ['format', 'max_side', 'quality']. Did you mean 'max_side'?
        """
        if value is None:
            return DEFAULT
        if isinstance(value, ObservationImage):
            return value
        if isinstance(value, str):
            return cls(format=value)
        if isinstance(value, Mapping):
            for key in value:
                if key not in _FIELDS:
                    raise ConfigError(unknown_name_message("observation_image field", str(key), sorted(_FIELDS)))
            return cls(**dict(value))
        raise ConfigError(f"expected observation_image to be None, a format name or "
                          f"{{'max_side', 'format', 'quality'}}, got {type(value).__name__} {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """The setting as a run record holds it."""
        return asdict(self)

    # ---- what it means -----------------------------------------------------------------------
    @property
    def lossless(self) -> bool:
        return self.format == "png"

    @property
    def mime(self) -> str:
        return f"image/{self.format}"

    def fit(self, size: tuple[int, int]) -> tuple[int, int]:
        """``size`` shrunk (never enlarged) so its longest side is at most ``max_side``."""
        w, h = int(size[0]), int(size[1])
        if self.max_side is None or max(w, h) <= self.max_side:
            return w, h
        scale = self.max_side / max(w, h)
        return max(1, round(w * scale)), max(1, round(h * scale))

    def cap(self, max_side: int) -> int:
        """A tool's own ``max_side`` option, capped by this setting's."""
        return int(max_side) if self.max_side is None else min(int(max_side), self.max_side)


DEFAULT = ObservationImage()
"""No setting: the tool's own size, PNG (zlib level 1), as before this setting existed."""


def for_policy(max_image_side: int | None) -> ObservationImage:
    """The default for a configured policy: tool images no larger than the policy's processor
    consumes (its ``max_image_side``: :class:`agents.vlm.VLMAgent` shrinks anything larger before
    patching), lossless so in-process and wire pixels are the same; ``None``: :data:`DEFAULT`.

    >>> for_policy(448)
    ObservationImage(max_side=448, format='png', quality=75)
    """
    return DEFAULT if max_image_side is None else ObservationImage(max_side=int(max_image_side))


# ---- the one encoder ---------------------------------------------------------------------------
_SETTING = "_medvqa_observation_setting"
_ENCODED = "_medvqa_observation_bytes"
_PRODUCE = "_medvqa_observation_produce"


def encode(image: Image.Image, setting: ObservationImage = DEFAULT, exact: bool = False) -> bytes:
    """``image`` (already at its size) in the setting's format; ``exact`` forces lossless PNG.
    PNG is written at zlib level 1 (level 6 is ~3x the CPU for a few percent fewer bytes)."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    buf = io.BytesIO()
    if exact or setting.lossless:
        rgb.save(buf, format="PNG", compress_level=1)
    elif setting.format == "webp":
        rgb.save(buf, format="WEBP", quality=setting.quality, method=0)
    else:
        rgb.save(buf, format="JPEG", quality=setting.quality)
    return buf.getvalue()


def policy_image(image: Image.Image, setting: ObservationImage | None = None, exact: bool = False) -> Image.Image:
    """The image the policy gets for tool image ``image``: shrunk to ``setting.max_side`` (Lanczos)
    unless ``exact``, and for a lossy format decoded from its encoded bytes, which stay with the
    returned image for :func:`data_url`. A lossless image is encoded only when something asks.
    ``setting=None`` returns ``image`` itself (today's behaviour)."""
    if setting is None:
        return image
    fitted = image
    if not exact and setting.fit(image.size) != image.size:
        fitted = image.convert("RGB").resize(setting.fit(image.size), Image.Resampling.LANCZOS)
    if exact or setting.lossless:
        if fitted is image:  # never mark a caller's image
            fitted = image.copy()
        setattr(fitted, _SETTING, (setting, exact))
        return fitted
    data = encode(fitted, setting)
    decoded = Image.open(io.BytesIO(data))
    decoded.load()
    decoded = decoded if decoded.mode == "RGB" else decoded.convert("RGB")
    setattr(decoded, _SETTING, (setting, exact))
    setattr(decoded, _ENCODED, data)
    return decoded


def attach(image: Image.Image, setting: ObservationImage, data: bytes | None = None, exact: bool = False,
           produce=None) -> None:
    """Mark ``image`` (one a tool made, e.g. a not yet drawn crop) as encoded under ``setting``,
    with its encoded ``data`` when known, or ``produce()`` to make them without drawing the image
    (a lossy crop's bytes come before its decoded pixels): :func:`data_url` sends those bytes."""
    setattr(image, _SETTING, (setting, exact))
    if data is not None:
        setattr(image, _ENCODED, data)
    if produce is not None:
        setattr(image, _PRODUCE, produce)


def encoded_once(draw, setting: ObservationImage):
    """``(produce, decoded)`` for a lossy tool image drawn by ``draw()``: ``produce()`` encodes it
    once (thread-safe) and ``decoded()`` gives the pixels those bytes decode to."""
    import threading

    lock, cell, source = threading.Lock(), [], [draw]

    def produce() -> bytes:
        with lock:
            if not cell:
                cell.append(encode(source.pop()(), setting))  # then the drawing (and its source) is let go
            return cell[0]

    def decoded() -> Image.Image:
        out = Image.open(io.BytesIO(produce()))
        out.load()
        return out if out.mode == "RGB" else out.convert("RGB")

    return produce, decoded


def encoded(image: Image.Image) -> tuple[bytes, str]:
    """``(bytes, mime type)`` of ``image`` as the policy gets it over a wire: the bytes its setting
    encoded (memoised on the image), or today's PNG for an image no setting touched."""
    setting, exact = getattr(image, _SETTING, (DEFAULT, False))
    data = getattr(image, _ENCODED, None)
    produce = getattr(image, _PRODUCE, None)
    if data is None and produce is not None:  # a lossy tool image: its bytes, its pixels left undrawn
        data = produce()
    if data is None:
        data = encode(image, setting, exact)
        try:
            setattr(image, _ENCODED, data)
        except AttributeError:  # an image type without a __dict__: encode again next time
            pass
    return data, ("image/png" if exact else setting.mime)


def data_url(image: Image.Image) -> str:
    """``image`` as a ``data:`` URL (``/get_observation``'s observation images), from
    :func:`encoded`: an image no setting touched is a PNG exactly as before."""
    data, mime = encoded(image)
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


__all__ = ["ObservationImage", "DEFAULT", "FORMATS", "for_policy", "encode", "policy_image", "attach", "encoded_once",
           "encoded",
           "data_url"]
