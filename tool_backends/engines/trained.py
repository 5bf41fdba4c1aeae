"""``trained``: the engine of a tool trained on a dataset's annotations, built on first use.

``tools={"ground": "trained"}`` (``--tools ground=trained``) trains the grounder on the embedded
train split the first time any process asks for it (:mod:`tool_backends.finetune.cache`; a log
line says so and how long it took), caches the folder, and from then on loads it: the same
engine as ``{"engine": "centernet", "model": <folder>}``, loaded once per process
(:func:`~tool_backends.engines.loaded.load_once`). Options choose what it is trained on:
``dataset``, ``split``, ``dataset_options``, ``val_options``, ``steps``, ``seed``.
"""

from __future__ import annotations

from typing import Any, Mapping

from tool_backends.engines.loaded import load_once


def trained_grounder(dataset: str = "embedded", split: str = "train", dataset_options: Mapping[str, Any] | None = None,
                     val_options: Mapping[str, Any] | None = None, steps: int | None = None, seed: int = 0,
                     device: str = "cpu", nms_iou: float = 0.5):
    """A :class:`~tool_backends.engines.centernet.CenterNetGrounder` on the cached trained folder."""
    from tool_backends.engines.centernet import CenterNetGrounder
    from tool_backends.finetune.cache import trained_folder

    folder = trained_folder("ground", dataset, split, dataset_options, val_options, steps, seed, device)
    return load_once(CenterNetGrounder, {"model": str(folder), "device": device, "nms_iou": nms_iou})


def trained_segmenter(dataset: str = "embedded", split: str = "train", dataset_options: Mapping[str, Any] | None = None,
                      val_options: Mapping[str, Any] | None = None, steps: int | None = None, seed: int = 0,
                      device: str = "cpu", mask_threshold: float = 0.0):
    """A :class:`~tool_backends.engines.hf_sam.SamSegmenter` on the cached trained SAM folder."""
    from tool_backends.engines.hf_sam import SamSegmenter
    from tool_backends.finetune.cache import trained_folder

    folder = trained_folder("segment", dataset, split, dataset_options, val_options, steps, seed, device)
    return load_once(SamSegmenter, {"model": str(folder), "device": device, "mask_threshold": mask_threshold})


def trained_classifier(dataset: str = "embedded", split: str = "train", dataset_options: Mapping[str, Any] | None = None,
                       val_options: Mapping[str, Any] | None = None, steps: int | None = None, seed: int = 0,
                       device: str = "cpu"):
    """A :class:`~tool_backends.engines.hf_clip.ClipClassifier` on the cached trained CLIP folder
    (with the template it was trained with)."""
    from tool_backends.engines.hf_clip import ClipClassifier
    from tool_backends.finetune.cache import trained_folder
    from tool_backends.finetune.common import read_info

    folder = trained_folder("classify", dataset, split, dataset_options, val_options, steps, seed, device)
    info = read_info(folder) or {}
    return load_once(ClipClassifier, {"model": str(folder), "device": device,
                                      "template": info.get("template", "a medical image of {}")})
