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


# ---- issue 12: every pixel mode, clear messages --------------------------------------------
def test_16bit_greyscale_png_is_windowed_not_clipped(tmp_path):
    """Pillow's convert("RGB") clips a 16-bit PNG at 255: a CT-like ramp became almost all white."""
    ramp = np.linspace(0, 4095 * 16, 64 * 48).reshape(48, 64).astype(np.uint16)
    p = tmp_path / "xr16.png"
    Image.fromarray(ramp).save(p)
    out = np.asarray(load_image(p, "r16"))[..., 0].astype(int)
    assert (out == 255).mean() < 0.02 and (out == 0).mean() < 0.02
    assert np.all(np.diff(out.ravel()) >= 0) and out.max() - out.min() == 255  # order and full range kept


def test_float_and_32bit_images_keep_their_contrast(tmp_path):
    values = np.linspace(-1000.0, 1000.0, 32 * 32).reshape(32, 32)
    for name, arr in [("f.tif", values.astype(np.float32)), ("i.tif", values.astype(np.int32))]:
        Image.fromarray(arr).save(tmp_path / name)
        out = np.asarray(load_image(tmp_path / name, "rf"))[..., 0].astype(int)
        assert out[0, 0] == 0 and out[-1, -1] == 255 and 100 < out[16, 16] < 155, name


def test_window_fragment_on_a_16bit_png(tmp_path):
    values = np.array([[0, 1000, 2000, 3000]], dtype=np.uint16).repeat(4, 0)
    p = tmp_path / "w.png"
    Image.fromarray(values).save(p)
    assert np.asarray(load_image(f"{p}#window=1500,3000", "rw"))[0, :, 0].tolist() == [0, 85, 170, 255]
    assert np.asarray(load_image(f"{p}#window=1500,1000", "rw"))[0, :, 0].tolist() == [0, 0, 255, 255]


def test_a_directory_is_named_as_one(tmp_path):
    with pytest.raises(DatasetError, match="rec_d.*is a directory, not an image file"):
        load_image(tmp_path, "rec_d")


def test_messages_hold_no_python_object_reprs_and_one_pixel_limit(tmp_path):
    p = tmp_path / "junk.png"
    p.write_bytes(b"\x00junk" * 50)
    with pytest.raises(DatasetError) as err:
        load_image(p, "rec_j")
    assert "object at 0x" not in str(err.value)
    with pytest.raises(DatasetError) as err:
        decode_image(bomb_png(), "bomb.png")
    limits = {int(n) for n in __import__("re").findall(r"\d{6,}", str(err.value))}
    assert limits == {64_000_000}, str(err.value)
