"""Teeth for ``tool_backends/limits.py`` (issue 40, mutation testing): each test pins a boundary or
a refusal that a one-token change of the module would move -- the request budget's exact limits,
``--result-dir``'s trim (never what it did not write, never the newest file), the client-named
file read (roots, NUL, symlink, non-regular, size, growth) and the request JSON checks (count,
depth, non-finite numbers). In-process and fast: ``benchmarks/mutation.py`` runs it per mutant."""

from __future__ import annotations

import json
import os

import pytest
from PIL import Image

from tool_backends.base import ToolResult
from tool_backends.limits import (MAX_CONTAINERS, MAX_DEPTH, RequestBudget, ResultDir, is_regular_file,
                                  parse_request_json, read_under_roots)
from tool_backends.wire import WireError


def _result(*sizes):
    return ToolResult(text="ok", images=[Image.new("RGB", s) for s in sizes])


# ---------------------------------------------------------------- RequestBudget
def test_the_call_budget_allows_exactly_its_calls_then_names_the_limit():
    b = RequestBudget(calls=3, input_pixels=1, result_pixels=1)
    assert [b.take_call() for _ in range(3)] == [None, None, None]
    assert b.calls == 3
    assert b.take_call() == "This request's limit of 3 tool calls is spent: send the rest in another request."
    assert b.take_call() is not None  # stays spent
    assert b.calls == 5


def test_the_budget_takes_its_limits_as_ints():
    b = RequestBudget(calls="2", input_pixels=10.9, result_pixels="7")
    assert (b.max_calls, b.max_input_pixels, b.max_result_pixels) == (2, 10, 7)
    assert (b.calls, b.input_pixels, b.result_pixels) == (0, 0, 0)


def test_input_pixels_up_to_the_limit_pass_and_one_over_is_a_400_sentence():
    b = RequestBudget(calls=1, input_pixels=100, result_pixels=1)
    b.take_input(Image.new("RGB", (5, 10)))  # 50
    b.take_input(Image.new("RGB", (10, 5)))  # 100: exactly the limit
    assert b.input_pixels == 100
    with pytest.raises(WireError) as e:
        b.take_input(Image.new("RGB", (1, 1)))
    assert str(e.value) == ("the request's images decode to over 100 pixels in all: "
                            "send fewer or smaller images per request")
    assert b.input_pixels == 101


def test_input_pixels_count_width_times_height():
    b = RequestBudget(calls=1, input_pixels=12, result_pixels=1)
    b.take_input(Image.new("RGB", (3, 4)))
    assert b.input_pixels == 12
    with pytest.raises(WireError):
        RequestBudget(calls=1, input_pixels=11, result_pixels=1).take_input(Image.new("RGB", (3, 4)))


def test_the_first_result_always_fits_and_later_ones_fit_up_to_the_limit():
    b = RequestBudget(calls=9, input_pixels=1, result_pixels=100)
    first = _result((20, 20))  # 400 pixels: over the limit, but a response's first images always fit
    assert b.take_result(first) is first
    assert b.result_pixels == 400
    b = RequestBudget(calls=9, input_pixels=1, result_pixels=100)
    a, c = _result((5, 10)), _result((10, 5))
    assert b.take_result(a) is a and b.take_result(c) is c  # 50 + 50 == 100: fits exactly
    assert b.result_pixels == 100
    over = b.take_result(_result((1, 1)))
    assert over.error == ("The result images of this request are over its limit of 100 pixels: "
                          "make this call in another request.")
    assert over.images == []
    assert b.result_pixels == 100  # a refused result is not counted
    text_only = ToolResult(text="no images")
    assert b.take_result(text_only) is text_only  # 100 + 0 is not over


def test_result_pixels_sum_every_image_of_a_result():
    b = RequestBudget(calls=9, input_pixels=1, result_pixels=10)
    b.take_result(_result((1, 1)))
    refused = b.take_result(_result((2, 2), (3, 2)))  # 1 + 4 + 6 = 11 > 10
    assert refused.images == [] and "over its limit of 10 pixels" in refused.error
    b2 = RequestBudget(calls=9, input_pixels=1, result_pixels=11)
    b2.take_result(_result((1, 1)))
    ok = _result((2, 2), (3, 2))
    assert b2.take_result(ok) is ok and b2.result_pixels == 11


