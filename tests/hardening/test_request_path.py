"""One request path with one set of checks (issue 40, attacks 2, 3, 4, 8 and 9), on real loopback
sockets against servers (and a router) built in this process:

* the token, and without one the ``Host``/``Origin``/content-type checks, come before the first
  body byte on every endpoint (``Expect: 100-continue`` gets the refusal, never ``100 Continue``);
* a request's ref waits have one deadline in all and end when its client goes; over-long image
  lists are refused before any wait;
* a body has one deadline in all, however it trickles;
* numbers out of range, deep nesting, huge lists and huge heads are 400s (431) with a sentence.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tool_backends"))
from test_server_sharing import Served, SlowEcho  # noqa: E402

from tool_backends.router import create_router_app  # noqa: E402
from tool_backends.server import ServerSettings, create_app  # noqa: E402

TOKEN = "t0ken-for-tests"
CLAIMED = 60 * 1024 * 1024


@pytest.fixture
def servers():
    started = []

    def start(app):
        started.append(Served(app))
        return started[-1]

    yield start
    for s in reversed(started):
        s.close()


def head(path: str, length: int = CLAIMED, extra: bytes = b"", method: bytes = b"POST") -> bytes:
    return (method + b" " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n" % length + extra + b"\r\n")


def bytes_sent_before_an_answer(port: int, request_head: bytes, limit: int = 4 << 20) -> tuple[int, bytes]:
    """Send ``request_head``, then body bytes 16 KiB at a time until an answer is readable (or
    ``limit`` bytes went out): how many body bytes the server let in before answering."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request_head)
        sent, piece = 0, b"x" * 16384
        while sent < limit:
            if select.select([s], [], [], 0.3 if sent == 0 else 0.002)[0]:
                return sent, s.recv(4096)
            try:
                s.sendall(piece)
            except OSError:
                break
            sent += len(piece)
        return sent, b""


@pytest.fixture(params=["server", "router"])
def guarded(request, servers):
    upstream = servers(create_app({"echo": SlowEcho(0.0)}, ServerSettings(token=TOKEN)))
    if request.param == "server":
        return upstream
    import os

    os.environ["MEDVQA_TEST_UPSTREAM_TOKEN"] = TOKEN
    return servers(create_router_app({"echo": upstream.url}, ServerSettings(token=TOKEN),
                                     token_env="MEDVQA_TEST_UPSTREAM_TOKEN"))


@pytest.mark.parametrize("path", ["/call", "/call_batch", "/get_observation"])
def test_the_token_is_checked_before_the_first_body_byte(guarded, path):
    sent, answer = bytes_sent_before_an_answer(guarded.port, head(path))
    assert answer.startswith(b"HTTP/1.1 401") and sent <= 64 * 1024, (sent, answer[:60])
    assert b"connection: close" in answer.lower()  # the unread body is never read


def test_an_unauthenticated_expect_100_continue_gets_401_not_100(guarded):
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=5) as s:
        s.sendall(head("/call", extra=b"Expect: 100-continue\r\n"))
        assert s.recv(4096).startswith(b"HTTP/1.1 401")
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=5) as s:  # with the token: 100, then the call
        body = json.dumps({"tool": "echo", "images": []}).encode()
        s.sendall(head("/call", len(body), b"Expect: 100-continue\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"))
        assert s.recv(4096).startswith(b"HTTP/1.1 100")
        s.sendall(body)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")


@pytest.fixture
def open_server(servers):
    return servers(create_app({"echo": SlowEcho(0.0)}, ServerSettings(upload_wait_s=0.5, read_timeout_s=1.0,
                                                                        body_timeout_s=2.0)))


