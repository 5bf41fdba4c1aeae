"""Train the ``centernet`` grounder on a dataset's boxes (``python -m tool_backends.finetune ground``).

Every box label in the training images becomes one heatmap. Targets are CenterNet's: a Gaussian
peak at each box's centre cell (its width set by the box's size), the centre's sub-cell offset
and the box's log width and height there. Loss: CenterNet's penalty-reduced focal loss on the
heatmaps plus L1 on the box terms at the centres. Augmentation: a random shift of up to 1/32 of
the side (no flips: "left kidney" must stay left) and a small brightness/contrast jitter. The
score threshold is the one with the best macro-F1 over labels on the validation images.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from medvqa_env.errors import DatasetError
from tool_backends.engines.centernet_model import STRIDE, GrounderConfig, build_net, save_grounder
from tool_backends.finetune.common import (FinetuneArgs, one_cycle, provenance, show_loss, step_bar, training_run,
                                           validation_images, write_info)
from tool_backends.finetune.data import annotated_images, label_counts, read_rgb, with_mask_boxes
from tool_backends.finetune.quality import match_boxes, prf

log = logging.getLogger(__name__)

RECIPE = {"steps": 300, "lr": 3e-3, "image_size": 256, "width": 16}
"""Defaults when the command line leaves them out."""
THRESHOLDS = tuple(round(0.05 * k, 2) for k in range(1, 19))
"""Score thresholds the validation images choose from."""


# ----------------------------------------------------------------------------------------------
# Data: pixels at the network's size, boxes scaled to it.
# ----------------------------------------------------------------------------------------------
def load_pixels_and_boxes(images, size: int) -> tuple[np.ndarray, list[list[tuple[str, tuple[float, ...]]]]]:
    """``(uint8 array (N, size, size, 3), per image [(label, box in network pixels)])``."""
    pixels, boxes = np.zeros((len(images), size, size, 3), np.uint8), []
    for i, item in enumerate(images):
        pixels[i], (w, h) = read_rgb(item.path, size)
        sx, sy = size / w, size / h
        boxes.append([(label, (b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy))
                      for label, b in with_mask_boxes(item, (w, h))])
    return pixels, boxes


def shift(pixels: np.ndarray, boxes: list, dx: int, dy: int, size: int) -> tuple[np.ndarray, list]:
    """The image moved by (dx, dy) pixels (edges repeated) and its boxes moved and clipped."""
    pad = max(abs(dx), abs(dy))
    if pad == 0:
        return pixels, boxes
    padded = np.pad(pixels, ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    out = padded[pad - dy:pad - dy + size, pad - dx:pad - dx + size]
    moved = []
    for label, (x0, y0, x1, y1) in boxes:
        b = (min(max(x0 + dx, 0), size), min(max(y0 + dy, 0), size), min(max(x1 + dx, 0), size), min(max(y1 + dy, 0), size))
        if b[2] - b[0] >= 1 and b[3] - b[1] >= 1:
            moved.append((label, b))
    return out, moved


def targets(batch_boxes: list, label_index: dict[str, int], grid: int):
    """CenterNet targets for a batch: heatmaps (B, L, G, G), box terms (B, 4, G, G) and the
    centre mask (B, G, G). Larger boxes are written first so that a small one sharing a centre
    cell keeps its box terms."""
    n = len(batch_boxes)
    heat = np.zeros((n, len(label_index), grid, grid), np.float32)
    box = np.zeros((n, 4, grid, grid), np.float32)
    centre = np.zeros((n, grid, grid), bool)
    for i, boxes in enumerate(batch_boxes):
        for label, (x0, y0, x1, y1) in sorted(boxes, key=lambda lb: -(lb[1][2] - lb[1][0]) * (lb[1][3] - lb[1][1])):
            if label not in label_index:
                continue
            cx, cy = (x0 + x1) / 2 / STRIDE, (y0 + y1) / 2 / STRIDE
            w, h = max((x1 - x0) / STRIDE, 0.25), max((y1 - y0) / STRIDE, 0.25)
            ix, iy = min(int(cx), grid - 1), min(int(cy), grid - 1)
            sigma = max(0.5, min(w, h) / 6)
            r = int(math.ceil(3 * sigma))
            ys, xs = np.arange(max(0, iy - r), min(grid, iy + r + 1)), np.arange(max(0, ix - r), min(grid, ix + r + 1))
            g = np.exp(-((xs[None, :] - ix) ** 2 + (ys[:, None] - iy) ** 2) / (2 * sigma * sigma))
            sub = heat[i, label_index[label], ys[0]:ys[-1] + 1, xs[0]:xs[-1] + 1]
            np.maximum(sub, g, out=sub)
            box[i, :, iy, ix] = (cx - ix, cy - iy, math.log(w), math.log(h))
            centre[i, iy, ix] = True
    return heat, box, centre


def focal_loss(logits, gt):
    """CenterNet's penalty-reduced pixel-wise focal loss (alpha 2, beta 4), per object."""
    import torch

    p = logits.sigmoid().clamp(1e-4, 1 - 1e-4)
    pos = gt.eq(1).float()
    pos_loss = -torch.log(p) * (1 - p) ** 2 * pos
    neg_loss = -torch.log(1 - p) * p ** 2 * (1 - gt) ** 4 * (1 - pos)
    return (pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp(min=1)


# ----------------------------------------------------------------------------------------------
# Validation: per-label detection quality at every candidate threshold.
# ----------------------------------------------------------------------------------------------
def predict(net, pixels: np.ndarray, config: GrounderConfig, device: str, batch: int = 16):
    """Heatmap probabilities and box terms for every image (CPU tensors)."""
    import torch

    heats, regs = [], []
    net.eval()
    with torch.no_grad():
        for k in range(0, len(pixels), batch):
            x = _normalise(pixels[k:k + batch], config).to(device)
            h, r = net(x)
            heats.append(h.sigmoid().cpu())
            regs.append(r.cpu())
    return torch.cat(heats), torch.cat(regs)


def validate(net, pixels: np.ndarray, boxes: list, config: GrounderConfig, device: str) -> dict[str, Any]:
    """Per label: detection precision/recall/F1 (:mod:`~tool_backends.finetune.quality` match rule)
    and image-level presence accuracy at each threshold; the threshold with the best macro-F1."""
    from tool_backends.engines.centernet import decode

    labels = list(config.labels)
    heat, reg = predict(net, pixels, config, device)
    counts = {t: {lab: [0, 0, 0, 0, 0] for lab in labels} for t in THRESHOLDS}  # tp fp fn presence_ok images
    for i in range(len(pixels)):
        for j, lab in enumerate(labels):
            found = decode(heat[i], reg[i], [j], labels, THRESHOLDS[0], 20, (1.0, 1.0))
            gold = [b for label, b in boxes[i] if label == lab]
            for t in THRESHOLDS:
                pred = [d["bbox"] for d in found if d["score"] >= t]
                tp, fp, fn = match_boxes(pred, gold)
                c = counts[t][lab]
                c[0] += tp
                c[1] += fp
                c[2] += fn
                c[3] += int(bool(pred) == bool(gold))
                c[4] += 1
    present = [lab for lab in labels if counts[THRESHOLDS[0]][lab][0] + counts[THRESHOLDS[0]][lab][2] > 0]

    def macro_f1(t: float) -> float:
        scores = [prf(*counts[t][lab][:3])["f1"] or 0.0 for lab in present]
        return float(np.mean(scores)) if scores else 0.0

    best = max(THRESHOLDS, key=lambda t: (round(macro_f1(t), 6), -abs(t - 0.3)))
    per_label = {}
    for lab in labels:
        tp, fp, fn, presence_ok, n = counts[best][lab]
        per_label[lab] = {**prf(tp, fp, fn), "presence_accuracy": round(presence_ok / max(1, n), 4), "n_gold": tp + fn}
    return {"threshold": best, "macro_f1": round(macro_f1(best), 4), "n_images": len(pixels),
            "macro_f1_by_threshold": {str(t): round(macro_f1(t), 4) for t in THRESHOLDS}, "per_label": per_label}


def _normalise(batch: np.ndarray, config: GrounderConfig):
    import torch

    x = torch.from_numpy(np.ascontiguousarray(batch)).permute(0, 3, 1, 2).float() / 255.0
    return (x - config.mean) / config.std


# ----------------------------------------------------------------------------------------------
# Training.
# ----------------------------------------------------------------------------------------------
def train_ground(args: FinetuneArgs, out: str) -> dict[str, Any]:
    """Train, choose the threshold on validation data, save to ``out``; the provenance dict."""
    import torch

    from medvqa_env.config import parse_options

    steps = int(args.steps if args.steps is not None else RECIPE["steps"])
    lr = float(args.lr if args.lr is not None else RECIPE["lr"])
    size = RECIPE["image_size"]
    images = annotated_images(args.dataset, args.split, parse_options(args.dataset_opt, "--dataset-opt"),
                              limit=args.max_images)
    images, val_images, val_from = validation_images(args, images)
    pixels, boxes = load_pixels_and_boxes(images, size)
    counts = label_counts([[label for label, _ in b] for b in boxes])
    if not counts:
        raise DatasetError(f"{args.dataset!r} split {args.split!r}: no boxes (or masks) to train ground on")
    labels = sorted(counts)
    config = GrounderConfig(labels=labels, image_size=size, width=RECIPE["width"])
    index = {lab: i for i, lab in enumerate(labels)}
    rng = np.random.default_rng(args.seed)
    max_shift = size // 32
    log.info("ground: training on %d images of %s/%s, %d labels, %d steps", len(images), args.dataset, args.split,
             len(labels), steps)
    with training_run(args.seed, args.torch_threads) as clock:
        net = build_net(config).to(args.device).train()
        opt, sched = one_cycle(net.parameters(), lr, steps)
        bar, final_loss = step_bar("ground", steps, args.progress), None
        for step in range(steps):
            idx = rng.integers(len(images), size=min(args.batch_size, len(images)))
            batch, batch_boxes = [], []
            for i in idx:
                p, b = shift(pixels[i], boxes[i], *(int(v) for v in rng.integers(-max_shift, max_shift + 1, 2)), size)
                batch.append(p)
                batch_boxes.append(b)
            x = _normalise(np.stack(batch), config)
            gain = torch.from_numpy(rng.uniform(0.9, 1.1, (len(idx), 1, 1, 1)).astype(np.float32))
            bias = torch.from_numpy(rng.uniform(-0.1, 0.1, (len(idx), 1, 1, 1)).astype(np.float32))
            x = (x * gain + bias).to(args.device)
            heat_t, box_t, centre = (torch.from_numpy(a).to(args.device) for a in targets(batch_boxes, index, config.grid))
            heat, box = net(x)
            centre_cells = centre.unsqueeze(1).expand_as(box)
            box_loss = (box[centre_cells] - box_t[centre_cells]).abs().mean() if centre.any() else box.sum() * 0
            loss = focal_loss(heat, heat_t) + box_loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
            opt.step()
            sched.step()
            final_loss = float(loss.detach())
            show_loss(bar, final_loss)
            if step % 50 == 0 or step == steps - 1:
                log.debug("ground: step %d/%d loss %.4f", step + 1, steps, final_loss)
        bar.close()
        net.eval()
    if val_images:
        val_pixels, val_boxes = load_pixels_and_boxes(val_images, size)
        validation = validate(net, val_pixels, val_boxes, config, args.device)
        config.threshold = float(validation["threshold"])
    else:
        validation = {"threshold": config.threshold, "note": "no validation images; default threshold kept"}
    validation["source"] = val_from
    save_grounder(net, config, out)
    info = provenance("ground", "centernet", args, steps=steps, lr=lr, n_images=len(images), labels=labels,
                      label_counts=counts, clock=clock, validation=validation, final_loss=final_loss,
                      threshold=config.threshold, image_size=size)
    write_info(out, info)
    return info