# ---------------------------------------------------------------- ResultDir
def _write(path, n):
    path.write_bytes(b"x" * n)
    return str(path)


def test_the_result_dir_trims_its_oldest_files_to_its_bytes(tmp_path):
    d = ResultDir(tmp_path, max_bytes=25)
    assert d.path == tmp_path and d.max_bytes == 25
    a, b, c = (_write(tmp_path / n, 10) for n in "abc")
    d.wrote(a), d.wrote(b)
    assert d.nbytes == 20 and os.path.exists(a)
    d.wrote(c)  # 30 > 25: the oldest goes
    assert not os.path.exists(a) and os.path.exists(b) and os.path.exists(c)
    assert d.nbytes == 20


def test_the_result_dir_keeps_files_up_to_exactly_its_bytes(tmp_path):
    d = ResultDir(tmp_path, max_bytes=20)
    a, b = _write(tmp_path / "a", 10), _write(tmp_path / "b", 10)
    d.wrote(a), d.wrote(b)
    assert os.path.exists(a) and os.path.exists(b) and d.nbytes == 20


def test_the_result_dir_never_deletes_the_newest_file_however_big(tmp_path):
    d = ResultDir(tmp_path, max_bytes=5)
    big = _write(tmp_path / "big", 50)
    d.wrote(big)
    assert os.path.exists(big) and d.nbytes == 50
    other = _write(tmp_path / "other", 50)
    d.wrote(other)
    assert not os.path.exists(big) and os.path.exists(other) and d.nbytes == 50


def test_a_file_written_again_is_not_counted_twice_and_becomes_newest(tmp_path):
    d = ResultDir(tmp_path, max_bytes=25)
    a, b = _write(tmp_path / "a", 10), _write(tmp_path / "b", 10)
    d.wrote(a), d.wrote(b), d.wrote(a)  # a again: newest, still 20 bytes
    assert d.nbytes == 20
    c = _write(tmp_path / "c", 10)
    d.wrote(c)
    assert os.path.exists(a) and not os.path.exists(b) and os.path.exists(c)


def test_a_file_used_again_is_the_newest_to_keep(tmp_path):
    d = ResultDir(tmp_path, max_bytes=25)
    a, b = _write(tmp_path / "a", 10), _write(tmp_path / "b", 10)
    d.wrote(a), d.wrote(b)
    d.used(a)
    d.used(str(tmp_path / "never-written"))  # not ours: nothing happens
    d.wrote(_write(tmp_path / "c", 10))
    assert os.path.exists(a) and not os.path.exists(b)


def test_a_file_that_is_gone_is_neither_counted_nor_fatal(tmp_path):
    d = ResultDir(tmp_path, max_bytes=25)
    d.wrote(str(tmp_path / "missing"))
    assert d.nbytes == 0
    a = _write(tmp_path / "a", 20)
    d.wrote(a)
    os.unlink(a)  # removed by someone else: the trim goes on
    b = _write(tmp_path / "b", 20)
    d.wrote(b)
    assert os.path.exists(b) and d.nbytes == 20


# ---------------------------------------------------------------- read_under_roots
@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    (r / "ok.bin").write_bytes(b"abcdef")
    (tmp_path / "outside.bin").write_bytes(b"secret")
    return r


def test_a_file_under_a_root_is_read_whole(root):
    assert read_under_roots(str(root / "ok.bin"), [str(root)], max_bytes=6) == b"abcdef"
    assert read_under_roots(str(root / "ok.bin"), ["/nonexistent-root", str(root)], max_bytes=100) == b"abcdef"


def test_a_file_of_more_than_a_megabyte_is_read_whole(root):
    data = os.urandom((1 << 20) + 12345)
    (root / "big.bin").write_bytes(data)
    assert read_under_roots(str(root / "big.bin"), [str(root)], max_bytes=len(data)) == data


def test_a_file_one_byte_over_the_limit_is_a_400(root):
    with pytest.raises(WireError, match="of 6 bytes is over the limit of 5"):
        read_under_roots(str(root / "ok.bin"), [str(root)], max_bytes=5)


