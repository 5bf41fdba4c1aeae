"""``trained``: the engine of a tool trained on a dataset's annotations, named by its folder.

``tools={"ground": {"engine": "trained", "path": DIR}}`` loads the folder that
``medvqa-tools build ground --out DIR`` wrote (the documented way: the tool is an artefact built
once, named by its content hash, see :mod:`tool_backends.finetune.manifest`); its files are checked
against the manifest's content hash at load, and ``content_hash=`` (a prefix will do) pins the
build a config expects. ``tools={"ground": "trained"}`` (``--tools ground=trained``, no ``path``)
builds the grounder on the embedded train split the first time any process asks for it
(:mod:`tool_backends.finetune.cache`; one sentence on stderr says so, and the build's progress bar
shows), caches the folder under its build identity, and from then on loads it. Options choose
what it is built from: ``dataset``, ``split``, ``dataset_options``, ``val_options``, ``steps``,
``seed``. Either way it is the same engine as ``{"engine": "centernet", "model": <folder>}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from medvqa_env.errors import ConfigError

from tool_backends.engines.loaded import load_once


def trained_tool_folder(kind: str, path: str | None = None, content_hash: str | None = None,
                        dataset: str = "embedded", split: str = "train", dataset_options: Mapping[str, Any] | None = None,
                        val_options: Mapping[str, Any] | None = None, steps: int | None = None, seed: int = 0,
                        device: str = "cpu") -> Path:
    """The checked folder of a trained ``kind`` tool: ``path`` (built by ``medvqa-tools build``),
    else the cached build of the other options (built now when missing). The folder's files must
    hash to its manifest's content hash and, when given, to ``content_hash``."""
    from tool_backends.finetune.cache import trained_folder
    from tool_backends.finetune.manifest import verify_folder

    if path is not None:
        given = {k: v for k, v in (("dataset", dataset != "embedded"), ("split", split != "train"),
                                   ("dataset_options", dataset_options is not None),
                                   ("val_options", val_options is not None), ("steps", steps is not None),
                                   ("seed", seed != 0)) if v}
        if given:
            raise ConfigError(f"trained {kind} tool: 'path' names a built folder; {sorted(given)} describe a build and "
                              "cannot be combined with it (build with them: `medvqa-tools build "
                              f"{kind} --out DIR ...`, then pass only path=DIR)")
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"trained {kind} tool: path {str(path)!r} is not a folder; build it with "
                              f"`medvqa-tools build {kind} --out {path}`")
    else:
        folder = trained_folder(kind, dataset, split, dataset_options, val_options, steps, seed, device)
    verify_folder(folder, kind, content_hash)
    return folder


def trained_grounder(path: str | None = None, content_hash: str | None = None, dataset: str = "embedded",
                     split: str = "train", dataset_options: Mapping[str, Any] | None = None,
                     val_options: Mapping[str, Any] | None = None, steps: int | None = None, seed: int = 0,
                     device: str = "cpu", nms_iou: float = 0.5):
    """A :class:`~tool_backends.engines.centernet.CenterNetGrounder` on the trained folder."""
    from tool_backends.engines.centernet import CenterNetGrounder

    folder = trained_tool_folder("ground", path, content_hash, dataset, split, dataset_options, val_options, steps,
                                 seed, device)
    return load_once(CenterNetGrounder, {"model": str(folder), "device": device, "nms_iou": nms_iou})


def trained_segmenter(path: str | None = None, content_hash: str | None = None, dataset: str = "embedded",
                      split: str = "train", dataset_options: Mapping[str, Any] | None = None,
                      val_options: Mapping[str, Any] | None = None, steps: int | None = None, seed: int = 0,
                      device: str = "cpu", mask_threshold: float = 0.0):
    """A :class:`~tool_backends.engines.hf_sam.SamSegmenter` on the trained SAM folder."""
    from tool_backends.engines.hf_sam import SamSegmenter

    folder = trained_tool_folder("segment", path, content_hash, dataset, split, dataset_options, val_options, steps,
                                 seed, device)
    from tool_backends.finetune.common import read_info

    if (read_info(folder) or {}).get("engine") == "medsam_lite":  # built with --init medsam_lite
        from tool_backends.engines.medsam_lite import MedSamLiteSegmenter

        return load_once(MedSamLiteSegmenter, {"model": str(folder), "device": device, "mask_threshold": mask_threshold})
    return load_once(SamSegmenter, {"model": str(folder), "device": device, "mask_threshold": mask_threshold})


def trained_classifier(path: str | None = None, content_hash: str | None = None, dataset: str = "embedded",
                       split: str = "train", dataset_options: Mapping[str, Any] | None = None,
                       val_options: Mapping[str, Any] | None = None, steps: int | None = None, seed: int = 0,
                       device: str = "cpu"):
    """A :class:`~tool_backends.engines.hf_clip.ClipClassifier` on the trained CLIP folder (with
    the template it was trained with)."""
    from tool_backends.engines.hf_clip import ClipClassifier
    from tool_backends.finetune.common import read_info

    folder = trained_tool_folder("classify", path, content_hash, dataset, split, dataset_options, val_options, steps,
                                 seed, device)
    info = read_info(folder) or {}
    return load_once(ClipClassifier, {"model": str(folder), "device": device,
                                      "template": info.get("template", "a medical image of {}")})
