"""``SamSegmenter.segment_batch``: one image-encoder forward for distinct images, the same masks
as one call at a time (pixel for pixel), for box, point and mixed prompts."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tool_backends.engines.hf_sam import SamSegmenter


@pytest.fixture(scope="module")
def sam():
    return SamSegmenter()  # the tiny random SAM: the same processor -> forward -> post-processing code


def distinct_images(scene, vqa_rad=None) -> list[Image.Image]:
    """Distinct images of different sizes and aspect ratios (real VQA-RAD scans when present)."""
    base = scene.image
    images = [base, base.resize((200, 90)), base.transpose(Image.Transpose.FLIP_LEFT_RIGHT).resize((96, 160)),
              base.rotate(90, expand=True), base.crop((10, 5, 150, 115)).resize((300, 236))]
    if vqa_rad is not None:
        paths = sorted((vqa_rad / "images").iterdir())[:3]
        for p in paths:  # at most 512 px a side: the test is about the batch, not about upsampling big masks
            im = Image.open(p).convert("RGB")
            im.thumbnail((512, 512))
            images.append(im)
    return images


def prompts(images: list[Image.Image]) -> list[dict]:
    calls = []
    for i, im in enumerate(images):
        w, h = im.size
        box = [w * 0.2, h * 0.25, w * 0.7, h * 0.8]
        point = [w * 0.4, h * 0.5]
        kind = i % 3  # box, point, both
        calls.append({"image": im, "box": box if kind != 1 else None, "point": point if kind != 0 else None})
    return calls


def test_batch_gives_each_call_its_own_mask_pixel_for_pixel(sam, scene):
    calls = prompts(distinct_images(scene))
    batched = sam.segment_batch(calls)
    alone = [sam.segment(c["image"], box=c["box"], point=c["point"]) for c in calls]
    assert len(batched) == len(calls)
    for c, b, a in zip(calls, batched, alone):
        assert b.shape == (c["image"].size[1], c["image"].size[0]) and b.dtype == bool
        assert np.array_equal(b, a)
    assert any(m.any() for m in batched) and any(not m.all() for m in batched)  # masks, not a constant
    # and different images (or prompts) give different masks: the batch does not mix its rows up
    assert len({m.tobytes() for m in batched}) == len(batched)


def test_batch_on_real_scans(sam, scene, vqa_rad_root):
    calls = prompts(distinct_images(scene, vqa_rad_root))
    for c, b in zip(calls, sam.segment_batch(calls[::-1])[::-1]):  # another order: still each call's mask
        assert np.array_equal(b, sam.segment(c["image"], box=c["box"], point=c["point"]))


def test_one_encoder_forward_for_the_whole_batch(sam, scene, monkeypatch):
    seen = []
    encoder = sam.model.get_image_embeddings

    def counting(pixel_values, **kw):
        seen.append(pixel_values.shape[0])
        return encoder(pixel_values, **kw)

    monkeypatch.setattr(sam.model, "get_image_embeddings", counting)
    sam.segment_batch(prompts(distinct_images(scene)))
    assert seen == [5]
    assert sam.segment_batch([]) == []


def test_batched_image_embeddings_are_each_images_own_bit_for_bit(sam, scene, vqa_rad_root):
    """What makes the masks identical: every row of the batched encoder's output has the bits the
    encoder gives that image alone (oneDNN's convolutions alone would round differently by batch
    size: ``rowwise_convolutions``). Masks only show it where a logit sits at the threshold."""
    import torch

    from tool_backends.engines.hf_sam import rowwise_convolutions

    images = distinct_images(scene, vqa_rad_root)
    pixels = [sam._prepare(im, None, None).pixel_values for im in images]
    with torch.no_grad():
        alone = [sam.model.get_image_embeddings(p) for p in pixels]
        with rowwise_convolutions(sam.model.vision_encoder):
            batched = sam.model.get_image_embeddings(torch.cat(pixels))
    assert all(torch.equal(batched[i:i + 1], a) for i, a in enumerate(alone))