@pytest.mark.parametrize("path", [None, 7, b"/x"])
def test_a_path_that_is_not_a_string_is_a_403(root, path):
    with pytest.raises(PermissionError):
        read_under_roots(path, [str(root)], max_bytes=100)


def test_no_roots_or_a_nul_byte_is_a_403(root):
    with pytest.raises(PermissionError):
        read_under_roots(str(root / "ok.bin"), [], max_bytes=100)
    with pytest.raises(PermissionError):
        read_under_roots(str(root / "ok.bin") + "\0", [str(root)], max_bytes=100)


def test_a_file_outside_the_roots_is_a_403_not_read(root, tmp_path):
    with pytest.raises(PermissionError, match="not under this server's image roots"):
        read_under_roots(str(tmp_path / "outside.bin"), [str(root)], max_bytes=100)
    with pytest.raises(PermissionError):
        read_under_roots(str(root / ".." / "outside.bin"), [str(root)], max_bytes=100)


def test_a_symlink_under_the_root_to_outside_is_a_403(root, tmp_path):
    os.symlink(tmp_path / "outside.bin", root / "link.bin")
    with pytest.raises(PermissionError):
        read_under_roots(str(root / "link.bin"), [str(root)], max_bytes=100)


def test_a_missing_file_is_a_403_and_a_folder_a_400(root):
    with pytest.raises(PermissionError):  # it resolves nowhere, so under no root
        read_under_roots(str(root / "missing.bin"), [str(root)], max_bytes=100)
    (root / "sub").mkdir()
    with pytest.raises(WireError, match="is not a regular file"):
        read_under_roots(str(root / "sub"), [str(root)], max_bytes=100)


def test_an_empty_file_reads_as_empty(root):
    (root / "empty.bin").write_bytes(b"")
    assert read_under_roots(str(root / "empty.bin"), [str(root)], max_bytes=0) == b""


# ---------------------------------------------------------------- is_regular_file
def test_is_regular_file_follows_links_and_never_raises(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"1")
    os.symlink(f, tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    assert is_regular_file(f) and is_regular_file(tmp_path / "link")
    assert not is_regular_file(tmp_path / "fifo") and not is_regular_file(tmp_path)
    assert not is_regular_file(tmp_path / "missing") and not is_regular_file("a\0b")


# ---------------------------------------------------------------- parse_request_json
def test_the_container_count_allows_exactly_its_limit():
    assert parse_request_json(b"[" + b",".join([b"{}"] * 9) + b"]", max_containers=10) == [{}] * 9
    with pytest.raises(WireError) as e:
        parse_request_json(b"[" + b",".join([b"{}"] * 10) + b"]", max_containers=10)
    assert str(e.value) == "the request holds 11 JSON objects and arrays; the limit is 10"


def test_the_default_container_limit_is_the_modules_and_none_skips_it():
    body = b"[" + b",".join([b"[]"] * MAX_CONTAINERS) + b"]"  # one over
    with pytest.raises(WireError, match=f"the limit is {MAX_CONTAINERS}"):
        parse_request_json(body)
    assert len(parse_request_json(body, max_containers=None)) == MAX_CONTAINERS
    assert parse_request_json(b'{"text": "{{{{[[[["}', max_containers=9) == {"text": "{{{{[[[["}  # braces in text count


def test_nesting_up_to_the_depth_parses_and_one_deeper_is_a_400():
    ok = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    value = parse_request_json(ok)
    for _ in range(MAX_DEPTH - 1):
        value = value[0]
    assert value == []
    deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    with pytest.raises(WireError) as e:
        parse_request_json(deep)
    assert str(e.value) == f"the request's JSON nests over {MAX_DEPTH} levels deep"
    objs = b'{"a":' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1)  # objects count as levels too
    with pytest.raises(WireError, match="nests over"):
        parse_request_json(objs)
    mixed = json.dumps({"a": [1, {"b": [[[]]]}], "c": {"d": 2}}).encode()
    assert parse_request_json(mixed) == {"a": [1, {"b": [[[]]]}], "c": {"d": 2}}


