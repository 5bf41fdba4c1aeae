"""Train SAM (transformers ``SamModel``) on a dataset's masks from box prompts
(``python -m tool_backends.finetune segment``); the folder loads with engine ``sam``.

The network is the tiny SAM config of :mod:`tool_backends.engines.hf_sam` (256-pixel input) at
width ``WIDTH``, trained from a random initialisation (see :func:`sam_to_train`). Each step takes
``batch_size`` images and ``PROMPTS_PER_IMAGE`` of each image's masks; the prompt is the mask's box, each side moved by up
to a tenth of the box's size (SAM's box noise), and the loss is binary cross-entropy plus Dice
on the mask upsampled to the input size the way the processor's post-processing does. Masks are
taken from the annotations' mask files (image-level labels and boxes are not used).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from medvqa_env.errors import DatasetError
from tool_backends.finetune.common import (FinetuneArgs, one_cycle, provenance, show_loss, step_bar, training_run,
                                           validation_images, write_info)
from tool_backends.finetune.data import annotated_images, label_counts
from tool_backends.finetune.quality import dice

log = logging.getLogger(__name__)

RECIPE = {"steps": 300, "lr": 2e-3}
PRETRAINED_RECIPES = {"medsam_lite": {"steps": 40, "lr": 1e-4}}
"""``--init medsam_lite``: LiteMedSAM's prompt encoder and mask decoder fine-tuned on frozen image
embeddings (its encoder's forward is most of the cost on a CPU, and each image is embedded once)."""
PROMPTS_PER_IMAGE = 4
WIDTH = 64
BOX_NOISE = 0.1


def sam_to_train(seed: int):
    """The engine's tiny SAM config at width ``WIDTH`` (at 32 it drew organs less well on the
    validation images), randomly initialised, its random Fourier position features drawn at SAM's own
    scale, 1.0: the config's default (half the hidden size) is only an init that checkpoints
    overwrite, and from scratch it makes the features alias on the 16 x 16 grid, so boxes cannot be
    located."""
    import torch
    from transformers import SamConfig, SamImageProcessorPil, SamModel

    from tool_backends.engines.hf_common import build_tiny

    w = WIDTH
    config = SamConfig(
        vision_config=dict(hidden_size=w, num_hidden_layers=2, num_attention_heads=2, image_size=256, patch_size=16,
                           output_channels=w, window_size=4, global_attn_indexes=[1], mlp_dim=2 * w,
                           num_pos_feats=w // 2, initializer_range=0.02),
        prompt_encoder_config=dict(hidden_size=w, image_size=256, patch_size=16, mask_input_channels=4,
                                   image_embedding_size=16),
        mask_decoder_config=dict(hidden_size=w, num_hidden_layers=2, num_attention_heads=2, mlp_dim=2 * w,
                                 iou_head_hidden_dim=w),
        initializer_range=0.02)
    processor = SamImageProcessorPil(size={"longest_edge": 256}, pad_size={"height": 256, "width": 256})
    model = build_tiny(lambda: SamModel(config), seed)
    pe = model.shared_image_embedding.positional_embedding  # tied to the prompt encoder's
    with torch.no_grad():
        pe.copy_(torch.randn(pe.shape, generator=torch.Generator().manual_seed(seed)))
    return model, processor


def load_examples(images, processor) -> tuple[np.ndarray, list[list[tuple[str, np.ndarray, tuple[float, ...]]]]]:
    """Pixel values (float16, N x 3 x S x S, the processor's) and per image its masks as
    (label, bool mask in the processor's padded frame, box in that frame)."""
    from PIL import Image

    from medvqa_env.images import load_image
    from tool_backends.masks import load_mask, mask_bbox

    pixels, masks = [], []
    for item in images:
        image = load_image(item.path).convert("RGB")
        inputs = processor(images=image, return_tensors="np")
        pv = inputs["pixel_values"][0]
        rh, rw = (int(v) for v in inputs["reshaped_input_sizes"][0])
        entries = []
        for label, path in item.masks:
            try:
                m = load_mask(path, image.size)
            except OSError:
                continue
            small = np.asarray(Image.fromarray(m.astype(np.uint8) * 255).resize((rw, rh), Image.Resampling.NEAREST)) > 0
            frame = np.zeros(pv.shape[1:], bool)
            frame[:rh, :rw] = small
            box = mask_bbox(frame)
            if box:
                entries.append((label, frame, tuple(float(v) for v in box)))
        if entries:
            pixels.append(pv.astype(np.float16))
            masks.append(entries)
    if not pixels:
        raise DatasetError("no readable masks to train segment on")
    return np.stack(pixels), masks


def jitter(box: tuple[float, ...], rng: np.random.Generator, size: int) -> list[float]:
    """The box with each side moved by up to ``BOX_NOISE`` of the box's width/height, clipped."""
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    d = rng.uniform(-BOX_NOISE, BOX_NOISE, 4) * np.array([w, h, w, h])
    out = [x0 + d[0], y0 + d[1], x1 + d[2], y1 + d[3]]
    out = [min(max(v, 0.0), float(size)) for v in out]
    if out[2] - out[0] < 1 or out[3] - out[1] < 1:
        return [float(v) for v in box]
    return out


def mask_loss(logits, target):
    """Mean over masks of binary cross-entropy plus (1 - soft Dice); (M, H, W) each."""
    import torch
    from torch.nn import functional as F

    bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none").mean((1, 2))
    p = logits.sigmoid()
    inter = (p * target).sum((1, 2))
    soft_dice = (2 * inter + 1) / (p.sum((1, 2)) + target.sum((1, 2)) + 1)
    return (bce + 1 - soft_dice).mean() + torch.zeros(())


def predict_masks(model, pixels, boxes, size: int, device: str):
    """Logits at the input size for ``boxes`` (B, K, 4) on ``pixels`` (B, 3, S, S)."""
    from torch.nn import functional as F

    out = model(pixel_values=pixels.to(device), input_boxes=boxes.to(device), multimask_output=False)
    low = out.pred_masks[:, :, 0]  # (B, K, h, w)
    b, k = low.shape[:2]
    return F.interpolate(low.reshape(b * k, 1, *low.shape[2:]), size=(size, size), mode="bilinear",
                         align_corners=False).reshape(b, k, size, size)


def validate(model, pixels: np.ndarray, masks: list, device: str) -> dict[str, Any]:
    """Dice of every validation mask from its exact box, per label and overall."""
    import torch

    size = pixels.shape[-1]
    per_label: dict[str, list[float]] = {}
    model.eval()
    with torch.no_grad():
        for i, entries in enumerate(masks):
            boxes = torch.tensor([[list(box) for _, _, box in entries]], dtype=torch.float32)
            logits = predict_masks(model, torch.from_numpy(pixels[i:i + 1].astype(np.float32)), boxes, size, device)[0]
            for (label, gold, _), pred in zip(entries, (logits > 0).cpu().numpy()):
                per_label.setdefault(label, []).append(dice(pred, gold))
    return dice_summary(per_label, len(masks))


def dice_summary(per_label: dict[str, list[float]], n_images: int) -> dict[str, Any]:
    """Mean Dice over every mask, and per label, as the manifest's quality block records it."""
    scores = [v for vals in per_label.values() for v in vals]
    return {"mean_dice": round(float(np.mean(scores)), 4) if scores else None, "n_masks": len(scores),
            "n_images": n_images,
            "per_label": {lab: {"dice": round(float(np.mean(v)), 4), "n": len(v)} for lab, v in sorted(per_label.items())}}


def masked_images(args: FinetuneArgs, recipe: dict[str, Any]):
    """``(steps, lr, train images, val images, val_from)``: the recipe's steps and lr unless given,
    and the dataset's images that have masks, split as :func:`validation_images` does."""
    from medvqa_env.config import parse_options

    steps = int(args.steps if args.steps is not None else recipe["steps"])
    lr = float(args.lr if args.lr is not None else recipe["lr"])
    images = annotated_images(args.dataset, args.split, parse_options(args.dataset_opt, "--dataset-opt"),
                              limit=args.max_images)
    images = [im for im in images if im.masks]
    if not images:
        raise DatasetError(f"{args.dataset!r} split {args.split!r}: no masks to train segment on")
    images, val_images, val_from = validation_images(args, images)
    return steps, lr, images, [im for im in val_images if im.masks], val_from


def train_segment(args: FinetuneArgs, out: str) -> dict[str, Any]:
    """Train, report validation Dice, save model + processor to ``out``; the provenance dict."""
    import torch

    if args.init == "medsam_lite":
        return train_medsam_lite(args, out)
    steps, lr, images, val_images, val_from = masked_images(args, RECIPE)
    with training_run(args.seed, args.torch_threads) as clock:
        model, processor = sam_to_train(args.seed)
        pixels, masks = load_examples(images, processor)
        size = pixels.shape[-1]
        counts = label_counts([[label for label, _, _ in entries] for entries in masks])
        rng = np.random.default_rng(args.seed)
        model.to(args.device).train()
        opt, sched = one_cycle(model.parameters(), lr, steps)
        log.info("segment: training on %d images (%d masks) of %s/%s, %d steps", len(masks),
                 sum(counts.values()), args.dataset, args.split, steps)
        bar, final_loss = step_bar("segment", steps, args.progress), None
        for step in range(steps):
            idx = rng.integers(len(masks), size=min(args.batch_size, len(masks)))
            boxes, gold = [], []
            for i in idx:
                picks = rng.integers(len(masks[i]), size=PROMPTS_PER_IMAGE)
                boxes.append([jitter(masks[i][k][2], rng, size) for k in picks])
                gold.append(np.stack([masks[i][k][1] for k in picks]))
            logits = predict_masks(model, torch.from_numpy(pixels[idx].astype(np.float32)),
                                   torch.tensor(boxes, dtype=torch.float32), size, args.device)
            target = torch.from_numpy(np.stack(gold).astype(np.float32)).to(args.device)
            loss = mask_loss(logits.flatten(0, 1), target.flatten(0, 1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            sched.step()
            final_loss = float(loss.detach())
            show_loss(bar, final_loss)
            if step % 50 == 0 or step == steps - 1:
                log.debug("segment: step %d/%d loss %.4f", step + 1, steps, final_loss)
        bar.close()
        model.eval()
    if val_images:
        val_pixels, val_masks = load_examples(val_images, processor)
        validation = validate(model, val_pixels, val_masks, args.device)
    else:
        validation = {"note": "no validation images"}
    validation["source"] = val_from
    model.save_pretrained(out)
    processor.save_pretrained(out)
    info = provenance("segment", "sam", args, steps=steps, lr=lr, n_images=len(masks), labels=sorted(counts),
                      label_counts=counts, clock=clock, validation=validation, final_loss=final_loss, prompts="boxes (SAM box noise 10%)")
    write_info(out, info)
    return info


# ---- from the pretrained LiteMedSAM (``--init medsam_lite``) ------------------------------------
def lite_examples(net, images) -> tuple[Any, list[list[tuple[str, np.ndarray, tuple[float, ...]]]]]:
    """Each image's LiteMedSAM embedding (N x 256 x 64 x 64, computed once) and its masks as
    (label, bool mask in the 256-pixel input frame, box in that frame)."""
    import torch
    from PIL import Image

    from medvqa_env.images import load_image
    from tool_backends.engines.medsam_lite import SIZE, preprocess
    from tool_backends.masks import load_mask, mask_bbox

    embeddings, masks = [], []
    for item in images:
        image = load_image(item.path).convert("RGB")
        pixels, (nh, nw) = preprocess(image)
        entries = []
        for label, path in item.masks:
            try:
                m = load_mask(path, image.size)
            except OSError:
                continue
            small = np.asarray(Image.fromarray(m.astype(np.uint8) * 255).resize((nw, nh), Image.Resampling.NEAREST)) > 0
            frame = np.zeros((SIZE, SIZE), bool)
            frame[:nh, :nw] = small
            box = mask_bbox(frame)
            if box:
                entries.append((label, frame, tuple(float(v) for v in box)))
        if entries:
            with torch.no_grad():
                embeddings.append(net.embed(torch.from_numpy(pixels)[None])[0])
            masks.append(entries)
    if not masks:
        raise DatasetError("no readable masks to train segment on")
    return torch.stack(embeddings), masks


def lite_validate(net, embeddings, masks) -> dict[str, Any]:
    """Dice of every validation mask from its exact box (256-pixel frame), per label and overall."""
    import torch

    per_label: dict[str, list[float]] = {}
    with torch.no_grad():
        for emb, entries in zip(embeddings, masks):
            boxes = torch.tensor([list(box) for _, _, box in entries], dtype=torch.float32)
            logits, _ = net.decode(emb[None].expand(len(entries), -1, -1, -1), boxes=boxes)
            for (label, gold, _), pred in zip(entries, (logits[:, 0] > 0).numpy()):
                per_label.setdefault(label, []).append(dice(pred, gold))
    return dice_summary(per_label, len(masks))


def train_medsam_lite(args: FinetuneArgs, out: str) -> dict[str, Any]:
    """Fine-tune the pretrained LiteMedSAM (prompt encoder + mask decoder; the image encoder frozen)
    on a dataset's masks from jittered boxes; write ``lite_medsam.pth`` (LiteMedSAM's own key names,
    so its code loads it too) and the manifest. The folder loads with engine ``medsam_lite``
    (``model=DIR``) and ``trained`` (``path=DIR``)."""
    import torch

    from tool_backends.engines.medsam_lite import CHECKPOINT_FILE, SIZE, build_network
    from tool_backends.engines.medsam_lite_model import to_lite_medsam_state

    recipe = PRETRAINED_RECIPES["medsam_lite"]
    steps, lr, images, val_images, val_from = masked_images(args, recipe)
    with training_run(args.seed, args.torch_threads) as clock:
        net, _, start_sha256 = build_network()  # the bundled checkpoint, SHA-256 checked
        net.to(args.device).eval()  # BatchNorm and the encoder stay as pretrained
        embeddings, masks = lite_examples(net, images)
        embeddings = embeddings.to(args.device)
        trained = [p for name, p in net.named_parameters() if not name.startswith("image_encoder.")]
        for p in net.image_encoder.parameters():
            p.requires_grad_(False)
        counts = label_counts([[label for label, _, _ in entries] for entries in masks])
        rng = np.random.default_rng(args.seed)
        opt, sched = one_cycle(trained, lr, steps)
        log.info("segment (from LiteMedSAM): training on %d images (%d masks) of %s/%s, %d steps", len(masks),
                 sum(counts.values()), args.dataset, args.split, steps)
        bar, final_loss = step_bar("segment", steps, args.progress), None
        for step in range(steps):
            idx = rng.integers(len(masks), size=max(1, min(args.batch_size // PROMPTS_PER_IMAGE, len(masks))))
            embs, boxes, gold = [], [], []
            for i in idx:
                for k in rng.integers(len(masks[i]), size=PROMPTS_PER_IMAGE):
                    embs.append(embeddings[i])
                    boxes.append(jitter(masks[i][k][2], rng, SIZE))
                    gold.append(masks[i][k][1])
            logits, _ = net.decode(torch.stack(embs), boxes=torch.tensor(boxes, dtype=torch.float32, device=args.device))
            target = torch.from_numpy(np.stack(gold).astype(np.float32)).to(args.device)
            loss = mask_loss(logits[:, 0], target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 5.0)
            opt.step()
            sched.step()
            final_loss = float(loss.detach())
            show_loss(bar, final_loss)
        bar.close()
    net.cpu()
    if val_images:
        val_embeddings, val_masks = lite_examples(net, val_images)
        validation = lite_validate(net, val_embeddings, val_masks)
    else:
        validation = {"note": "no validation images"}
    validation["source"] = val_from
    torch.save(to_lite_medsam_state(net.state_dict()), f"{out}/{CHECKPOINT_FILE}")
    info = provenance("segment", "medsam_lite", args, steps=steps, lr=lr, n_images=len(masks), labels=sorted(counts),
                      label_counts=counts, clock=clock, validation=validation, final_loss=final_loss,
                      prompts="boxes (SAM box noise 10%)", init="medsam_lite", init_sha256=start_sha256,
                      frozen="image_encoder")
    write_info(out, info)
    return info
