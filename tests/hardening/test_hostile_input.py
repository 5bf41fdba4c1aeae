"""Hostile input against a real tool server (and router): oversized and streamed bodies,
decompression bombs and broken images inside requests, unicode and control characters in tool
arguments and turns, and file paths that try to leave the image roots.

``tests/tool_backends/test_server.py`` covers the basic 4xx cases (bad JSON, unknown tool, bad
base64, a Content-Length over the limit, ``/etc/passwd``); these go further.
"""

from __future__ import annotations

import base64
import io
import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from tool_backends.wire import encode_image

MiB = 1024 * 1024


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


GOOD = Image.radial_gradient("L").resize((64, 48)).convert("RGB")


def call_body(image_entry=None, tool="segment", arguments=None, **extra) -> dict:
    entry = image_entry if image_entry is not None else encode_image(GOOD)
    return {"tool": tool, "arguments": arguments if arguments is not None else {"bbox": [4, 4, 40, 40]},
            "images": [entry], **extra}


@pytest.fixture(scope="module")
def http(tool_server):
    with httpx.Client(base_url=tool_server.url, timeout=60) as client:
        yield client
    assert httpx.get(tool_server.url + "/health", timeout=10).status_code == 200


# ---- size limits ------------------------------------------------------------------------------
def test_a_streamed_body_without_content_length_is_cut_off_at_the_limit(http):
    """Chunked upload, no Content-Length to refuse early: the server stops reading at 4 MiB."""
    sent = {"n": 0}

    def chunks():
        for _ in range(64):  # 16 MiB offered
            sent["n"] += 256 * 1024
            yield b" " * (256 * 1024)

    r = http.post("/call", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "over the limit" in r.json()["detail"]


def test_a_lying_content_length_does_not_get_past_the_limit(tool_server):
    """Content-Length says 10 bytes; the body is 6 MiB. h11 refuses it before the app sees it."""
    import socket

    body = b"{" + b" " * (6 * MiB) + b"}"
    head = (f"POST /call HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: 10\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", tool_server.port), timeout=30) as s:
        s.sendall(head + body[:10])
        reply = s.recv(65536).decode(errors="replace")
    assert reply.startswith("HTTP/1.1 400")  # the 10 bytes are not JSON; the rest is never read as a body