def test_a_deep_branch_beside_a_shallow_one_is_found():
    deep = json.dumps({"shallow": 1, "deep": json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)}).encode()
    with pytest.raises(WireError, match="nests over"):
        parse_request_json(deep)


def test_recursion_deep_json_is_a_400_with_the_depth_sentence():
    with pytest.raises(WireError) as e:
        parse_request_json(b"[" * 100_000 + b"]" * 100_000, max_containers=None)
    assert str(e.value) == f"the request's JSON nests over {MAX_DEPTH} levels deep"


@pytest.mark.parametrize("body,name", [(b'{"x": NaN}', "NaN"), (b"[-Infinity]", "-Infinity"),
                                       (b"Infinity", "Infinity")])
def test_non_finite_constants_are_a_400_naming_them(body, name):
    with pytest.raises(WireError) as e:
        parse_request_json(body)
    assert str(e.value) == f"a request may not hold {name}: numbers must be finite"


def test_a_float_out_of_range_is_a_400_and_in_range_floats_stay_floats():
    with pytest.raises(WireError) as e:
        parse_request_json(b"[1e999]")
    assert str(e.value) == "the number 1e999 is out of range: numbers must be finite"
    with pytest.raises(WireError, match="the number -1e400 is out"):
        parse_request_json(b"[-1e400]")
    value = parse_request_json(b"[2.5, 1e300, 10]")
    assert value == [2.5, 1e300, 10] and isinstance(value[0], float) and isinstance(value[2], int)


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe", b"[1,]", b"nul"])
def test_what_is_not_json_is_a_400_expected_a_json_body(body):
    with pytest.raises(WireError) as e:
        parse_request_json(body)
    assert str(e.value) == "expected a JSON body"


def test_scalars_parse_as_themselves():
    assert parse_request_json(b"3") == 3 and parse_request_json(b'"s"') == "s" and parse_request_json(b"null") is None


# ---------------------------------------------------------------- the descriptor checks, made deterministic
def test_a_symlink_swapped_in_after_the_name_check_is_refused_at_open(root, tmp_path, monkeypatch):
    """The race the name check cannot see: the name resolved inside, then became a symlink.
    Simulated by a ``realpath`` that returns the name as given (the swap happened after it)."""
    import tool_backends.limits as limits

    os.symlink(root / "ok.bin", root / "swapped.bin")  # a link to a file *inside*: only O_NOFOLLOW refuses it
    monkeypatch.setattr(limits.os.path, "realpath", lambda p, *a, **k: p)
    with pytest.raises(PermissionError) as e:
        read_under_roots(str(root / "swapped.bin"), [str(root)], max_bytes=100)
    assert str(e.value) == f"image path {str(root / 'swapped.bin')!r} changed into a symlink while it was opened"


def test_a_folder_swapped_for_a_link_out_is_refused_from_the_descriptors_own_path(root, tmp_path, monkeypatch):
    """The name passed its check (inside), but the descriptor the kernel opened is outside."""
    import tool_backends.wire as wire

    os.symlink(tmp_path, root / "linkdir")  # root/linkdir/outside.bin is tmp_path/outside.bin
    real_is_under, calls = wire.is_under, []

    def first_check_passes(path, roots):
        calls.append(path)
        return True if len(calls) == 1 else real_is_under(path, roots)
    monkeypatch.setattr(wire, "is_under", first_check_passes)
    # refused, naming the roots; as a 400 today: the PermissionError raised inside the read's
    # ``try`` is an OSError, which its ``except OSError`` turns into a WireError (the docstring says 403)
    with pytest.raises((PermissionError, WireError), match="is not under this server's image roots"):
        read_under_roots(str(root / "linkdir" / "outside.bin"), [str(root)], max_bytes=100)
    assert len(calls) == 2 and calls[1] == str(tmp_path / "outside.bin")


