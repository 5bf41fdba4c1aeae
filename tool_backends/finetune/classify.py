"""Train CLIP (transformers ``CLIPModel``) on a dataset's image-level labels
(``python -m tool_backends.finetune classify``); the folder loads with engine ``clip``.

The network is the tiny CLIP of :mod:`tool_backends.engines.hf_clip` with a larger input
(``RECIPE["image_size"]``, patch 16) so that more than the outline of an image survives, trained
from its random initialisation. The text side reads ``ClipClassifier``'s template
(``"a medical image of {}"``) around each label, as the engine will at inference.

Loss, matched to how the engine is used (a softmax over the labels a caller lists): for every
image and each of its labels, cross-entropy of that label against every trained label the image
does not carry plus ``N_DISTRACTORS`` distractor texts (random letters, and label words
recombined into phrases no image carries), so a label the model never saw (a caller's
"Ultrasound") does not outscore the trained ones by accident.
"""

from __future__ import annotations

import logging
import string
from typing import Any

import numpy as np

from medvqa_env.errors import DatasetError
from tool_backends.finetune.common import (FinetuneArgs, one_cycle, provenance, show_loss, step_bar, training_run,
                                           validation_images, write_info)
from tool_backends.finetune.data import annotated_images, label_counts, read_rgb

log = logging.getLogger(__name__)

RECIPE = {"steps": 200, "lr": 2e-3, "image_size": 128}
N_DISTRACTORS = 8
TEMPLATE = "a medical image of {}"


def tiny_clip_at(size: int, seed: int):
    """The engine's tiny CLIP config with a ``size``-pixel input: (model, processor, tokenizer)."""
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    from tool_backends.engines.hf_clip import _TEXT, _VISION
    from tool_backends.engines.hf_common import build_tiny, tiny_tokenizer

    config = CLIPConfig(text_config=_TEXT, vision_config={**_VISION, "image_size": size}, projection_dim=32)
    processor = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return build_tiny(lambda: CLIPModel(config), seed), processor, tiny_tokenizer(_TEXT["max_position_embeddings"])


def distractors(labels: list[str], rng: np.random.Generator, n: int) -> list[str]:
    """``n`` texts that are no trained label: random letters, and trained labels' words recombined.

    Any label set works, two one-word labels included (a phrase takes at most as many words as
    there are):

    >>> d = distractors(["CT", "MRI", "lesion"], np.random.default_rng(0), 6)
    >>> len(d), any(x in ("CT", "MRI", "lesion") for x in d)
    (6, False)
    >>> d = distractors(["normal", "pneumonia"], np.random.default_rng(0), 8)
    >>> len(d), len(set(d)), any(x in ("normal", "pneumonia") for x in d)
    (8, 8, False)
    """
    words = sorted({w for lab in labels for w in lab.split()})
    known = set(labels)
    out: list[str] = []
    while len(out) < n:
        if rng.random() < 0.5 or len(words) < 2:
            k = int(rng.integers(3, 11))
            text = "".join(rng.choice(list(string.ascii_letters), k))
        else:
            size = min(int(rng.integers(2, 4)), len(words))
            text = " ".join(rng.choice(words, size, replace=False))
        if text not in known and text not in out:
            out.append(text)
    return out


def validate(model, processor, tokenizer, images, labels: list[str], device: str) -> dict[str, Any]:
    """Top-1 accuracy per group of mutually exclusive labels seen in training (labels that never
    share an image), the way a caller asks: softmax over that group's labels."""
    import torch

    groups = exclusive_groups([im.labels for im in images], labels)
    correct = {tuple(g): [0, 0] for g in groups}
    model.eval()
    with torch.no_grad():
        text = tokenizer([TEMPLATE.format(lab) for lab in labels], padding="max_length", truncation=True,
                         max_length=tokenizer.model_max_length, return_tensors="pt")
        for im in images:
            pixels = processor(images=[read_rgb(im.path)[0]], return_tensors="pt")["pixel_values"].to(device)
            logits = model(input_ids=text["input_ids"].to(device), attention_mask=text["attention_mask"].to(device),
                           pixel_values=pixels).logits_per_image[0].cpu()
            for g in groups:
                truth = [lab for lab in g if lab in im.labels]
                if len(truth) != 1:
                    continue
                pick = max(g, key=lambda lab: float(logits[labels.index(lab)]))
                c = correct[tuple(g)]
                c[0] += int(pick == truth[0])
                c[1] += 1
    return {"n_images": len(images),
            "groups": [{"labels": list(g), "accuracy": round(c[0] / c[1], 4) if c[1] else None, "n": c[1]}
                       for g, c in correct.items()]}


