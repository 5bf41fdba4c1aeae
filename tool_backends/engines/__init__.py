"""Engines: the model or algorithm behind a tool, chosen by the tool's ``engine=`` option.

Each tool kind has one small engine interface (``segment``, ``detect``, ``classify``, ``upscale``)
and a table of engines, imported only when built so that listing tools never loads torch. A model
engine is loaded once per process and shared (:mod:`tool_backends.engines.loaded`).

>>> sorted(ENGINES["segment"])
['classical', 'medsam2', 'medsam3', 'medsam_lite', 'oracle', 'sam', 'sam2', 'sam3', 'segment_anything', 'trained', 'transformers']
>>> build_engine("segment", "sma")
Traceback (most recent call last):
...
medvqa_env.errors.ConfigError: Unknown segment engine 'sma'. Available: ['classical', 'medsam2', 'medsam3', 'medsam_lite', 'oracle', 'sam', 'sam2', 'sam3', 'segment_anything', 'trained', 'transformers']. Did you mean 'sam'?
"""

from __future__ import annotations

from typing import Any

from medvqa_env.errors import ConfigError, unknown_name_message
from medvqa_env.registry import Registry
from tool_backends.engines.hf_common import TorchEngine

_TABLES: dict[str, dict[str, str]] = {
    "segment": {
        "classical": "tool_backends.engines.classical:ClassicalSegmenter",
        "oracle": "tool_backends.engines.oracle:OracleSegmenter",
        "sam": "tool_backends.engines.hf_sam:SamSegmenter",
        "transformers": "tool_backends.engines.hf_sam:SamSegmenter",
        "segment_anything": "tool_backends.engines.adapters:SegmentAnythingSegmenter",
        "sam2": "tool_backends.engines.hf_sam2:Sam2Segmenter",
        "medsam2": "tool_backends.engines.hf_sam2:Sam2Segmenter",
        "sam3": "tool_backends.engines.hf_sam2:Sam3TrackerSegmenter",
        "medsam3": "tool_backends.engines.hf_sam2:Sam3TrackerSegmenter",
        "trained": "tool_backends.engines.trained:trained_segmenter",
        "medsam_lite": "tool_backends.engines.medsam_lite:MedSamLiteSegmenter",
    },
    "segment_text": {
        "classical": "tool_backends.engines.classical:BlobTextSegmenter",
        "oracle": "tool_backends.engines.oracle:OracleTextSegmenter",
        "sam3": "tool_backends.engines.hf_sam3:Sam3TextSegmenter",
        "medsam3": "tool_backends.engines.hf_sam3:Sam3TextSegmenter",
        "transformers": "tool_backends.engines.hf_sam3:Sam3TextSegmenter",
        "biomedparse": "tool_backends.engines.adapters:BiomedParseSegmenter",
    },
    "ground": {
        "classical": "tool_backends.engines.classical:BlobGrounder",
        "oracle": "tool_backends.engines.oracle:OracleGrounder",
        "owlvit": "tool_backends.engines.hf_detect:OwlViTGrounder",
        "transformers": "tool_backends.engines.hf_detect:OwlViTGrounder",
        "grounding_dino": "tool_backends.engines.hf_detect:GroundingDinoGrounder",
        "groundingdino": "tool_backends.engines.adapters:GroundingDinoPackageGrounder",
        "centernet": "tool_backends.engines.centernet:CenterNetGrounder",
        "trained": "tool_backends.engines.trained:trained_grounder",
    },
    "classify": {
        "clip": "tool_backends.engines.hf_clip:ClipClassifier",
        "transformers": "tool_backends.engines.hf_clip:ClipClassifier",
        "siglip": "tool_backends.engines.hf_clip:SiglipClassifier",
        "open_clip": "tool_backends.engines.adapters:OpenClipClassifier",
        "oracle": "tool_backends.engines.oracle:OracleClassifier",
        "trained": "tool_backends.engines.trained:trained_classifier",
    },
    "hires": {
        "classical": "tool_backends.engines.classical:LanczosSharpen",
    },
}

ENGINES: dict[str, Registry] = {kind: Registry(f"{kind} engine", table) for kind, table in _TABLES.items()}

TOOL_ENGINE_KIND = {"segment": "segment", "ground": "ground", "classify": "classify", "hires_render": "hires",
                    "segment_text": "segment_text",
                    # the seed's names for the same tools (see tool_backends.builtin.TOOL_ALIASES)
                    "medsam2": "segment", "medsam3": "segment", "biomedparse": "segment_text",
                    "groundingdino-med": "ground", "biomedclip": "classify", "agent4k_resolution": "hires"}
"""Which engine table each registered tool chooses from (``image_zoom_in`` has no engine)."""


def build_engine(kind: str, name: str, **options: Any):
    """Import and build engine ``name`` for tool kind ``kind`` with ``options``."""
    registry = ENGINES.get(kind)
    if registry is None:
        raise ConfigError(unknown_name_message("engine kind", kind, ENGINES))
    factory = registry.get(name)
    if isinstance(factory, type) and issubclass(factory, TorchEngine):  # a model: loaded once per process
        from tool_backends.engines.loaded import load_once

        return load_once(lambda **o: registry.build(name, **o), options,
                         f"{kind}:{name}:{factory.__module__}.{factory.__qualname__}")
    return registry.build(name, **options)
