"""Engines: the model or algorithm behind a tool, chosen by the tool's ``engine=`` option.

Each tool kind has one small engine interface (``segment``, ``detect``, ``classify``, ``upscale``)
and a table of engines, imported only when built so that listing tools never loads torch.

>>> sorted(ENGINES["segment"])
['classical', 'oracle', 'sam', 'segment_anything', 'transformers']
>>> build_engine("segment", "sma")
Traceback (most recent call last):
...
medvqa_env.errors.ConfigError: Unknown segment engine 'sma'. Available: ['classical', 'oracle', 'sam', 'segment_anything', 'transformers']. Did you mean 'sam'?
"""

from __future__ import annotations

from typing import Any

from medvqa_env.errors import ConfigError, unknown_name_message
from medvqa_env.registry import Registry

_TABLES: dict[str, dict[str, str]] = {
    "segment": {
        "classical": "tool_backends.engines.classical:ClassicalSegmenter",
        "oracle": "tool_backends.engines.oracle:OracleSegmenter",
        "sam": "tool_backends.engines.hf_sam:SamSegmenter",
        "transformers": "tool_backends.engines.hf_sam:SamSegmenter",
        "segment_anything": "tool_backends.engines.adapters:SegmentAnythingSegmenter",
    },
    "ground": {
        "classical": "tool_backends.engines.classical:BlobGrounder",
        "oracle": "tool_backends.engines.oracle:OracleGrounder",
        "owlvit": "tool_backends.engines.hf_detect:OwlViTGrounder",
        "transformers": "tool_backends.engines.hf_detect:OwlViTGrounder",
        "grounding_dino": "tool_backends.engines.hf_detect:GroundingDinoGrounder",
        "groundingdino": "tool_backends.engines.adapters:GroundingDinoPackageGrounder",
    },
    "classify": {
        "clip": "tool_backends.engines.hf_clip:ClipClassifier",
        "transformers": "tool_backends.engines.hf_clip:ClipClassifier",
        "siglip": "tool_backends.engines.hf_clip:SiglipClassifier",
        "open_clip": "tool_backends.engines.adapters:OpenClipClassifier",
        "oracle": "tool_backends.engines.oracle:OracleClassifier",
    },
    "hires": {
        "classical": "tool_backends.engines.classical:LanczosSharpen",
    },
}

ENGINES: dict[str, Registry] = {kind: Registry(f"{kind} engine", table) for kind, table in _TABLES.items()}

TOOL_ENGINE_KIND = {"segment": "segment", "ground": "ground", "classify": "classify", "hires_render": "hires"}
"""Which engine table each registered tool chooses from (``image_zoom_in`` has no engine)."""


def build_engine(kind: str, name: str, **options: Any):
    """Import and build engine ``name`` for tool kind ``kind`` with ``options``."""
    registry = ENGINES.get(kind)
    if registry is None:
        raise ConfigError(unknown_name_message("engine kind", kind, ENGINES))
    return registry.build(name, **options)