# ---- images inside requests -------------------------------------------------------------------
def _bomb() -> bytes:
    """A PNG whose header claims 30000x30000 pixels (900 M) in a few hundred bytes."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 30_000, 30_000, 1, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (1 + 30_000 // 8) * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def _big_grey() -> bytes:
    return png_bytes(Image.new("L", (9_000, 9_000)))  # 81 M pixels, over the 64 M default


def _truncated() -> bytes:
    data = png_bytes(GOOD)
    return data[: len(data) // 2]


def _bad_crc() -> bytes:
    data = bytearray(png_bytes(GOOD))
    data[40] ^= 0xFF  # inside IDAT
    return bytes(data)


def _truncated_jpeg() -> bytes:
    buf = io.BytesIO()
    GOOD.save(buf, format="JPEG")
    return buf.getvalue()[:300]


@pytest.mark.parametrize("make,message", [
    (_bomb, "decompression bomb"),
    (_big_grey, "over the limit"),
    (_truncated, "not a readable image"),
    (_bad_crc, "not a readable image"),
    (_truncated_jpeg, "not a readable image"),
    (lambda: b"", "not a readable image"),
    (lambda: os.urandom(4096), "not a readable image"),
    (lambda: b"GIF89a" + b"\xff" * 64, "not a readable image"),
])
def test_broken_and_bomb_images_in_a_request_get_400(http, tool_server, make, message):
    before = tool_server.rss_bytes()
    body = call_body({"png": base64.b64encode(make()).decode()})
    r = http.post("/call", json=body)
    assert r.status_code == 400 and message in r.json()["detail"], r.text[:300]
    assert tool_server.rss_bytes() - before < 200 * MiB, "a refused image must not be allocated"


def test_raw_images_that_lie_about_their_size_get_400(http):
    for size in ([10 ** 9, 10 ** 9], [True, 1], [-1, 4], [3, 4, 5], "64x48", [2.5, 4]):
        r = http.post("/call", json=call_body({"raw": "AAAA", "size": size}))
        assert r.status_code == 400, (size, r.text)


def test_the_pixel_limit_is_configurable(server_factory):
    server = server_factory("serve", ["--tools", "image_zoom_in", "--max-pixels", "5000"])
    small, big = Image.new("RGB", (50, 50)), Image.new("RGB", (80, 80))
    with httpx.Client(base_url=server.url, timeout=30) as client:
        ok = client.post("/call", json=call_body(encode_image(small), tool="image_zoom_in",
                                                 arguments={"bbox": [0, 0, 40, 40]}))
        refused = client.post("/call", json=call_body(encode_image(big), tool="image_zoom_in",
                                                      arguments={"bbox": [0, 0, 40, 40]}))
        raw = client.post("/call", json=call_body(encode_image(big, "raw"), tool="image_zoom_in",
                                                  arguments={"bbox": [0, 0, 40, 40]}))
    assert ok.status_code == 200 and ok.json()["result"]["error"] is None
    assert refused.status_code == 400 and "over the limit of 5000" in refused.json()["detail"]
    assert raw.status_code == 400 and "over the limit of 5000" in raw.json()["detail"]


# ---- unicode and control characters -----------------------------------------------------------
HOSTILE_TEXT = st.text(alphabet=st.characters(codec="utf-8", categories=None), max_size=60) | st.sampled_from([
    "\x00", "\u202e\u2066evil", "\U0010ffff", "%s%n%x", "{{7*7}}", "'; DROP TABLE x; --",
    "</tool_call><tool_call>", "\r\n\r\nHTTP/1.1 200 OK", "A" * 10_000])


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(label=HOSTILE_TEXT, key=HOSTILE_TEXT, record=HOSTILE_TEXT)
def test_unicode_and_control_characters_in_arguments_are_data(http, label, key, record):
    body = call_body(arguments={"bbox": [4, 4, 40, 40], "label": label, key or "k": label},
                     context={"record_id": record, "question": label})
    r = http.post("/call", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text[:300]  # a refusal the model can read, never a 4xx/5xx
    result = r.json()["result"]
    assert isinstance(result["text"], str)
    if key and key not in ("bbox", "label", "point", "image_index", "coordinates"):
        assert result["error"], "an unknown argument is refused (additionalProperties: false)"


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=HOSTILE_TEXT)
def test_hostile_turn_text_over_get_observation(http, text):
    turns = [text, f"<tool_call>{text}</tool_call>",
             '<tool_call>{"name": %s, "arguments": {"label": %s}}</tool_call>' % (json.dumps(text), json.dumps(text))]
    r = http.post("/get_observation", json={"actions": turns, "extra_fields": [{"images": [encode_image(GOOD)]}] * 3})
    assert r.status_code == 200, r.text[:300]
    out = r.json()
    assert len(out["observations"]) == 3 and all(isinstance(v, bool) for v in out["valids"])


def test_lone_surrogates_and_nul_in_raw_json_are_handled(http):
    raw = ('{"tool": "segment", "arguments": {"label": "\\ud800\\u0000\\udfff", "bbox": [4, 4, 40, 40]}, '
           '"images": [%s], "context": {"record_id": "\\ud83d"}}' % json.dumps(encode_image(GOOD)))
    r = http.post("/call", content=raw.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["result"]["error"] is None


# ---- paths --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def layout(tool_server, tmp_path_factory):
    """Real images inside the root, outside it, behind symlinks and in a look-alike sibling folder."""
    root = tool_server.image_root
    outside = tmp_path_factory.mktemp("outside")
    GOOD.save(root / "inside.png")
    GOOD.save(outside / "secret.png")
    sibling = root.parent / (root.name + "-evil")  # "/x/root-evil" starts with "/x/root"
    sibling.mkdir(exist_ok=True)
    GOOD.save(sibling / "x.png")
    (root / "link_out.png").symlink_to(outside / "secret.png")
    (root / "dir_out").symlink_to(outside, target_is_directory=True)
    (root / "link_in.png").symlink_to(root / "inside.png")
    (root / "sub").mkdir(exist_ok=True)
    os.mkfifo(root / "fifo")
    return {"root": root, "outside": outside, "sibling": sibling}


def escapes(layout) -> list[str]:
    root, outside, sibling = layout["root"], layout["outside"], layout["sibling"]
    rel = os.path.relpath(outside / "secret.png", root)
    return [
        str(outside / "secret.png"),                   # absolute, outside
        str(root / rel),                               # root/../outside/secret.png
        str(root / "sub" / ".." / ".." / outside.name / "secret.png"),
        rel,                                           # relative to the server's cwd
        str(root / "link_out.png"),                    # symlink inside -> file outside
        str(root / "dir_out" / "secret.png"),          # symlinked folder inside -> outside
        str(sibling / "x.png"),                        # look-alike prefix
        str(root / "inside.png") + "\x00.txt",         # NUL truncation
        "file://" + str(root / "inside.png"),
        str(root),                                     # the root folder itself
        str(root / "fifo"),                            # a FIFO under the root (open() would block)
        "/proc/self/environ", "/dev/zero", "~/.ssh/id_rsa", "",
    ]


def test_client_paths_outside_the_roots_are_never_opened(http, layout):
    for path in escapes(layout):
        r = http.post("/call", json=call_body({"path": path}))
        assert r.status_code in (400, 403), (path, r.status_code, r.text[:200])
        assert "secret" not in json.dumps(r.json().get("result", {})), path
    for path in (layout["root"] / "inside.png", layout["root"] / "link_in.png"):
        r = http.post("/call", json=call_body({"path": str(path)}))
        assert r.status_code == 200 and r.json()["result"]["error"] is None, (path, r.text[:200])


def test_annotation_mask_paths_outside_the_roots_are_never_opened(server_factory, layout):
    """The oracle engine reads the record's masks: inside the root it finds the mask; by symlink,
    ``..`` or an absolute path outside, the mask is dropped unread and it finds nothing."""
    root, outside = layout["root"], layout["outside"]
    mask = Image.new("L", GOOD.size, 0)
    mask.paste(255, (10, 10, 30, 30))
    mask.save(outside / "mask.png")
    mask.save(root / "mask.png")
    (root / "mask_link.png").symlink_to(outside / "mask.png")
    server = server_factory("serve", ["--tools", "segment", "--engine", "segment=oracle", "--image-root", str(root)])

    def area(path: str) -> int:
        ctx = {"annotations": {"masks": [{"label": "lesion", "path": path}]}}
        r = httpx.post(server.url + "/call", json=call_body(arguments={"bbox": [4, 4, 40, 40]}, context=ctx), timeout=30)
        assert r.status_code == 200, r.text[:200]
        return r.json()["result"]["data"].get("area_px", 0)

    assert area(str(root / "mask.png")) == 400
    rel = os.path.relpath(outside / "mask.png", root)
    for path in (str(root / "mask_link.png"), str(root / rel), str(outside / "mask.png"), rel,
                 str(root / "mask.png") + "\x00"):
        assert area(path) == 0, path


def test_hostile_input_through_the_router(server_factory):
    upstream = server_factory("serve", ["--tools", "segment", "--max-body-mb", "2"])
    router = server_factory("router", ["--upstream", f"segment={upstream.url}", "--max-body-mb", "2"])
    with httpx.Client(base_url=router.url, timeout=60) as client:
        cases = [b"not json", b"[1, 2]", b"null", json.dumps({"tool": ["segment"]}).encode(),
                 json.dumps(call_body({"png": base64.b64encode(_bomb()).decode()})).encode(),
                 json.dumps(call_body({"path": "/etc/passwd"})).encode(),
                 b"{" + b" " * (3 * MiB) + b"}"]
        statuses = [client.post("/call", content=c, headers={"content-type": "application/json"}).status_code
                    for c in cases]
        assert statuses == [400, 400, 400, 400, 400, 403, 413]
        assert client.get("/health").status_code == 200