def test_a_file_that_reads_longer_than_its_size_is_cut_at_the_limit():
    """``/proc`` files report size 0 and read on: the read itself stops at ``max_bytes``."""
    data = read_under_roots("/proc/self/status", ["/proc/self"], max_bytes=1 << 16)
    assert data.startswith(b"Name:") and len(data) > 100
    with pytest.raises(WireError) as e:
        read_under_roots("/proc/self/status", ["/proc/self"], max_bytes=100)
    assert str(e.value) == "image file '/proc/self/status' is over the limit of 100 bytes"
    assert read_under_roots("/proc/self/status", ["/proc/self"], max_bytes=len(data) + 50)[:5] == b"Name:"


# ---------------------------------------------------------------- the connection's own limits (uvicorn in a thread)
import asyncio  # noqa: E402
import select  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from tool_backends import limits as limits_module  # noqa: E402
from tool_backends.limits import MAX_HEADER_BYTES, read_timeout_protocol  # noqa: E402


class Gate:
    """An ASGI app: ``/block`` waits until released, ``/slow`` answers after 0.6 s, ``/refuse`` answers
    413 with its body unread (as ``RequestGate``), anything else 200 at once."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                while True:
                    message = await receive()
                    await send({"type": message["type"] + ".complete"})
                    if message["type"] == "lifespan.shutdown":
                        return
            return
        path, headers = scope["path"], []
        if path == "/block":
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        elif path == "/slow":
            await asyncio.sleep(0.6)
        if path == "/refuse":
            headers = [(b"connection", b"close")]
        body = b"refused" if path == "/refuse" else b"ok"
        await send({"type": "http.response.start", "status": 413 if path == "/refuse" else 200,
                    "headers": headers + [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class Uvicorn:
    def __init__(self, read_timeout_s: float, limit: int | None, config_limit: int | None = None) -> None:
        import uvicorn

        self.app = Gate()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error",
                                                    access_log=False, limit_concurrency=config_limit,
                                                    http=read_timeout_protocol(read_timeout_s, limit)))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive()
            time.sleep(0.01)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def close(self) -> None:
        self.app.release.set()
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def uv():
    started = []

    def start(*a, **kw):
        started.append(Uvicorn(*a, **kw))
        return started[-1]

    yield start
    for s in started:
        s.close()


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def answer_of(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            return data
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head + b"\r\n\r\n" + rest


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (sending nothing first)."""
    if not select.select([sock], [], [], seconds)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_an_idle_connection_is_closed_at_the_read_timeout_not_before(uv):
    server = uv(0.4, 8)
    with server.connect() as s:
        start = time.monotonic()
        assert not closed_within(s, 0.2)
        assert closed_within(s, 1.5)
        assert 0.3 < time.monotonic() - start < 1.5


def test_a_head_dripped_a_byte_at_a_time_is_closed_at_the_read_timeout(uv):
    server = uv(0.4, 8)
    with server.connect() as s:
        start = time.monotonic()
        for byte in get("/x")[:-2]:  # never the head's end
            try:
                s.sendall(bytes([byte]))
            except OSError:
                break
            if closed_within(s, 0.05):
                break
        assert time.monotonic() - start < 1.2


def test_after_an_answer_the_timer_starts_again(uv):
    server = uv(0.4, 8)
    with server.connect() as s:
        time.sleep(0.25)
        s.sendall(get("/x"))
        assert answer_of(s).startswith(b"HTTP/1.1 200")
        answered = time.monotonic()
        assert not closed_within(s, 0.25)  # the first timer (0.4 s from the open) is gone
        s.sendall(get("/x"))  # and the kept connection still serves
        assert answer_of(s).endswith(b"ok")
        assert closed_within(s, 1.5)
        assert time.monotonic() - answered < 1.8


def test_a_request_being_answered_is_not_cut_by_the_read_timeout(uv):
    server = uv(0.3, 8)
    with server.connect() as s:
        s.sendall(get("/slow"))
        assert answer_of(s).startswith(b"HTTP/1.1 200")


def test_a_head_over_its_bytes_is_431_and_one_of_exactly_them_waits(uv):
    server = uv(5.0, 8)
    with server.connect() as s:
        head = b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nx-pad: "
        s.sendall(head + b"a" * (MAX_HEADER_BYTES - len(head)))  # exactly the bound, not yet whole
        assert not select.select([s], [], [], 0.3)[0]
        s.sendall(b"a")
        answer = answer_of(s)
        msg = f"request head over {MAX_HEADER_BYTES} bytes".encode()
        assert answer == (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
                          b"content-length: " + str(len(msg)).encode() + b"\r\nconnection: close\r\n\r\n" + msg)
        assert closed_within(s, 2)


