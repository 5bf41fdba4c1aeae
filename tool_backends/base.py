"""The tool contract: what every tool is, whatever runs it (in-process model, classical code,
oracle, or a server on another machine).

A tool has a :class:`ToolSpec` (name, description, OpenAI-function JSON schema: the same schema goes
into the env's system prompt and into chat templates' ``tools=``) and a :meth:`Tool.run` that takes
the episode's images plus validated arguments and returns a :class:`ToolResult`.
"""

from __future__ import annotations

import abc
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from PIL import Image

from medvqa_env.errors import ToolError
from medvqa_env.images import image_digest  # noqa: F401  (the cache key's image part; lives with the images)
from medvqa_env.records import Annotations


@dataclass(frozen=True)
class ToolSpec:
    """Name, description and JSON schema (``{"type": "object", "properties": ..., "required": ...}``)."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def openai_schema(self) -> dict[str, Any]:
        """The OpenAI function-tool form used by chat templates (``tools=[...]``)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }


@dataclass
class ToolResult:
    """What a tool returns.

    ``text`` is what the model reads. ``images`` are new images (a crop, an overlay) the env appends
    to the episode. ``data`` is JSON-serialisable structure for render, rewards and logs, with these
    conventional keys: ``region`` ([x0, y0, x1, y1] pixels of the source image the tool looked at),
    ``boxes`` (list of {"bbox", "label", "score"}), ``mask_rle`` (see :func:`mask_to_rle`),
    ``scores`` ({label: probability}), ``image_index`` (source image). ``error`` is set when the
    tool refused or failed; ``text`` then explains why.
    """

    text: str
    images: list[Image.Image] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failure(cls, message: str) -> "ToolResult":
        return cls(text=f"Error: {message}", error=message)


@dataclass(frozen=True)
class ToolContext:
    """Per-episode facts a tool may use. Only oracle engines read ``annotations``."""

    record_id: str | None = None
    dataset: str | None = None
    annotations: Annotations = field(default_factory=Annotations)
    question: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"record_id": self.record_id, "dataset": self.dataset,
                "annotations": self.annotations.to_dict(), "question": self.question}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "ToolContext":
        data = data or {}
        return cls(record_id=data.get("record_id"), dataset=data.get("dataset"),
                   annotations=Annotations.from_dict(data.get("annotations")), question=data.get("question"))