def exclusive_groups(image_labels: list[tuple[str, ...]], labels: list[str]) -> list[list[str]]:
    """Labels in groups whose members never share an image (greedy, in label order: each label
    joins the first group it shares no image with); groups of one are dropped.

    >>> exclusive_groups([("CT", "lesion"), ("MRI", "no lesion"), ("CT", "no lesion")], ["CT", "MRI", "lesion", "no lesion"])
    [['CT', 'MRI'], ['lesion', 'no lesion']]
    """
    together = {(a, b) for labs in image_labels for a in labs for b in labs if a != b}
    groups: list[list[str]] = []
    for lab in labels:
        for g in groups:
            if all((lab, other) not in together for other in g):
                g.append(lab)
                break
        else:
            groups.append([lab])
    return [g for g in groups if len(g) > 1]


def train_classify(args: FinetuneArgs, out: str) -> dict[str, Any]:
    """Train, report validation accuracy per label group, save model + processor + tokenizer."""
    import torch
    from torch.nn import functional as F

    from medvqa_env.config import parse_options

    steps = int(args.steps if args.steps is not None else RECIPE["steps"])
    lr = float(args.lr if args.lr is not None else RECIPE["lr"])
    images = annotated_images(args.dataset, args.split, parse_options(args.dataset_opt, "--dataset-opt"),
                              limit=args.max_images)
    images = [im for im in images if im.labels]
    if not images:
        raise DatasetError(f"{args.dataset!r} split {args.split!r}: no image-level labels to train classify on")
    images, val_images, val_from = validation_images(args, images)
    val_images = [im for im in val_images if im.labels]
    counts = label_counts([im.labels for im in images])
    labels = sorted(counts)
    if len(labels) < 2:
        raise DatasetError(f"classify needs at least 2 distinct image labels to tell apart, got {labels}")
    size = RECIPE["image_size"]
    with training_run(args.seed, args.torch_threads) as clock:
        model, processor, tokenizer = tiny_clip_at(size, args.seed)
        pixels = processor(images=[read_rgb(im.path)[0] for im in images], return_tensors="pt")["pixel_values"]
        rng = np.random.default_rng(args.seed)
        model.to(args.device).train()
        opt, sched = one_cycle(model.parameters(), lr, steps)
        log.info("classify: training on %d images of %s/%s, labels %s, %d steps", len(images), args.dataset,
                 args.split, labels, steps)
        bar, final_loss = step_bar("classify", steps, args.progress), None
        for step in range(steps):
            idx = rng.integers(len(images), size=min(args.batch_size, len(images)))
            texts = labels + distractors(labels, rng, N_DISTRACTORS)
            tok = tokenizer([TEMPLATE.format(t) for t in texts], padding="max_length", truncation=True,
                            max_length=tokenizer.model_max_length, return_tensors="pt")
            logits = model(input_ids=tok["input_ids"].to(args.device), attention_mask=tok["attention_mask"].to(args.device),
                           pixel_values=pixels[idx].to(args.device)).logits_per_image  # (B, texts)
            rows, cols, masks = [], [], []
            for b, i in enumerate(idx):
                own = [labels.index(lab) for lab in images[i].labels]
                for j in own:  # this label against every text the image does not carry
                    keep = torch.ones(len(texts), dtype=torch.bool)
                    keep[own] = False
                    keep[j] = True
                    rows.append(b)
                    cols.append(j)
                    masks.append(keep)
            masked = logits[rows].masked_fill(~torch.stack(masks).to(logits.device), float("-inf"))
            loss = F.cross_entropy(masked, torch.tensor(cols, device=logits.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            sched.step()
            final_loss = float(loss.detach())
            show_loss(bar, final_loss)
            if step % 50 == 0 or step == steps - 1:
                log.debug("classify: step %d/%d loss %.4f", step + 1, steps, final_loss)
        bar.close()
        model.eval()
    validation = (validate(model, processor, tokenizer, val_images, labels, args.device) if val_images
                  else {"note": "no validation images"})
    validation["source"] = val_from
    model.save_pretrained(out)
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = provenance("classify", "clip", args, steps=steps, lr=lr, n_images=len(images), labels=labels,
                      label_counts=counts, clock=clock, validation=validation, final_loss=final_loss, template=TEMPLATE, image_size=size)
    write_info(out, info)
    return info
