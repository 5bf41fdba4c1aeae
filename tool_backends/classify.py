"""``classify``: zero-shot classification over candidate labels (the seed's BiomedCLIP server).

Engines: ``clip`` / ``siglip`` via transformers, ``open_clip`` (BiomedCLIP, in its own venv),
``oracle`` (annotated labels).

An engine with a fixed label set (``known_labels``: a folder trained by
``python -m tool_backends.finetune classify``, the ``trained`` engine) scores any label it is
given, but its probability for a label it never learned means little. Its labels are in the
tool's schema (``labels.items.examples``, and the description) so a caller can ask for them; a
label is matched to the engine's own spelling with case, spaces and punctuation ignored (``x ray``
asks for ``X-Ray``). Labels outside the set are named in the tool's text (for the model), in
``data["unknown_labels"]`` (the env's ``info["tool_calls"][i]["data"]``) and in a logged warning
(for a person, once per label). Any set of two or more labels works, two-class ones included.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

from PIL import Image

from medvqa_env.errors import ToolError
from tool_backends.base import Tool, ToolContext, ToolResult, ToolSpec, random_weights_note, source_image
from tool_backends.engines import build_engine
from tool_backends.geometry import BBOX_SCHEMA, coordinates_schema, resolve_bbox, show_box, unit
from tool_backends.segment import IMAGE_INDEX_SCHEMA

log = logging.getLogger(__name__)


def fold_label(label: str) -> str:
    """A label as compared with an engine's own: NFKC, case, spaces and punctuation ignored
    (``x ray``, ``X-Ray`` and ``xray`` are one label).

    >>> fold_label(" X-Ray "), fold_label("x ray"), fold_label("No  lesion")
    ('xray', 'xray', 'nolesion')
    """
    import unicodedata

    return "".join(c for c in unicodedata.normalize("NFKC", str(label)).casefold() if c.isalnum())


def unknown_labels(labels: Sequence[str], known: Sequence[str] | None) -> list[str]:
    """The ``labels`` outside an engine's ``known`` label set (compared by :func:`fold_label`);
    none when the engine has no fixed set.

    >>> unknown_labels(["normal", "Lesion", " CT ", "x ray"], ["CT", "MRI", "lesion", "X-Ray"])
    ['normal']
    >>> unknown_labels(["anything"], None)
    []
    """
    if not known:
        return []
    fold = {fold_label(k) for k in known}
    return [lab for lab in labels if fold_label(lab) not in fold]


def engine_spelling(labels: Sequence[str], known: Sequence[str] | None) -> list[str]:
    """Each label as the engine learned it (``x ray`` -> ``X-Ray``), others unchanged: a trained
    text encoder read its labels as written.

    >>> engine_spelling(["x ray", "Lesion", "normal"], ["X-Ray", "lesion"])
    ['X-Ray', 'lesion', 'normal']
    """
    own = {fold_label(k): k for k in known or ()}
    return [own.get(fold_label(lab), lab) for lab in labels]


def normalise_scores(scores: dict[str, float], labels: Sequence[str]) -> dict[str, float]:
    """Engine output -> probabilities over ``labels`` in their order, summing to 1.

    >>> normalise_scores({"a": 3.0, "b": 1.0}, ["a", "b"])
    {'a': 0.75, 'b': 0.25}
    """
    values = [max(0.0, float(scores.get(lab, 0.0))) for lab in labels]
    if not all(math.isfinite(v) for v in values):
        raise ToolError("the classifier returned non-finite scores.")
    total = sum(values)
    if total <= 0:
        return {lab: 1.0 / len(labels) for lab in labels}
    return {lab: v / total for lab, v in zip(labels, values)}


class ClassifyTool(Tool):
    """Score candidate labels for image ``image_index`` (or a box of it)."""

    def __init__(self, engine: str = "clip", max_labels: int = 32, box_convention: str = "pixels",
                 name: str = "classify", **engine_options: Any) -> None:
        self.engine_name = engine
        self.engine = build_engine("classify", engine, **engine_options)
        self._warned: set[str] = set()  # unknown labels already logged
        known = list(getattr(self.engine, "known_labels", None) or ())
        items: dict[str, Any] = {"type": "string", "maxLength": 100}
        description = ("Zero-shot classification: give 2 or more candidate labels (e.g. modality, organ, finding) "
                       "and get a probability for each, for the whole image or a box of it.")
        if known:  # a trained engine: say which labels it can tell apart (an agent asks for those)
            items["examples"] = known
            description += f" This classifier was trained on the labels {known}: ask about those."
        self.spec = ToolSpec(
            name=name,
            description=description,
            parameters={
                "type": "object",
                "properties": {
                    "labels": {"type": "array", "items": items,
                               "minItems": 2, "maxItems": int(max_labels), "description": "candidate labels"},
                    "image_index": IMAGE_INDEX_SCHEMA,
                    "bbox": {**BBOX_SCHEMA, "description": "optional [x0, y0, x1, y1] region to classify "
                                                           "(bbox_2d is accepted too)"},
                    "coordinates": coordinates_schema(box_convention),
                },
                "required": ["labels"],
                "additionalProperties": False,
            },
        )

    def run(self, images: Sequence[Image.Image], arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        image, source = source_image(images, arguments["image_index"])
        labels = [lab.strip() for lab in arguments["labels"]]
        if any(not lab for lab in labels):
            raise ToolError(f"{self.name} labels must be non-empty strings.")
        known = getattr(self.engine, "known_labels", None)
        asked = engine_spelling(labels, known)
        if len(set(map(fold_label, asked))) != len(asked):
            raise ToolError(f"{self.name} labels must be distinct (case, spaces and punctuation aside), got {labels}.")
        region, where = None, f"image {source}"
        if "bbox" in arguments:
            coords = arguments["coordinates"]
            region = resolve_bbox(arguments["bbox"], image.size, coords)
            where = f"region {show_box(region, image.size, coords)} ({unit(coords)}) of image {source}"
            image = image.crop(region)
        raw = self.engine.classify(image, asked, context=context, image_index=source)
        scores = normalise_scores({lab: raw.get(own, 0.0) for lab, own in zip(labels, asked)}, labels)
        ranked = sorted(scores.items(), key=lambda kv: -kv[1])
        listing = ", ".join(f"{lab} {p:.3f}" for lab, p in ranked)
        note = random_weights_note(self.engine, self.engine_name)
        unknown = unknown_labels(labels, known)
        data = {"image_index": source, "engine": self.engine_name, "scores": {k: round(v, 6) for k, v in scores.items()},
                "top": ranked[0][0], "region": list(region) if region else None, "random_weights": bool(note)}
        if known:
            data["unknown_labels"] = unknown
        if unknown:
            note += (f" WARNING: this classifier was trained on the labels {list(known)} only; "
                     f"{', '.join(repr(u) for u in unknown)} {'is' if len(unknown) == 1 else 'are'} not among them, "
                     "so the scores mean little.")
            fresh = [u for u in unknown if u not in self._warned]
            if fresh:
                self._warned.update(fresh)
                log.warning("%s (engine %r) was asked about %s, outside the labels it was trained on %s: its scores "
                            "for them mean little (the observation's info flags them: data['unknown_labels'])",
                            self.name, self.engine_name, fresh, list(known))
        return ToolResult(text=f"Classification of {where}: {listing}.{note}", data=data)

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close:
            close()