class Tool(abc.ABC):
    """Subclasses set ``spec`` and implement :meth:`run`; :meth:`__call__` validates first."""

    spec: ToolSpec

    @property
    def name(self) -> str:
        return self.spec.name

    def __call__(self, images: Sequence[Image.Image], arguments: Mapping[str, Any],
                 context: ToolContext | None = None) -> ToolResult:
        """Validate ``arguments`` against the schema, then run. Never raises for bad arguments."""
        try:
            args = validate_arguments(self.spec, arguments)
            return self.run(images, args, context or ToolContext())
        except ToolError as e:
            return ToolResult.failure(str(e))

    @abc.abstractmethod
    def run(self, images: Sequence[Image.Image], arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Run on validated arguments. Raise :class:`ToolError` with a model-readable message."""


# ----------------------------------------------------------------------------------------------
# Argument validation: a small JSON-schema subset with messages written for the model.
# ----------------------------------------------------------------------------------------------
_JSON_TYPES = {"number": (int, float), "integer": (int,), "string": (str,), "boolean": (bool,),
               "array": (list, tuple), "object": (dict,)}


def _check(value: Any, schema: Mapping[str, Any], where: str) -> Any:
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        ok = False
        for k in kinds:
            py = _JSON_TYPES.get(k, ())
            if isinstance(value, bool) and k in ("number", "integer"):
                continue
            if isinstance(value, py):
                ok = True
                break
            if k == "integer" and isinstance(value, float) and value.is_integer():
                value, ok = int(value), True
                break
        if not ok:
            raise ToolError(f"{where} must be {' or '.join(kinds)}, got {_short(value)}.")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError(f"{where} must be a finite number, got {value}.")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER:
        # past float range tools crash (OverflowError); past 4,300 digits even str() raises
        raise ToolError(f"{where} must be a number of at most 15 digits, got an integer of about "
                        f"{int(value.bit_length() * 0.30103) + 1} digits.")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolError(f"{where} must be one of {list(schema['enum'])}, got {_short(value)}.")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ToolError(f"{where} must be >= {schema['minimum']}, got {value}.")
        if "maximum" in schema and value > schema["maximum"]:
            raise ToolError(f"{where} must be <= {schema['maximum']}, got {value}.")
    if isinstance(value, str) and "maxLength" in schema and len(value) > schema["maxLength"]:
        raise ToolError(f"{where} must be at most {schema['maxLength']} characters, got {len(value)}.")
    if isinstance(value, (list, tuple)):
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise ToolError(f"{where} needs at least {schema['minItems']} items, got {len(value)}.")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise ToolError(f"{where} takes at most {schema['maxItems']} items, got {len(value)}.")
        if "items" in schema:
            value = [_check(v, schema["items"], f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict) and schema.get("type") == "object":
        value = _check_object(value, schema, where)
    return value


def _check_object(value: Mapping[str, Any], schema: Mapping[str, Any], where: str) -> dict[str, Any]:
    props = schema.get("properties", {})
    out: dict[str, Any] = {}
    for key in schema.get("required", ()):
        if key not in value:
            raise ToolError(f"Missing required argument {key!r} for {where}.")
    for key, v in value.items():
        if key not in props:
            if schema.get("additionalProperties", False) is False:
                raise ToolError(f"Unknown argument {key!r} for {where}. Allowed: {sorted(props)}.")
            out[key] = v
            continue
        out[key] = _check(v, props[key], f"Argument {key!r}")
    for key, sub in props.items():
        if key not in out and "default" in sub:
            out[key] = sub["default"]
    return out


MAX_SAFE_INTEGER = 2 ** 53
"""Largest integer a tool argument may hold (exact as a float; no coordinate needs more)."""


def _short(value: Any, limit: int = 60) -> str:
    if isinstance(value, int) and abs(value) > MAX_SAFE_INTEGER:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    s = repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


ARGUMENT_ALIASES = {"bbox_2d": "bbox", "point_2d": "point", "img_idx": "image_index"}
"""Argument names models already use -> ours: Qwen-VL's grounding keys (``bbox_2d``, ``point_2d``)
and verl's / DeepEyes' ``image_zoom_in_tool`` (``bbox_2d``, ``img_idx``). An alias is accepted by
any tool whose schema has the argument it stands for."""

ONE_BASED_ALIASES = {"target_image": "image_index"}
"""Aliases that count from 1 -> ours, which count from 0: verl-tool's ``pixel_reasoner`` crop
(``crop_image``/``zoom_in``) names the image to crop ``target_image``, 1 for the first image of the
trajectory, and later crops follow in the order this env keeps them, so ``target_image`` k is
``image_index`` k - 1; below 1 it is refused (0 would read as -1, the last image). A value that is
not an integer is passed on as it came, for the schema check."""


def canonical_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Rename aliased arguments (:data:`ARGUMENT_ALIASES`) and read a box or point written as a
    JSON string (``"[1, 2, 3, 4]"``, as some models do) as the array it spells.

    >>> spec = ToolSpec("t", "", {"type": "object", "properties": {"bbox": {"type": "array"}}})
    >>> canonical_arguments(spec, {"bbox_2d": "[1, 2, 3, 4]"})
    {'bbox': [1, 2, 3, 4]}
    >>> spec = ToolSpec("t", "", {"type": "object", "properties": {"image_index": {"type": "integer"}}})
    >>> canonical_arguments(spec, {"target_image": 2})
    {'image_index': 1}
    """
    props = spec.parameters.get("properties", {})
    out = dict(arguments)
    for alias, name in ARGUMENT_ALIASES.items():
        if alias in out and name in props and alias not in props:
            if name in out:
                raise ToolError(f"Give {name!r} or {alias!r} to {spec.name!r}, not both.")
            out[name] = out.pop(alias)
    for alias, name in ONE_BASED_ALIASES.items():
        if alias in out and name in props and alias not in props:
            if name in out:
                raise ToolError(f"Give {name!r} or {alias!r} to {spec.name!r}, not both.")
            value = out.pop(alias)
            if isinstance(value, int) and not isinstance(value, bool):
                if value < 1:  # 0 would become -1, which our image_index reads as the last image
                    raise ToolError(f"{alias!r} counts the trajectory's images from 1 (the first image); got {value}.")
                value -= 1
            out[name] = value
    for key, value in out.items():
        if isinstance(value, str) and props.get(key, {}).get("type") == "array" and value.strip().startswith("["):
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if isinstance(parsed, list):
                out[key] = parsed
    return out


def validate_arguments(spec: ToolSpec, arguments: Any) -> dict[str, Any]:
    """Check ``arguments`` against ``spec.parameters`` (after :func:`canonical_arguments`); fill
    defaults; raise :class:`ToolError`."""
    if not isinstance(arguments, Mapping):
        raise ToolError(f"Arguments of {spec.name!r} must be a JSON object, got {_short(arguments)}.")
    return _check_object(canonical_arguments(spec, arguments), spec.parameters, spec.name)


# ----------------------------------------------------------------------------------------------
# Shared helpers for tools.
# ----------------------------------------------------------------------------------------------
def random_weights_note(engine: Any, engine_name: str) -> str:
    """The sentence a model-backed tool appends to its text when its engine runs random weights
    (the offline tiny models), so no one mistakes its outputs for a real model's; "" otherwise."""
    if not getattr(engine, "random_weights", False):
        return ""
    return (f" WARNING: engine {engine_name!r} runs a tiny randomly-initialised model (no checkpoint was "
            "configured), so this output is meaningless; give the tool model=<checkpoint>.")


def source_image(images: Sequence[Image.Image], index: int) -> tuple[Image.Image, int]:
    """The episode image at ``index`` and its index counted from the start (for ``data``).

    >>> from PIL import Image
    >>> imgs = [Image.new("RGB", (4, 4)), Image.new("RGB", (8, 8))]
    >>> source_image(imgs, -1)[1]
    1
    """
    image = pick_image(images, index)
    return image, index if index >= 0 else len(images) + index


def pick_image(images: Sequence[Image.Image], index: int) -> Image.Image:
    """The episode image at ``index`` (negative counts from the end), or a clear ToolError."""
    if not images:
        raise ToolError("There is no image in this episode.")
    if not -len(images) <= index < len(images):
        raise ToolError(f"image_index {index} is out of range: this episode has images 0..{len(images) - 1}.")
    return images[index]