@pytest.mark.parametrize("extra,status,words", [
    (b"Host: attacker.example\r\n", 403, b"not a loopback name"),  # DNS rebinding
    (b"Host: 127.0.0.1.attacker.example:80\r\n", 403, b"not a loopback name"),
    (b"Origin: http://attacker.example\r\n", 403, b"Origin"),
    (b"Origin: null\r\n", 403, b"Origin"),
    (b"Content-Type: text/plain\r\n", 415, b"application/json"),  # what a page may send without asking
    (b"Content-Type: application/x-www-form-urlencoded\r\n", 415, b"application/json"),
])
@pytest.mark.parametrize("path", ["/call", "/call_batch", "/get_observation"])
def test_without_a_token_a_browser_shaped_request_is_refused_before_its_body(open_server, extra, status, words, path):
    lines = [line for line in head(path).split(b"\r\n") if line]
    name = extra.split(b":")[0].lower()
    request = b"\r\n".join(l for l in lines if l.split(b":")[0].lower() != name) + b"\r\n" + extra + b"\r\n"
    sent, answer = bytes_sent_before_an_answer(open_server.port, request)
    assert answer.startswith(b"HTTP/1.1 %d" % status) and words in answer and sent <= 64 * 1024, answer[:200]


def test_without_a_token_loopback_clients_are_served(open_server):
    for base in (open_server.url, f"http://localhost:{open_server.port}"):
        r = httpx.post(base + "/call", json={"tool": "echo", "images": []}, headers={"origin": base}, timeout=10)
        assert r.status_code == 200, r.text


def ref_call(refs: list[str]) -> dict:
    return {"tool": "echo", "arguments": {}, "images": [{"ref": r} for r in refs]}


def test_a_requests_ref_waits_have_one_deadline_in_all(open_server):
    """Today's server waited ``upload_wait_s`` per ref: 30 claimed refs, 15 s."""
    refs = [f"{i:032x}" for i in range(30)]
    assert httpx.post(open_server.url + "/call", json=ref_call(refs), timeout=10).status_code == 409  # claims them
    start = time.monotonic()
    r = httpx.post(open_server.url + "/call", json=ref_call(refs + refs[:1] * 30), timeout=30)
    assert r.status_code == 409 and time.monotonic() - start < 0.5 + 1.0
    start = time.monotonic()  # past the image limit: refused before any wait
    r = httpx.post(open_server.url + "/call", json=ref_call(refs * 3), timeout=30)
    assert r.status_code == 400 and "at most 64" in r.json()["detail"] and time.monotonic() - start < 0.4


def test_a_waiting_request_ends_when_its_client_goes(servers):
    server = servers(create_app({"echo": SlowEcho(0.0)}, ServerSettings(upload_wait_s=5.0)))
    arrivals = server.server.config.app.state.arrivals
    assert httpx.post(server.url + "/call", json=ref_call(["ab" * 16]), timeout=10).status_code == 409
    body = json.dumps(ref_call(["ab" * 16])).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.sendall(head("/call", len(body)) + body)
    deadline = time.monotonic() + 2
    while arrivals.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert arrivals.waiting == 1
    s.close()
    deadline = time.monotonic() + 1.5
    while arrivals.waiting and time.monotonic() < deadline:
        time.sleep(0.02)
    assert arrivals.waiting == 0  # not the 5 s it would have waited for nobody


def test_a_dripping_body_gets_408_at_its_total_deadline(open_server):
    """One byte every 0.4 s never trips the 1 s gap timeout; the 2 s total deadline ends it."""
    with socket.create_connection(("127.0.0.1", open_server.port), timeout=10) as s:
        s.sendall(head("/call", 1000))
        start, answer = time.monotonic(), b""
        while time.monotonic() - start < 6 and not answer:
            if select.select([s], [], [], 0.4)[0]:
                answer = s.recv(4096)
            else:
                s.sendall(b" ")
        assert answer.startswith(b"HTTP/1.1 408") and b"within 2 s" in answer, answer[:200]
        assert time.monotonic() - start < 3.0


BOX = '{"label": "a", "bbox": [0, 0, %s, 3]}'


