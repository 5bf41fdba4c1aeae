"""The tool client against a hostile server (issue 40, attack 5): real loopback sockets, a server
that drips, never ends its head, answers ``100 Continue`` forever, sends endless or huge bodies,
or leaves bytes after its answer. The client's worst case is its ``timeout_s``; it never reads
past ``max_response_mb``; every failure is a ``ToolBackendError``; a connection with unread bytes
is never reused. The router behind such an upstream answers 502, not 500."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from PIL import Image

from medvqa_env.errors import ConfigError, ToolBackendError
from tool_backends.base import ToolContext
from tool_backends.http_client import HTTPToolBackend

TOOLS = json.dumps({"tools": [{"type": "function", "function": {"name": "echo", "description": "",
                                                                 "parameters": {"type": "object"}}}]}).encode()


def answer(body: bytes, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
            + extra + b"\r\n" + body)


RESULT = json.dumps({"result": {"text": "fine", "error": None, "data": {}, "images": []}}).encode()


class HostileServer:
    """Answers ``GET /tools`` properly and every other request with ``behave(conn, n)`` (n: the
    request's number over all connections); gives up after ``lifetime_s``."""

    def __init__(self, behave, lifetime_s: float = 8.0) -> None:
        self.behave, self.lifetime_s = behave, lifetime_s
        self.requests, self.connections = [], 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        conn.settimeout(self.lifetime_s)
        reader = conn.makefile("rb")
        try:
            with conn:
                while True:
                    head = b""
                    while not head.endswith(b"\r\n\r\n"):
                        line = reader.readline()
                        if not line:
                            return
                        head += line
                    length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n")
                                   if l.lower().startswith(b"content-length")), 0)
                    reader.read(length)
                    self.requests.append(head.split(b" ")[1].decode())
                    if head.startswith(b"GET /tools "):
                        conn.sendall(answer(TOOLS))
                        continue
                    if self.behave(conn, len(self.requests) - 1) == "close":
                        return
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def hostile():
    servers = []

    def start(behave, lifetime_s: float = 8.0):
        servers.append(HostileServer(behave, lifetime_s))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def until(conn, seconds: float, piece: bytes, every_s: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(piece)
        time.sleep(every_s)
    return "close"


def drip_body(conn, n):
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n")
    return until(conn, 6, b" ", 0.1)


def endless_headers(conn, n):
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    return until(conn, 6, b"x-more: y\r\n", 0.005)


def dripped_head(conn, n):
    return until(conn, 6, b"H", 0.2)


def endless_continue(conn, n):
    return until(conn, 6, b"HTTP/1.1 100 Continue\r\n\r\n", 0.001)


def endless_chunks(conn, n):
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
    return until(conn, 6, b"100000\r\n" + b" " * 0x100000 + b"\r\n", 0)


def huge_length(conn, n):
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2000000000\r\n\r\n")
    return until(conn, 6, b" " * 65536, 0)


IMAGE = Image.new("RGB", (8, 8), (1, 2, 3))


def call(server, timeout_s=1.5, **options):
    backend = HTTPToolBackend(url=server.url, timeout_s=timeout_s, retries=2, backoff_s=0.01, **options)
    start = time.monotonic()
    with pytest.raises(ToolBackendError) as raised:
        backend.call("echo", [IMAGE], {}, ToolContext())
    return time.monotonic() - start, str(raised.value)


@pytest.mark.parametrize("behave", [drip_body, endless_headers, dripped_head, endless_continue])
def test_a_server_that_holds_the_call_cannot_hold_it_past_timeout_s(hostile, behave):
    elapsed, message = call(hostile(behave), timeout_s=1.5)
    assert elapsed < 1.5 + 0.5, (elapsed, message)


@pytest.mark.parametrize("behave", [endless_chunks, huge_length])
def test_an_endless_or_huge_body_is_cut_off_at_max_response_mb(hostile, behave):
    elapsed, message = call(hostile(behave), timeout_s=20, max_response_mb=4)
    assert "too large" in message and elapsed < 5, (elapsed, message)


@pytest.mark.parametrize("reply", [
    answer(b"not json"),
    answer(b'{"result": 5}'),
    answer(b"[]"),
    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!",  # ambiguous framing
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffffffffffff\r\n",  # a chunk size overflow
    b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999999999\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\xff\xfe: \x00\r\n\r\n",
])
def test_every_malformed_answer_is_a_tool_backend_error(hostile, reply):
    def behave(conn, n):
        conn.sendall(reply)
        return "close"

    elapsed, _ = call(hostile(behave), timeout_s=5)
    assert elapsed < 5


def test_malformed_tools_and_health_answers_are_clear_errors(hostile):
    class Garbage(HostileServer):
        def _connection(self, conn):
            with conn:
                conn.recv(65536)
                conn.sendall(answer(b"<html>not json</html>"))

    server = Garbage(lambda conn, n: None)
    try:
        with pytest.raises(ConfigError, match="malformed /tools"):
            HTTPToolBackend(url=server.url, retries=0).specs()
        with pytest.raises(ToolBackendError, match="malformed /health"):
            HTTPToolBackend(url=server.url, retries=0).health()
    finally:
        server.close()


def test_bytes_left_after_an_answer_are_never_read_as_the_next_one(hostile):
    evil = json.dumps({"result": {"text": "evil", "error": None, "data": {}, "images": []}}).encode()

    def behave(conn, n):
        if n == 0:
            conn.sendall(answer(RESULT) + answer(evil))  # a second answer nobody asked for
        else:
            conn.sendall(answer(RESULT))

    server = hostile(behave)
    backend = HTTPToolBackend(url=server.url, timeout_s=5, retries=0)
    assert [backend.call("echo", [IMAGE], {}, ToolContext()).text for _ in range(2)] == ["fine", "fine"]
    assert server.connections == 2


def test_bytes_arriving_on_an_idle_connection_retire_it(hostile):
    def behave(conn, n):
        conn.sendall(answer(RESULT))
        if n == 0:
            time.sleep(0.1)
            conn.sendall(answer(json.dumps({"result": {"text": "evil", "data": {}, "images": []}}).encode()))

    server = hostile(behave)
    backend = HTTPToolBackend(url=server.url, timeout_s=5, retries=0)
    assert backend.call("echo", [IMAGE], {}, ToolContext()).text == "fine"
    time.sleep(0.3)
    assert backend.call("echo", [IMAGE], {}, ToolContext()).text == "fine"
    assert server.connections == 2


def test_the_router_answers_502_behind_a_hostile_upstream(hostile):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_server_sharing import Served

    from tool_backends.router import create_router_app

    for behave in (endless_chunks, lambda conn, n: conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n")):
        upstream = hostile(behave)
        router = Served(create_router_app({"echo": upstream.url}, timeout_s=3.0, retries=0))
        try:
            start = time.monotonic()
            r = httpx.post(router.url + "/call", json={"tool": "echo", "images": []}, timeout=30)
            assert r.status_code == 502 and time.monotonic() - start < 10, (r.status_code, r.text[:200])
        finally:
            router.close()