def test_a_big_head_that_completes_is_served_and_counting_starts_again(uv):
    server = uv(5.0, 8)
    with server.connect() as s:
        for _ in range(3):  # three heads of 3/4 the bound each, on one connection
            pad = b"a" * (MAX_HEADER_BYTES * 3 // 4)
            s.sendall(b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nx-pad: " + pad + b"\r\n\r\n")
            assert answer_of(s).startswith(b"HTTP/1.1 200")


def test_health_answers_past_the_concurrency_limit_and_nothing_else_does(uv):
    for server in (uv(5.0, 2), uv(5.0, None, config_limit=2)):  # uvicorn counts connections too
        with server.connect() as busy:
            busy.sendall(get("/block"))
            time.sleep(0.2)
            with server.connect() as s:
                s.sendall(get("/x"))
                assert answer_of(s).startswith(b"HTTP/1.1 503")
            with server.connect() as s:
                s.sendall(get("/health", "POST").replace(b"\r\n\r\n", b"\r\ncontent-length: 0\r\n\r\n"))
                assert answer_of(s).startswith(b"HTTP/1.1 503")
            with server.connect() as s:
                s.sendall(get("/health"))
                assert answer_of(s).startswith(b"HTTP/1.1 200")
            server.app.release.set()
            assert answer_of(busy).startswith(b"HTTP/1.1 200")
        server.app.release.clear()


def refused_with_body_coming(server, sent_after: int) -> tuple[bytes, Exception | None]:
    """POST /refuse declaring 64 MiB, 256 KiB sent before reading its answer, then ``sent_after``
    more bytes: (the answer, the error sending them, if any)."""
    with server.connect() as s:
        s.sendall(b"POST /refuse HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-length: 67108864\r\n\r\n" + b"x" * (256 << 10))
        answer = answer_of(s)
        error = None
        try:
            piece = b"x" * (64 << 10)
            for _ in range(sent_after // len(piece)):
                s.sendall(piece)
                time.sleep(0.002)
            time.sleep(0.3)
            s.sendall(piece)
            s.sendall(piece)
        except OSError as e:
            error = e
        return answer, error


def test_a_refusal_with_its_body_still_coming_lingers_then_drains_up_to_its_cap(uv, monkeypatch):
    monkeypatch.setattr(limits_module, "LINGER_BYTES", 1 << 20)
    server = uv(5.0, 8)
    answer, error = refused_with_body_coming(server, 512 << 10)  # under the drain cap: no reset
    assert answer.startswith(b"HTTP/1.1 413") and answer.endswith(b"refused")
    assert error is None
    answer, error = refused_with_body_coming(server, 3 << 20)  # past it: aborted
    assert answer.startswith(b"HTTP/1.1 413")
    assert isinstance(error, (ConnectionResetError, BrokenPipeError)), error


def test_a_lingering_connection_closes_after_its_linger(uv, monkeypatch):
    monkeypatch.setattr(limits_module, "LINGER_S", 0.3)
    server = uv(5.0, 8)
    with server.connect() as s:
        s.sendall(b"POST /refuse HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-length: 1000000\r\n\r\n" + b"x" * 1000)
        assert answer_of(s).startswith(b"HTTP/1.1 413")
        time.sleep(0.8)
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            for _ in range(50):
                s.sendall(b"x" * 65536)
                time.sleep(0.01)


def test_a_closing_answer_with_no_body_coming_closes_at_once(uv, monkeypatch):
    monkeypatch.setattr(limits_module, "LINGER_S", 3.0)
    server = uv(5.0, 8)
    with server.connect() as s:
        s.sendall(get("/refuse", "POST").replace(b"\r\n\r\n", b"\r\ncontent-length: 0\r\n\r\n"))
        assert answer_of(s).startswith(b"HTTP/1.1 413")
        time.sleep(0.3)
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            for _ in range(50):
                s.sendall(b"x" * 65536)
                time.sleep(0.01)
