"""The client's own HTTP/1.1 connection (:class:`tool_backends.http_client.Connection`) against
scripted servers on real loopback sockets: the body framings a server or a proxy may answer with,
kept connections the server closed, and answers it must refuse instead of trusting."""

from __future__ import annotations

import http.client
import socket
import threading

import pytest

from medvqa_env.errors import ToolBackendError
from tool_backends.http_client import MAX_HEADERS, ConnectionPool, HTTPToolBackend


class ScriptedServer:
    """Accepts connections on a free loopback port; answers the n-th request (over all
    connections) with ``answers[n]`` (raw bytes), then closes the connection when ``close_after``
    holds n. Records each request's raw head and body."""

    def __init__(self, answers: list[bytes], close_after: set[int] = frozenset()) -> None:
        self.answers, self.close_after = answers, set(close_after)
        self.requests: list[bytes] = []
        self.connections = 0
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
        reader = conn.makefile("rb")
        with conn:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")), 0)
                n = len(self.requests)
                self.requests.append(head + reader.read(length))
                conn.sendall(self.answers[n])
                if n in self.close_after:
                    return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def scripted():
    servers = []

    def start(answers, close_after=()):
        servers.append(ScriptedServer(answers, close_after))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def pool_for(server: ScriptedServer) -> ConnectionPool:
    return ConnectionPool(server.url, size=2, connect_timeout_s=2)


def test_one_request_goes_out_whole_and_its_content_length_body_comes_back(scripted):
    server = scripted([b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}'])
    response = pool_for(server).request("POST", "/call", b'{"tool": "x"}', {"accept": "application/json"}, 5)
    assert (response.status_code, response.json(), response.headers["content-type"]) == (200, {"ok": True}, "application/json")
    request = server.requests[0]
    assert request.startswith(b"POST /call HTTP/1.1\r\n") and request.endswith(b'\r\n\r\n{"tool": "x"}')
    assert b"content-length: 13\r\n" in request and b"accept: application/json\r\n" in request


def test_a_chunked_body_is_reassembled_and_the_connection_kept(scripted):
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n"
    server = scripted([chunked, chunked])
    pool = pool_for(server)
    assert [pool.request("GET", "/health", None, {}, 5).content for _ in range(2)] == [b"hello, world"] * 2
    assert server.connections == 1  # kept alive between the two


def test_a_body_delimited_by_the_close_is_read_to_the_end_and_not_kept(scripted):
    server = scripted([b"HTTP/1.0 200 OK\r\n\r\nall of it", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"],
                      close_after={0})
    pool = pool_for(server)
    assert pool.request("GET", "/a", None, {}, 5).content == b"all of it"
    assert pool.request("GET", "/b", None, {}, 5).content == b"ok"
    assert server.connections == 2


def test_a_kept_connection_the_server_closed_is_replaced_once_silently(scripted):
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    server = scripted([ok, ok], close_after={0})  # closes after answering, without saying so
    pool = pool_for(server)
    assert [pool.request("GET", "/health", None, {}, 5).content for _ in range(2)] == [b"ok", b"ok"]
    assert server.connections == 2


@pytest.mark.parametrize("answer", [
    b"SPDY/9 200 OK\r\n\r\n",  # not HTTP
    b"HTTP/1.1 2000 OK\r\n\r\n",  # not a status
    b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",  # the body ends early (the server closes)
    b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nx: " + b"a" * 70000 + b"\r\n\r\n",  # a header line past the bound
    b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * (MAX_HEADERS + 1) + b"\r\n",  # too many headers
])
def test_a_malformed_answer_is_a_transport_error_not_a_hang_or_a_crash(scripted, answer):
    server = scripted([answer], close_after={0})
    with pytest.raises(http.client.HTTPException):
        pool_for(server).request("GET", "/health", None, {}, 5)


def test_the_backend_reports_a_malformed_answer_as_the_server_unavailable(scripted):
    server = scripted([b"SPDY/9 200 OK\r\n\r\n"] * 3, close_after={0, 1, 2})
    backend = HTTPToolBackend(url=server.url, retries=2, backoff_s=0.01)
    with pytest.raises(ToolBackendError, match="unavailable"):
        backend.health()
    assert len(server.requests) == 3  # retried like a reset connection


def test_a_header_value_cannot_split_the_request(scripted):
    server = scripted([b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"])
    with pytest.raises(ValueError, match="invalid header"):
        pool_for(server).request("GET", "/", None, {"x-token": "a\r\nhost: evil"}, 5)
    assert server.requests == []  # refused before a byte went out


def test_an_answer_that_never_has_a_body_is_not_waited_for(scripted):
    """204 (and HEAD answers) carry no body even without content-length: reading one would wait
    for the connection's end, which a keep-alive server never sends."""
    server = scripted([b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"])
    pool = pool_for(server)
    assert pool.request("POST", "/x", b"{}", {}, 2).content == b""
    assert pool.request("GET", "/y", None, {}, 2).content == b"ok"
    assert server.connections == 1