@pytest.mark.parametrize("context", [
    '{"annotations": {"boxes": [%s]}}' % (BOX % "Infinity"),
    '{"annotations": {"boxes": [%s]}}' % (BOX % "1e400"),
    '{"annotations": {"boxes": [%s]}}' % (BOX % ("9" * 400)),
    '{"annotations": {"boxes": [%s]}}' % (BOX % "NaN"),
    '{"annotations": {"masks": [%s]}}' % ", ".join(['{"label": "a", "path": "/x/m.png"}'] * 2000),
    '{"question": %s}' % ("[" * 969 + "]" * 969),
])
@pytest.mark.parametrize("path", ["/call", "/call_batch", "/get_observation"])
def test_numbers_out_of_range_nesting_and_floods_in_context_are_400_with_a_sentence(open_server, context, path):
    call = '{"tool": "echo", "arguments": {}, "images": [], "context": %s}' % context
    body = {"/call": call, "/call_batch": '{"calls": [%s]}' % call,
            "/get_observation": '{"actions": ["<tool_call>{\\"name\\": \\"echo\\", \\"arguments\\": {}}</tool_call>"], '
                                '"extra_fields": [{"context": %s}]}' % context}[path]
    r = httpx.post(open_server.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and len(r.json()["detail"]) > 20, (r.status_code, r.text[:300])


def test_a_million_tiny_objects_are_refused_from_a_byte_count(open_server):
    body = json.dumps(ref_call([f"{i:x}" for i in range(1_200_000)])).encode()  # ~30 MB of distinct refs
    start = time.monotonic()
    r = httpx.post(open_server.url + "/call", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "JSON objects and arrays" in r.json()["detail"]
    assert time.monotonic() - start < 5


def test_a_huge_request_head_gets_431_before_it_is_all_sent(open_server):
    with socket.create_connection(("127.0.0.1", open_server.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sent, answer = 0, b""
        while sent < 8 << 20 and not answer:
            if select.select([s], [], [], 0.001)[0]:
                answer = s.recv(4096)
                break
            try:
                s.sendall(b"X-Filler: " + b"a" * 8000 + b"\r\n")
            except OSError:
                break
            sent += 8012
        answer = answer or s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 431") and sent < 1 << 20, (sent, answer[:80])


# ---- the hand-written parts of the gate, fuzzed ---------------------------------------------------
from hypothesis import given, settings as hsettings, strategies as st  # noqa: E402

from tool_backends.limits import parse_request_json  # noqa: E402
from tool_backends.server import refuse_head  # noqa: E402
from tool_backends.wire import WireError  # noqa: E402


class _Headers(dict):
    def get(self, key, default=None):
        return super().get(key, default)


LOOPBACK = st.sampled_from(["127.0.0.1", "localhost", "[::1]", "127.5.6.7"])
PORT = st.one_of(st.just(""), st.integers(0, 99999).map(lambda p: f":{p}"))


@hsettings(max_examples=300, deadline=None)
@given(host=st.one_of(st.text(max_size=40), st.builds(str.__add__, LOOPBACK, PORT)),
       origin=st.one_of(st.none(), st.text(max_size=40), st.builds(lambda h, p: f"http://{h}{p}", LOOPBACK, PORT)))
def test_the_no_token_head_check_passes_loopback_names_only(host, origin):
    from tool_backends.server import ServerSettings, is_loopback

    headers = _Headers({"host": host, "content-type": "application/json"})
    if origin is not None:
        headers["origin"] = origin
    refusal = refuse_head({"path": "/call", "method": "POST"}, headers, ServerSettings())
    bare = host[1:].partition("]")[0] if host.startswith("[") else (host.rpartition(":")[0] if host.count(":") == 1 else host)
    if refusal is None:
        assert is_loopback(bare)
        assert origin is None or origin.startswith(("http://", "https://"))
    else:
        assert refusal[0] in (403, 415) and isinstance(refusal[1], str)


@hsettings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.binary(max_size=200),
                     st.recursive(st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=5)),
                                  lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=3), c, max_size=4),
                                  max_leaves=30).map(lambda v: json.dumps(v).encode())))
def test_request_json_is_a_value_or_a_wire_error_never_anything_else(raw):
    try:
        parse_request_json(raw)
    except WireError as e:
        assert str(e)


def test_a_turn_full_of_braces_is_the_models_observation_not_a_400(open_server):
    """The container count guards /call bodies; a model's turn is text and may hold any braces."""
    turn = "{" * 200_000  # more braces than the count allows, all inside one string
    r = httpx.post(open_server.url + "/get_observation", json={"actions": [turn]}, timeout=60)
    assert r.status_code == 200 and r.json()["valids"] == [False]
