"""Files the server opens for its clients (issue 40, attack 6): checked on the open descriptor, so
a file swapped for a symlink mid-request, a FIFO, a device or a huge file under an image root is
refused without being read; ``--result-dir`` deletes only what the server wrote there."""

from __future__ import annotations

import os
import threading
import time

import pytest
from PIL import Image

from medvqa_env.images import image_digest
from tool_backends.limits import ResultDir
from tool_backends.wire import WireError, decode_image_entry, encode_image

INSIDE = Image.new("RGB", (16, 16), (0, 0, 255))
OUTSIDE = Image.new("RGB", (16, 16), (255, 0, 0))


@pytest.fixture
def layout(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    INSIDE.save(root / "real.png")
    OUTSIDE.save(outside / "secret.png")
    return root, outside


def test_a_file_swapped_for_a_symlink_mid_request_never_leaks_the_outside_file(layout):
    """Today's server checked the name, then opened it: 84 of 3,000 requests got the outside image."""
    root, outside = layout
    target, stop = root / "swap.png", threading.Event()

    def swapper():
        while not stop.is_set():
            tmp = root / "swap.tmp"
            try:
                INSIDE.save(tmp, format="PNG")
                os.replace(tmp, target)
                os.symlink(outside / "secret.png", root / "swap.lnk")
                os.replace(root / "swap.lnk", target)
            except OSError:
                pass

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    seen = {"inside": 0, "outside": 0, "refused": 0}
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and sum(seen.values()) < 3000:
            try:
                image = decode_image_entry({"path": str(target)}, [str(root)])
            except (PermissionError, WireError):
                seen["refused"] += 1
                continue
            seen["inside" if image_digest(image.convert("RGB")) == image_digest(INSIDE) else "outside"] += 1
    finally:
        stop.set()
        thread.join(5)
    assert seen["outside"] == 0 and seen["inside"] > 0 and seen["refused"] > 0, seen


def test_a_symlink_inside_the_root_to_a_file_inside_it_still_works(layout):
    root, _ = layout
    (root / "link_in.png").symlink_to(root / "real.png")
    assert decode_image_entry({"path": str(root / "link_in.png")}, [str(root)]).size == (16, 16)


def test_a_fifo_under_the_root_is_refused_without_blocking(layout):
    root, _ = layout
    os.mkfifo(root / "pipe.png")
    start = time.monotonic()
    with pytest.raises(WireError, match="not a regular file"):
        decode_image_entry({"path": str(root / "pipe.png")}, [str(root)])
    assert time.monotonic() - start < 1


def test_a_device_under_a_root_is_never_read():
    with pytest.raises(WireError, match="not a regular file"):
        decode_image_entry({"path": "/dev/zero"}, ["/dev"])


def test_a_huge_file_under_the_root_is_refused_from_its_size_unread(layout):
    """A 127-byte request naming a 1 GiB file cost the server +1 GiB."""
    root, _ = layout
    with open(root / "huge.png", "wb") as f:
        f.truncate(1 << 30)  # sparse: no disk used
    start = time.monotonic()
    with pytest.raises(WireError, match="over the limit"):
        decode_image_entry({"path": str(root / "huge.png")}, [str(root)], max_pixels=4_000_000)
    assert time.monotonic() - start < 0.5


def test_the_result_dir_never_deletes_what_the_server_did_not_write(tmp_path):
    """Today's server counted (and deleted, oldest first) the files already in the folder."""
    theirs = []
    for i in range(5):
        path = tmp_path / f"{i:032x}.bmp"
        Image.new("RGB", (200, 200), (i, 0, 0)).save(path)
        theirs.append(path)
    store = ResultDir(tmp_path, max_bytes=300_000)
    mine = []
    for i in range(6):
        written: list[str] = []
        entry = encode_image(Image.new("RGB", (200, 200), (0, i + 1, 0)), "path", tmp_path, written=written)
        assert written == [entry["path"]]
        for path in written:
            store.wrote(path)
        mine.append(entry["path"])
    assert all(p.exists() for p in theirs)
    assert os.path.exists(mine[-1]) and sum(os.path.exists(p) for p in mine) < len(mine)  # its own are bounded
