"""Image loading refuses missing, truncated, corrupt and decompression-bomb files with clear errors."""

from __future__ import annotations

import io
import zlib
import struct

import numpy as np
import pytest
from PIL import Image

from medvqa_env.env import MedVQAEnv
from medvqa_env.errors import DatasetError
from medvqa_env.images import decode_image, load_image
from medvqa_env.records import AnswerType, VQADataset, VQARecord
from rewards import RuleReward


def png_bytes(w=32, h=24) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 127, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def bomb_png(side: int = 20000) -> bytes:
    """A valid 1-bit PNG header claiming side x side pixels; tiny on disk (a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = zlib.compress(b"\x00" * ((side // 8 + 1) * 64))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)) + \
        chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def test_good_image_is_rgb(tmp_path):
    p = tmp_path / "a.png"
    p.write_bytes(png_bytes())
    img = load_image(p, "r1")
    assert img.mode == "RGB" and img.size == (32, 24)


@pytest.mark.parametrize("payload, fragment", [
    (png_bytes()[:60], "not a readable image"),          # truncated
    (b"GIF89a garbage" * 10, "not a readable image"),     # corrupt
    (b"", "not a readable image"),                        # empty file
    (bomb_png(), "over the limit"),                       # decompression bomb
])
def test_bad_files_name_record_and_file(tmp_path, payload, fragment):
    p = tmp_path / "bad.png"
    p.write_bytes(payload)
    with pytest.raises(DatasetError) as err:
        load_image(p, "rec_7")
    assert fragment in str(err.value) and "rec_7" in str(err.value) and "bad.png" in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match="rec_1.*does not exist"):
        load_image(tmp_path / "nope.jpg", "rec_1")


def test_pixel_limit_is_configurable():
    with pytest.raises(DatasetError, match="over the limit of 100"):
        decode_image(png_bytes(), max_pixels=100)


def test_env_reset_on_a_corrupt_image_raises_dataset_error_and_env_survives(tmp_path):
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    good.write_bytes(png_bytes())
    bad.write_bytes(png_bytes()[:50])
    ds = VQADataset([VQARecord("ok", (str(good),), "q?", "yes", AnswerType.CLOSED, "t"),
                     VQARecord("broken", (str(bad),), "q?", "yes", AnswerType.CLOSED, "t")])
    env = MedVQAEnv(dataset=ds, reward=RuleReward())
    with pytest.raises(DatasetError, match="broken"):
        env.reset(options={"index": 1})
    env.reset(options={"index": 0})
    assert env.step(r"\boxed{yes}")[1] == 1.0
