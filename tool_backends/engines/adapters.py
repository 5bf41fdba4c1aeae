"""Adapters for the original model packages the seed's tool servers run: ``segment-anything``
(SAM / MedSAM checkpoints), ``open_clip`` (BiomedCLIP), ``groundingdino`` and BiomedParse.

Each of these pulls ``torchvision`` and a CUDA build of torch, so they never go into the main
venv: install one in a tool server's own venv and serve it with ``medvqa-tools serve`` there (the
seed runs every server in its own conda env for the same reason). Here they import lazily and,
when absent, fail with a :class:`ConfigError` that says exactly that.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Sequence

import numpy as np
from PIL import Image

from medvqa_env.errors import ConfigError
from tool_backends.base import ToolContext


def import_optional(module: str, package: str, engine: str):
    """Import ``module`` or raise a ConfigError naming the pip package and where it belongs."""
    try:
        return importlib.import_module(module)
    except (ImportError, RuntimeError, OSError) as e:  # RuntimeError: a torchvision built for another torch
        raise ConfigError(
            f"engine {engine!r} needs the {package!r} package, which is not importable here ({e}). It pulls "
            f"torchvision and a CUDA torch, so install it in the tool server's own venv (pip install {package} "
            "torch torchvision) and run `medvqa-tools serve` from there; see docs/tools.md.") from None


class SegmentAnythingSegmenter:
    """``segment_anything.SamPredictor`` on a SAM or MedSAM ``.pth`` checkpoint."""

    def __init__(self, checkpoint: str | None = None, model_type: str = "vit_b", device: str = "cpu") -> None:
        sa = import_optional("segment_anything", "segment-anything", "segment_anything")
        if not checkpoint:
            raise ConfigError("engine 'segment_anything' needs checkpoint= (e.g. medsam_vit_b.pth)")
        model = sa.sam_model_registry[model_type](checkpoint=checkpoint).to(device).eval()
        self.predictor = sa.SamPredictor(model)
        self.lock = threading.Lock()

    def segment(self, image: Image.Image, *, box=None, point=None, label=None,
                context: ToolContext | None = None, image_index: int = 0) -> np.ndarray:
        kwargs: dict[str, Any] = {"multimask_output": box is None}
        if box is not None:
            kwargs["box"] = np.asarray(box, dtype=np.float32)
        if point is not None:
            kwargs["point_coords"] = np.asarray([point], dtype=np.float32)
            kwargs["point_labels"] = np.asarray([1])
        with self.lock:  # the predictor holds the current image's embedding
            self.predictor.set_image(np.asarray(image.convert("RGB")))
            masks, scores, _ = self.predictor.predict(**kwargs)
        return np.asarray(masks[int(np.argmax(scores))], bool)


class OpenClipClassifier:
    """``open_clip`` zero-shot classification; the default model is BiomedCLIP (the seed's tool)."""

    def __init__(self, model: str = "hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224",
                 device: str = "cpu", template: str = "this is a photo of {}", context_length: int = 256) -> None:
        oc = import_optional("open_clip", "open_clip_torch", "open_clip")
        import torch

        self.torch = torch
        self.model, self.preprocess = oc.create_model_from_pretrained(model)
        self.model.to(device).eval()
        self.tokenizer = oc.get_tokenizer(model)
        self.device, self.template, self.context_length = device, template, int(context_length)

    def classify(self, image: Image.Image, labels: Sequence[str], *, context: ToolContext | None = None,
                 image_index: int = 0) -> dict[str, float]:
        torch = self.torch
        pixels = self.preprocess(image.convert("RGB")).unsqueeze(0).to(self.device)
        text = self.tokenizer([self.template.format(lab) for lab in labels], context_length=self.context_length)
        with torch.no_grad():
            img, txt, scale = self.model(pixels, text.to(self.device))
            probs = (scale * img @ txt.t()).softmax(-1)[0].cpu().tolist()
        return dict(zip(labels, probs))


class GroundingDinoPackageGrounder:
    """The original ``groundingdino`` package (``load_model`` + ``predict``)."""

    def __init__(self, config_path: str | None = None, checkpoint: str | None = None, device: str = "cpu",
                 text_threshold: float = 0.25) -> None:
        inference = import_optional("groundingdino.util.inference", "groundingdino-py", "groundingdino")
        if not (config_path and checkpoint):
            raise ConfigError("engine 'groundingdino' needs config_path= and checkpoint=")
        self.inference = inference
        self.model = inference.load_model(config_path, checkpoint, device=device)
        self.device, self.text_threshold = device, float(text_threshold)

    def detect(self, image: Image.Image, *, text: str, context: ToolContext | None = None, image_index: int = 0,
               threshold: float = 0.35, max_boxes: int = 5) -> list[dict[str, Any]]:
        transforms = importlib.import_module("groundingdino.datasets.transforms")
        tf = transforms.Compose([transforms.RandomResize([800], max_size=1333), transforms.ToTensor(),
                                 transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        tensor, _ = tf(image.convert("RGB"), None)
        boxes, logits, phrases = self.inference.predict(model=self.model, image=tensor, caption=text,
                                                        box_threshold=threshold, text_threshold=self.text_threshold,
                                                        device=self.device)
        w, h = image.size
        out = []
        for (cx, cy, bw, bh), score, phrase in zip(boxes.tolist(), logits.tolist(), phrases):
            out.append({"bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h],
                        "label": phrase or text, "score": float(score)})
        return sorted(out, key=lambda b: -b["score"])[:max_boxes]


class BiomedParseSegmenter:
    """BiomedParse (microsoft/BiomedParse, the seed's ``biomedparse`` server): a text prompt -> a
    probability mask, through its ``interactive_infer_image``. Run from a checkout of its repository
    (the package is not on PyPI); ``config_path`` is its ``configs/biomedparse_inference.yaml``."""

    def __init__(self, checkpoint: str | None = None, config_path: str = "configs/biomedparse_inference.yaml",
                 device: str = "cuda", mask_threshold: float = 0.5) -> None:
        arguments = import_optional("utilities.arguments", "BiomedParse (its repository)", "biomedparse")
        distributed = import_optional("utilities.distributed", "BiomedParse (its repository)", "biomedparse")
        modeling = import_optional("modeling", "BiomedParse (its repository)", "biomedparse")
        base = import_optional("modeling.BaseModel", "BiomedParse (its repository)", "biomedparse")
        self.inference = import_optional("inference_utils.inference", "BiomedParse (its repository)", "biomedparse")
        constants = import_optional("utilities.constants", "BiomedParse (its repository)", "biomedparse")
        if not checkpoint:
            raise ConfigError("engine 'biomedparse' needs checkpoint= (e.g. biomedparse_v1.pt)")
        import torch

        opt = distributed.init_distributed(arguments.load_opt_from_config_files([config_path]))
        opt["device"] = device
        self.model = base.BaseModel(opt, modeling.build_model(opt)).from_pretrained(checkpoint).eval().to(device)
        with torch.no_grad():
            self.model.model.sem_seg_head.predictor.lang_encoder.get_text_embeddings(
                constants.BIOMED_CLASSES + ["background"], is_eval=True)
        self.mask_threshold = float(mask_threshold)
        self.lock = threading.Lock()

    def segment_text(self, image: Image.Image, *, text: str, threshold: float = 0.0, max_instances: int = 5,
                     context: ToolContext | None = None, image_index: int = 0) -> list[dict[str, Any]]:
        with self.lock:
            out = self.inference.interactive_infer_image(self.model, image.convert("RGB"), [text])
        probs = np.asarray(out[0] if isinstance(out, tuple) else out, dtype=np.float32)[0]
        if probs.shape != (image.size[1], image.size[0]):  # it works at 1024 px on the short side
            probs = np.asarray(Image.fromarray(probs).resize(image.size, Image.Resampling.BILINEAR))
        mask = probs > self.mask_threshold
        score = float(probs[mask].mean()) if mask.any() else 0.0
        return [{"mask": mask, "score": score, "label": text}] if mask.any() and score >= threshold else []
