"""Annotation mask files a client names in a call's ``context`` (issue 40, attack 6): read as image
``path`` entries are, checked on the open descriptor when the tool opens them, not by name when
the request arrives. Before, the server checked the name (under a root, a regular file) and the
oracle opened it later with ``open()``: a file swapped for a symlink out, or for a FIFO, in
between was followed (the outside mask leaked) or blocked the worker forever."""

from __future__ import annotations

import os
import threading
import time

import pytest
from PIL import Image

from tool_backends.registry import build_tool
from tool_backends.server import ServerSettings, ToolService
from tool_backends.toolbox import LocalBackend

SIZE = (48, 48)
IMAGE = Image.new("RGB", SIZE, (90, 90, 90))
BOX = [4, 4, 44, 44]


def mask_file(path, box) -> None:
    m = Image.new("L", SIZE, 0)
    m.paste(255, box)
    m.save(path, format="PNG")


@pytest.fixture
def layout(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    mask_file(root / "mask.png", (10, 10, 30, 30))  # 400 px: the client's own mask
    mask_file(outside / "secret.png", (5, 5, 40, 40))  # 1225 px: a file outside the roots
    service = ToolService({"segment": LocalBackend([build_tool("segment", engine="oracle")])},
                          ServerSettings(image_roots=(str(root),)))
    return root, outside, service


def call(service, path):
    """The request's checks (decode, context), then the tool run, as the server does them."""
    body = {"tool": "segment", "arguments": {"bbox": BOX},
            "context": {"annotations": {"masks": [{"label": "lesion", "path": str(path)}]}}}
    ctx = service.context(body["context"])
    return ctx, lambda: service.run("segment", body["arguments"], [IMAGE], ctx)


def area(result) -> int:
    assert result.ok, result.error
    return result.data.get("area_px", 0)


def test_the_clients_own_mask_under_the_root_is_read(layout):
    root, _, service = layout
    _, run = call(service, root / "mask.png")
    assert area(run()) == 400


def test_a_mask_swapped_for_a_symlink_out_after_the_request_is_checked_is_not_followed(layout):
    """Today's server checked the name on arrival; swapped for a symlink before the tool opened it,
    the outside mask (1225 px) came back."""
    root, outside, service = layout
    _, run = call(service, root / "mask.png")
    os.replace(root / "mask.png", root / "old.png")
    os.symlink(outside / "secret.png", root / "mask.png")
    assert area(run()) == 0


def test_a_mask_swapped_for_a_fifo_after_the_check_does_not_block_the_worker(layout):
    """Today's oracle opened the swapped-in FIFO with ``open()``: the worker blocked for good."""
    root, _, service = layout
    _, run = call(service, root / "mask.png")
    os.unlink(root / "mask.png")
    os.mkfifo(root / "mask.png")
    out: list = []
    worker = threading.Thread(target=lambda: out.append(run()), daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # unblock the stuck open() so the test process can end
        fd = os.open(root / "mask.png", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(5)
        pytest.fail("the FIFO mask blocked the worker")
    assert area(out[0]) == 0


@pytest.mark.parametrize("case", ["device", "oversize", "outside", "nul"])
def test_devices_huge_files_outside_paths_and_nul_bytes_are_refused_unread(layout, tmp_path, case):
    root, outside, service = layout
    if case == "device":
        service.settings.image_roots = (str(root), "/dev")
        path = "/dev/zero"  # read until MemoryError if it were opened and read
    elif case == "oversize":
        path = root / "huge.png"
        with open(path, "wb") as f:
            f.truncate(1 << 30)  # sparse 1 GiB
    elif case == "outside":
        path = outside / "secret.png"
    else:
        path = f"{root / 'mask.png'}\x00"
    start = time.monotonic()
    _, run = call(service, path)
    assert area(run()) == 0
    assert time.monotonic() - start < 2


def test_the_reader_holds_only_inside_the_servers_tool_run(layout):
    """Outside a server's call (a local dataset's own annotations) the mask is read as the caller
    named it; the server's descriptor checks are bound to its own tool run."""
    from tool_backends.masks import load_mask

    root, outside, service = layout
    assert load_mask(str(outside / "secret.png"), SIZE).sum() == 1225
    assert area(service.run("segment", {"bbox": BOX}, [IMAGE],
                            call(service, outside / "secret.png")[0])) == 0
