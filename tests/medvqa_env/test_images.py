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


# ---- the decoded-image cache the env copies of a worker share -----------------------------------
def _write_png(path, value, w=32, h=24):
    Image.fromarray(np.full((h, w, 3), value, dtype=np.uint8)).save(path)


def test_image_cache_decodes_a_file_once_and_gives_the_same_pixels(tmp_path):
    from medvqa_env.images import ImageCache, image_digest, image_pixels

    p = tmp_path / "a.png"
    _write_png(p, 90)
    cache = ImageCache()
    first, again = cache.load(p, "r1"), cache.load(p, "r1")
    assert first is again and (cache.hits, cache.misses) == (1, 1)
    assert first.tobytes() == load_image(p).tobytes()
    pixels = image_pixels(first)
    assert pixels.tobytes() == first.tobytes() and not pixels.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        pixels[0, 0, 0] = 1
    assert image_digest(first) == image_digest(first.copy())  # hashed from the array, same digest


def test_image_cache_reads_a_changed_file_again(tmp_path):
    import os

    from medvqa_env.images import ImageCache

    p = tmp_path / "a.png"
    _write_png(p, 10)
    cache = ImageCache()
    before = cache.load(p)
    _write_png(p, 200)
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a coarse clock may not tick between writes
    after = cache.load(p)
    assert after is not before and after.getpixel((0, 0)) == (200, 200, 200) and cache.misses == 2


def test_image_cache_is_bounded_and_keeps_the_recently_used(tmp_path):
    from medvqa_env.images import ImageCache

    paths = [tmp_path / f"{i}.png" for i in range(3)]
    for i, p in enumerate(paths):
        _write_png(p, 10 * i)
    cache = ImageCache(max_bytes=2 * 32 * 24 * 7)  # room for two 32x24 images
    a, b = cache.load(paths[0]), cache.load(paths[1])
    cache.load(paths[0])  # a is now the most recent
    cache.load(paths[2])  # evicts b
    assert len(cache) == 2 and cache.nbytes <= cache.max_bytes
    assert cache.load(paths[0]) is a and cache.load(paths[1]) is not b
    big = ImageCache(max_bytes=100)
    assert big.load(paths[0]) is not big.load(paths[0]) and len(big) == 0  # larger than the bound: not kept


def test_image_cache_never_keeps_a_failure(tmp_path):
    import pickle

    from medvqa_env.images import ImageCache

    p = tmp_path / "a.png"
    cache = ImageCache()
    with pytest.raises(DatasetError, match="record 'r9'.*does not exist"):
        cache.load(p, "r9")
    p.write_bytes(png_bytes()[:40])
    with pytest.raises(DatasetError, match="record 'r9'"):
        cache.load(p, "r9")
    _write_png(p, 5)
    assert cache.load(p, "r9").getpixel((0, 0)) == (5, 5, 5)
    copy = pickle.loads(pickle.dumps(cache))
    assert len(copy) == 0 and copy.max_bytes == cache.max_bytes


def test_env_copies_sharing_services_decode_a_question_image_once(tmp_path):
    from medvqa_env.services import EnvServices

    p = tmp_path / "a.png"
    _write_png(p, 77)
    ds = VQADataset([VQARecord("q", (str(p),), "Is it?", "yes", AnswerType.CLOSED, "t")])
    services = EnvServices.build(tools=[], reward=RuleReward())
    envs = [MedVQAEnv(ds, services=services) for _ in range(3)]
    obs = [env.reset(options={"index": 0})[0]["images"][0] for env in envs]
    assert services.images.misses == 1 and services.images.hits == 2
    assert envs[0].images[0] is envs[2].images[0]
    assert all(np.array_equal(o, obs[0]) for o in obs) and not np.shares_memory(obs[0], obs[1])
    obs[0][0, 0] = 0  # each observation is the caller's own, writable copy
    assert obs[1][0, 0, 0] == 77 and envs[0].images[0].getpixel((0, 0)) == (77, 77, 77)
