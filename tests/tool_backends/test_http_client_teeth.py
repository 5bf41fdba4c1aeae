"""Teeth for the project's own HTTP client (issue 40, mutation testing of
``tool_backends/http_client.py``): :class:`Connection`, :class:`ConnectionPool` and
``HTTPToolBackend``'s request loop against scripted servers on loopback sockets, each a thread of
this process (``benchmarks/mutation.py`` runs this file per mutant). Each test pins what a one-token
change would move:

* the deadline: connecting, sending, the head and the body inside one ``timeout`` (a server that
  never reads, never accepts, or drips); the retry loop's attempts, backoff and last deadline;
* the caps: the declared and the streamed body (the cap itself passes, one byte over refuses),
  the head's bytes and headers, interim answers (the bound itself passes, one more refuses);
* strict framing: what goes out (``content-length`` by method, no header splitting), what is
  refused coming back (``ProtocolError``, a ``ToolBackendError`` for the backend), a connection
  never kept after an error or with bytes or a close after its answer, a kept one the server
  closed replaced once with the same request;
* TLS for ``https``, the token header, and what a pickled backend leaves behind.
"""

from __future__ import annotations

import http.client
import pickle
import socket
import ssl
import threading
import time
from collections import OrderedDict

import pytest

from medvqa_env.errors import ConfigError, ToolBackendError
from tool_backends import http_client as hc
from tool_backends.http_client import (MAX_HEADERS, MAX_INTERIM, Connection, ConnectionPool, HTTPToolBackend,
                                       ProtocolError, ResponseTooLarge, ServerUnavailable)

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def read_request(reader) -> tuple[bytes, bytes] | None:
    """One request's head and body (content-length framed), or ``None`` when the client closed."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = reader.readline()
        if not line:
            return None
        head += line
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head, reader.read(length)


class Script:
    """A loopback server: every accepted connection runs ``handle(server, conn, reader)`` in its
    own thread; requests read with :meth:`next` are recorded (head, body)."""

    def __init__(self, handle, host: str = "127.0.0.1", lifetime_s: float = 6.0) -> None:
        self.handle, self.lifetime_s = handle, lifetime_s
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn) -> None:
        conn.settimeout(self.lifetime_s)
        try:
            with conn:
                self.handle(self, conn, conn.makefile("rb"))
        except OSError:
            pass

    def next(self, reader):
        got = read_request(reader)
        if got is not None:
            self.requests.append(got)
        return got

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve():
    started = []

    def start(handle, **kw):
        started.append(Script(handle, **kw))
        return started[-1]

    yield start
    for s in started:
        s.close()


def answering(*answers: bytes, then_close: bool = False):
    """A handler answering its connection's requests with ``answers`` in turn (the last repeats)."""
    def handle(server, conn, reader):
        n = 0
        while server.next(reader) is not None:
            conn.sendall(answers[min(n, len(answers) - 1)])
            n += 1
            if then_close:
                return
    return handle


def connect(server, timeout=2.0, **kw) -> Connection:
    return Connection(server.host, server.port, timeout, **kw)


def in_time(fn, limit_s: float):
    """``fn()``'s result or exception, failing the test if it takes over ``limit_s`` (a hung call
    is left behind in its daemon thread instead of hanging the test)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            out["error"] = e

    start = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"still running after {limit_s} s"
    out["took"] = time.monotonic() - start
    return out


# ---------------------------------------------------------------- what goes out
def test_content_length_goes_with_a_body_and_with_every_post_or_put(serve):
    server = serve(answering(OK))
    conn = connect(server)
    for method, body in (("GET", None), ("POST", None), ("PUT", None), ("DELETE", b"ab"), ("POST", b"xyz"),
                         ("GET", b"")):
        assert conn.request(method, "/p", body, {}, 2.0).content == b"ok"
    heads = [h.lower() for h, _ in server.requests]
    has = [b"content-length:" in h for h in heads]
    assert has == [False, True, True, True, True, True]
    assert b"content-length: 0\r\n" in heads[1] and b"content-length: 0\r\n" in heads[2]
    assert b"content-length: 2\r\n" in heads[3] and server.requests[3][1] == b"ab"
    assert server.requests[4][1] == b"xyz" and b"content-length: 0\r\n" in heads[5]
    assert all(h.startswith(m.encode() + b" /p HTTP/1.1\r\n") for h, m in
               zip([h for h, _ in server.requests], ["GET", "POST", "PUT", "DELETE", "POST", "GET"]))
    assert all(f"host: {server.host}:{server.port}\r\n".encode() in h for h in heads)
    assert server.connections == 1  # all on one kept connection


def test_a_header_is_refused_only_for_cr_lf_or_nul(serve):
    server = serve(answering(OK))
    conn = connect(server)
    assert conn.request("GET", "/", None, {"x-trace": "XYZ", "XX": "x"}, 2.0).status_code == 200
    assert b"x-trace: XYZ\r\n" in server.requests[0][0]
    for bad in ({"x": "a\r\nInjected: 1"}, {"x\nInjected": "1"}, {"x": "a\0b"}, {"bad\r\n": "v"}):
        with pytest.raises(ValueError, match="^invalid header "):
            conn.request("GET", "/", None, bad, 2.0)
    assert len(server.requests) == 1


def test_a_request_h11_cannot_frame_is_a_value_error_with_its_reason(serve):
    conn = connect(serve(answering(OK)))
    with pytest.raises(ValueError, match="^cannot send this request: .+"):
        conn.request("GET", "/a b", None, {}, 2.0)


# ---------------------------------------------------------------- the head and the body coming back
def test_repeated_headers_are_joined_and_names_lower_cased(serve):
    answer = b"HTTP/1.1 200 OK\r\nX-A: 1\r\nx-a: 2\r\nX-B: \xe9\r\ncontent-length: 0\r\n\r\n"
    response = connect(serve(answering(answer))).request("GET", "/", None, {}, 2.0)
    assert response.headers["x-a"] == "1, 2" and response.headers["x-b"] == "\xe9"
    assert response.content == b""


def test_a_head_under_the_bound_is_read_whole_and_one_over_is_refused(serve):
    big = b"x-big: " + b"v" * 40000 + b"\r\n"  # past h11's own default of 16 KiB, within the client's 64 KiB
    response = connect(serve(answering(b"HTTP/1.1 200 OK\r\n" + big + b"content-length: 2\r\n\r\nok"))).request(
        "GET", "/", None, {}, 2.0)
    assert response.content == b"ok" and len(response.headers["x-big"]) == 40000
    huge = b"x-big: " + b"v" * 70000 + b"\r\n"
    conn = connect(serve(answering(b"HTTP/1.1 200 OK\r\n" + huge + b"content-length: 2\r\n\r\nok")))
    with pytest.raises(ProtocolError, match="^malformed response: "):
        conn.request("GET", "/", None, {}, 2.0)
    assert conn.will_close is True


def test_a_head_under_the_bound_that_arrives_in_pieces_is_read_whole(serve):
    """h11 checks its buffer against its bound only while a head is incomplete: sent in one piece,
    a 40 KB head parses before any check (the test above), so only a head that arrives in parts
    shows that the client raised h11's 16 KiB default to its own 64 KiB."""
    head = b"HTTP/1.1 200 OK\r\nx-big: " + b"v" * 40000 + b"\r\ncontent-length: 2\r\n\r\nok"

    def in_pieces(server, conn, reader):
        server.next(reader)
        for i in range(0, len(head), 4096):
            conn.sendall(head[i:i + 4096])
            time.sleep(0.01)

    response = connect(serve(in_pieces)).request("GET", "/", None, {}, 3.0)
    assert response.content == b"ok" and len(response.headers["x-big"]) == 40000


def test_exactly_max_headers_pass_and_one_more_is_refused(serve):
    def answer(n):
        return (b"HTTP/1.1 200 OK\r\n" + b"".join(b"h%d: v\r\n" % i for i in range(n - 1))
                + b"content-length: 2\r\n\r\nok")

    assert connect(serve(answering(answer(MAX_HEADERS)))).request("GET", "/", None, {}, 2.0).content == b"ok"
    conn = connect(serve(answering(answer(MAX_HEADERS + 1))))
    with pytest.raises(ProtocolError) as e:
        conn.request("GET", "/", None, {}, 2.0)
    assert str(e.value) == f"more than {MAX_HEADERS} headers" and conn.will_close is True


def test_exactly_max_interim_answers_pass_and_one_more_is_refused(serve):
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    conn = connect(serve(answering(interim * MAX_INTERIM + OK)))
    assert conn.request("POST", "/", b"{}", {}, 2.0).content == b"ok"
    assert conn.will_close is False
    conn = connect(serve(answering(interim * (MAX_INTERIM + 1) + OK)))
    with pytest.raises(ProtocolError) as e:
        conn.request("POST", "/", b"{}", {}, 2.0)
    assert str(e.value) == f"more than {MAX_INTERIM} interim (1xx) answers" and conn.will_close is True


CAP = 1000


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_of_exactly_the_cap_is_read_and_one_byte_more_is_refused(serve, chunked):
    def answer(n):
        if chunked:  # no length declared: counted as it streams
            half = n // 2
            return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n" % half + b"a" * half
                    + b"\r\n%x\r\n" % (n - half) + b"b" * (n - half) + b"\r\n0\r\n\r\n")
        return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % n + b"a" * n

    conn = connect(serve(answering(answer(CAP))), max_response_bytes=CAP)
    assert len(conn.request("GET", "/", None, {}, 2.0).content) == CAP
    assert conn.will_close is False
    conn = connect(serve(answering(answer(CAP + 1))), max_response_bytes=CAP)
    with pytest.raises(ResponseTooLarge) as e:
        conn.request("GET", "/", None, {}, 2.0)
    assert conn.will_close is True
    if chunked:
        assert str(e.value) == f"a response body over the client's limit of {CAP} bytes"
    else:
        assert str(e.value) == f"a response body of {CAP + 1} bytes is over the client's limit of {CAP}"


def test_a_declared_length_over_the_cap_is_refused_from_the_head_alone(serve):
    # the server declares 10 GB and sends nothing more: refused at once, not waited for
    conn = connect(serve(answering(b"HTTP/1.1 200 OK\r\ncontent-length: 10000000000\r\n\r\n")),
                   max_response_bytes=CAP)
    out = in_time(lambda: conn.request("GET", "/", None, {}, 1.5), 3)
    assert isinstance(out.get("error"), ResponseTooLarge), out
    assert str(out["error"]) == f"a response body of 10000000000 bytes is over the client's limit of {CAP}"
    assert out["took"] < 1.0


def test_the_pool_and_the_backend_pass_their_cap_on(serve):
    server = serve(answering(b"HTTP/1.1 200 OK\r\ncontent-length: 2000\r\n\r\n" + b"a" * 2000))
    pool = ConnectionPool(server.url, 2, 2.0, max_response_bytes=CAP)
    with pytest.raises(ResponseTooLarge):
        pool.request("GET", "/", None, {}, 2.0)
    backend = HTTPToolBackend(url=server.url, max_response_mb=CAP / (1 << 20), retries=0)
    with pytest.raises(ToolBackendError) as e:
        backend._request("GET", "/x", "Tool 'echo'")
    assert str(e.value) == ("Tool 'echo' sent an answer too large to read (a response body of 2000 bytes is over "
                            f"the client's limit of {CAP}). Try another tool or answer without it.")
    assert not isinstance(e.value, ServerUnavailable)


def test_a_malformed_answer_is_a_protocol_error_and_the_connection_is_dropped(serve):
    for answer in (b"HTTP/1.1 200 OK\r\nconte", b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabcd",
                   b"HTTP/1.1 abc\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n"):
        conn = connect(serve(answering(answer, then_close=True)))
        with pytest.raises(ProtocolError, match="^malformed response: .+"):
            conn.request("GET", "/", None, {}, 2.0)
        assert conn.will_close is True, answer


def test_a_close_before_any_byte_is_remote_disconnected(serve):
    def close_at_once(server, conn, reader):
        server.next(reader)

    conn = connect(serve(close_at_once))
    with pytest.raises(http.client.RemoteDisconnected) as e:
        conn.request("GET", "/", None, {}, 2.0)
    assert str(e.value) == "Remote end closed connection without response" and conn.will_close is True


def test_an_answer_with_bytes_after_it_or_a_close_is_not_kept(serve):
    conn = connect(serve(answering(OK + b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nevil")))
    assert conn.request("GET", "/", None, {}, 2.0).content == b"ok" and conn.will_close is True
    conn = connect(serve(answering(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok")))
    assert conn.request("GET", "/", None, {}, 2.0).content == b"ok" and conn.will_close is True
    conn = connect(serve(answering(OK)))
    assert conn.request("GET", "/", None, {}, 2.0).content == b"ok" and conn.will_close is False
    assert conn.request("GET", "/", None, {}, 2.0).content == b"ok" and conn.will_close is False


def test_an_early_refusal_while_the_body_goes_out_is_read_and_not_kept(serve):
    def refuse_early(server, conn, reader):
        reader.readline()  # the request line only
        conn.sendall(b"HTTP/1.1 413 Too Large\r\ncontent-length: 4\r\n\r\nbig!")
        conn.shutdown(socket.SHUT_WR)
        time.sleep(0.3)
        # closed with the body unread: the client's send breaks

    conn = connect(serve(refuse_early))
    response = conn.request("POST", "/", b"x" * (32 << 20), {}, 5.0)
    assert response.status_code == 413 and response.content == b"big!"
    assert conn.will_close is True


# ---------------------------------------------------------------- one deadline
def test_connecting_has_its_own_timeout(serve):
    conn = connect(serve(answering(OK)), timeout=0.7)
    assert conn.sock.gettimeout() == 0.7
    assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_a_server_that_never_reads_cannot_hold_the_send(serve):
    def never_read(server, conn, reader):
        time.sleep(4)

    conn = connect(serve(never_read))
    out = in_time(lambda: conn.request("POST", "/", b"x" * (64 << 20), {}, 0.4), 3)
    assert isinstance(out.get("error"), (TimeoutError, socket.timeout)), out
    assert out["took"] < 1.5


def test_a_dripping_answer_ends_at_the_deadline(serve):
    def drip(server, conn, reader):
        server.next(reader)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
        for _ in range(100):
            conn.sendall(b"x")
            time.sleep(0.05)

    conn = connect(serve(drip))
    out = in_time(lambda: conn.request("GET", "/", None, {}, 0.5), 3)
    assert isinstance(out.get("error"), (TimeoutError, socket.timeout)), out
    assert 0.4 < out["took"] < 1.5


def test_the_deadline_left_is_exact_and_past_it_a_timeout_error():
    assert 4.9 < Connection._left(time.monotonic() + 5) <= 5
    assert 0 < Connection._left(time.monotonic() + 0.5) <= 0.5
    with pytest.raises(TimeoutError) as e:
        Connection._left(time.monotonic() - 0.001)
    assert str(e.value) == "the request's deadline passed"


def test_a_pool_connects_within_its_connect_timeout_and_to_its_own_host(serve):
    server = serve(answering(OK), host="127.0.0.2")  # not where an address of None would lead
    pool = ConnectionPool(server.url, 2, connect_timeout_s=0.3)
    conn = pool._new(5.0)
    assert conn.sock.gettimeout() == 0.3 and conn.sock.getpeername() == ("127.0.0.2", server.port)
    assert conn.max_response_bytes == pool.max_response_bytes
    assert pool._new(0.1).sock.gettimeout() == 0.1
    assert pool.request("GET", "/", None, {}, 2.0).content == b"ok"


# ---------------------------------------------------------------- the pool
def test_pool_urls():
    p = ConnectionPool("https://example.org/x", 1, 1.0)
    assert (p.https, p.host, p.port) == (True, "example.org", 443) and isinstance(p._tls, ssl.SSLContext)
    p = ConnectionPool("http://example.org", 1, 1.0)
    assert (p.https, p.host, p.port, p._tls) == (False, "example.org", 80, None)
    p = ConnectionPool("HTTPS://h:8443", 3, "1.5")
    assert (p.https, p.host, p.port, p.size, p.connect_timeout_s) == (True, "h", 8443, 3, 1.5) and p._tls is not None
    p = ConnectionPool("http://:7", 1, 1.0)
    assert (p.host, p.port) == ("127.0.0.1", 7)


def test_an_https_pool_speaks_tls_to_the_server(serve):
    seen = []

    def plain(server, conn, reader):
        seen.append(conn.recv(4096))
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")

    server = serve(plain)
    pool = ConnectionPool(f"https://{server.host}:{server.port}", 1, 2.0)
    with pytest.raises(ssl.SSLError):  # the plain-HTTP server's answer is no TLS handshake
        pool.request("GET", "/", None, {}, 2.0)
    assert seen and seen[0][:1] == b"\x16"  # a TLS handshake record went out, not "GET / HTTP/1.1"


def test_a_kept_connection_closed_as_the_request_goes_out_is_replaced_with_the_same_request(serve):
    def handle(server, conn, reader):
        got = server.next(reader)
        if got is None:
            return
        if server.connections == 1:
            conn.sendall(OK)
            read_request(reader)  # the second request: closed unanswered, as a server timing out its keep-alive
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfresh")
        server.next(reader)

    server = serve(handle)
    pool = ConnectionPool(server.url, 2, 2.0)
    assert pool.request("POST", "/a", b"one", {}, 2.0).content == b"ok"
    assert len(pool._idle) == 1
    response = pool.request("PUT", "/b", b"two", {"x-k": "v"}, 2.0)
    assert response.content == b"fresh" and server.connections == 2
    head, body = server.requests[-1]
    assert head.startswith(b"PUT /b HTTP/1.1\r\n") and body == b"two" and b"x-k: v\r\n" in head


def test_a_request_on_a_kept_connection_sends_its_body(serve):
    server = serve(answering(OK))
    pool = ConnectionPool(server.url, 2, 2.0)
    pool.request("POST", "/", b"first", {}, 2.0)
    pool.request("POST", "/", b"second", {}, 2.0)
    assert [b for _, b in server.requests] == [b"first", b"second"] and server.connections == 1


def test_the_pool_keeps_at_most_its_size_and_closes_the_rest(serve):
    server = serve(answering(OK))
    pool = ConnectionPool(server.url, 1, 2.0)
    a, b = pool._new(2.0), pool._new(2.0)
    pool._send(a, "GET", "/", None, {}, 2.0)
    pool._send(b, "GET", "/", None, {}, 2.0)
    assert pool._idle == [a] and b.sock.fileno() == -1
    pool.close()
    assert pool._idle == [] and a.sock.fileno() == -1


def test_a_connection_that_failed_is_closed_and_not_kept(serve):
    server = serve(answering(b"HTTP/1.1 200 OK\r\ncontent-length: 5000\r\n\r\n" + b"a" * 5000))
    pool = ConnectionPool(server.url, 2, 2.0, max_response_bytes=CAP)
    conn = pool._new(2.0)
    with pytest.raises(ResponseTooLarge):
        pool._send(conn, "GET", "/", None, {}, 2.0)
    assert pool._idle == [] and conn.sock.fileno() == -1


def test_an_idle_connection_with_anything_to_read_is_not_ok(serve):
    def unsolicited(server, conn, reader):
        server.next(reader)
        conn.sendall(OK)
        time.sleep(0.2)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        time.sleep(2)

    conn = connect(serve(unsolicited))
    conn.request("GET", "/", None, {}, 2.0)
    assert conn.idle_ok() is True
    start = time.monotonic()
    assert conn.idle_ok() is True and time.monotonic() - start < 0.1  # a look, not a wait
    time.sleep(0.4)
    assert conn.idle_ok() is False
    conn.close()
    assert conn.idle_ok() is False  # a closed socket cannot carry the next request


# ---------------------------------------------------------------- the backend's request loop
class FakeTime:
    """The module's clock with sleeps that pass at once (recorded), ``overshoot`` seconds late."""

    def __init__(self, overshoot: float = 0.0) -> None:
        self.skew, self.overshoot, self.sleeps = 0.0, overshoot, []

    def monotonic(self) -> float:
        return time.monotonic() + self.skew

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.skew += s + self.overshoot


def busy(server, conn, reader):
    while server.next(reader) is not None:
        conn.sendall(b"HTTP/1.1 503 Busy\r\ncontent-length: 0\r\n\r\n")


def test_503s_are_retried_with_doubling_backoff_then_reported(serve, monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(hc, "time", clock)
    server = serve(busy)
    backend = HTTPToolBackend(url=server.url, timeout_s=30, retries=3, backoff_s=0.25)
    with pytest.raises(ServerUnavailable) as e:
        backend._request("GET", "/x", "Tool 'echo'")
    assert len(server.requests) == 4 and clock.sleeps == [0.25, 0.5, 1.0]
    assert str(e.value) == (f"Tool 'echo' is unavailable: {server.url} answered 503. Try another tool or "
                            "answer without it.")
    assert e.value.problem == "it answered HTTP 503, 4 attempts"


def test_one_attempt_is_one_attempt_and_no_sleep(serve, monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(hc, "time", clock)
    server = serve(busy)
    with pytest.raises(ServerUnavailable) as e:
        HTTPToolBackend(url=server.url, retries=0, backoff_s=0.25)._request("GET", "/x", "Tool 'echo'")
    assert e.value.problem == "it answered HTTP 503, 1 attempt" and clock.sleeps == [] and len(server.requests) == 1


def test_no_retry_sleeps_past_the_deadline(serve, monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(hc, "time", clock)
    server = serve(busy)
    with pytest.raises(ServerUnavailable) as e:
        HTTPToolBackend(url=server.url, timeout_s=1.0, retries=5, backoff_s=0.4)._request("GET", "/x", "T")
    assert clock.sleeps == [0.4] and len(server.requests) == 2  # 0.4 + 0.8 would pass the 1 s deadline
    assert e.value.problem == "it answered HTTP 503, 2 attempts"


def test_a_retry_that_wakes_past_the_deadline_is_not_sent(serve, monkeypatch):
    clock = FakeTime(overshoot=0.8)
    monkeypatch.setattr(hc, "time", clock)
    server = serve(busy)
    with pytest.raises(ServerUnavailable) as e:
        HTTPToolBackend(url=server.url, timeout_s=1.0, retries=3, backoff_s=0.3)._request("GET", "/x", "T")
    assert len(server.requests) == 1 and clock.sleeps == [0.3]
    assert e.value.problem == "it answered HTTP 503, 1 attempt"


def test_a_refused_connection_is_retried_and_reported_by_name():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    backend = HTTPToolBackend(url=url, retries=2, backoff_s=0.001)
    with pytest.raises(ServerUnavailable) as e:
        backend._request("GET", "/x", "Tool 'echo'")
    assert str(e.value) == (f"Tool 'echo' is unavailable: could not reach {url} (ConnectionRefusedError). "
                            "Try another tool or answer without it.")
    assert e.value.problem == "ConnectionRefusedError ([Errno 111] Connection refused), 3 attempts"


class Failing:
    """A pool whose every request fails with ``error`` (an exception without a message)."""

    def __init__(self, error) -> None:
        self.error, self.calls = error, 0

    def request(self, *a):
        self.calls += 1
        raise self.error


def test_a_failure_without_a_message_is_named_alone():
    backend = HTTPToolBackend(url="http://127.0.0.1:9", retries=1, backoff_s=0.001)
    backend._pool = Failing(ConnectionResetError())
    with pytest.raises(ServerUnavailable) as e:
        backend._request("GET", "/x", "T")
    assert e.value.problem == "ConnectionResetError, 2 attempts" and backend._pool.calls == 2


def test_a_call_that_times_out_says_so_with_its_timeout(serve):
    def silent(server, conn, reader):
        server.next(reader)
        time.sleep(3)

    server = serve(silent)
    backend = HTTPToolBackend(url=server.url, timeout_s=0.4, retries=3)
    out = in_time(lambda: backend._request("POST", "/call", "Tool 'echo'", content=b"{}"), 3)
    e = out.get("error")
    assert isinstance(e, ServerUnavailable), out
    assert str(e) == f"Tool 'echo' timed out after 0.4 s (server {server.url}). Try another tool or answer without it."
    assert e.problem == "no answer within 0.4 s"
    assert len(server.requests) == 1 and out["took"] < 1.2  # a timeout is not retried


def test_a_short_timeout_still_sends_the_request_and_its_body(serve):
    server = serve(answering(OK))
    backend = HTTPToolBackend(url=server.url, timeout_s=0.5)
    response = backend._request("POST", "/call", "T", content=b'{"a":1}', headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.content == b"ok"
    assert server.requests[0][1] == b'{"a":1}'


def test_the_token_goes_in_the_authorization_header(serve, monkeypatch):
    monkeypatch.setenv("MEDVQA_TEETH_TOKEN", "tok-123")
    server = serve(answering(OK))
    backend = HTTPToolBackend(url=server.url, token_env="MEDVQA_TEETH_TOKEN")
    backend._request("GET", "/tools", "T", headers={"accept": "application/json"})
    head = server.requests[0][0]
    assert b"authorization: Bearer tok-123\r\n" in head and b"accept: application/json\r\n" in head
    monkeypatch.delenv("MEDVQA_TEETH_TOKEN")
    with pytest.raises(ConfigError):
        HTTPToolBackend(url=server.url, token_env="MEDVQA_TEETH_TOKEN")


@pytest.mark.parametrize("fmt,accept", [("raw", f"{hc.FRAMES}, application/json"), ("png", "application/json")])
def test_the_headers_ask_for_frames_only_for_raw_results(fmt, accept):
    backend = HTTPToolBackend(url="http://127.0.0.1:9", result_format=fmt)
    assert backend._headers == {"content-type": "application/json", "accept": accept}


def test_a_pickled_backend_carries_no_pool_token_or_sent_images(serve, monkeypatch):
    monkeypatch.setenv("MEDVQA_TEETH_TOKEN", "tok-secret-456")
    server = serve(answering(OK))
    backend = HTTPToolBackend(url=server.url, token_env="MEDVQA_TEETH_TOKEN", timeout_s=7)
    backend._request("GET", "/x", "T")
    backend._sent.add("digest-1")
    backend._encoded["k"] = "v"
    blob = pickle.dumps(backend)
    assert b"tok-secret-456" not in blob
    copy = pickle.loads(blob)
    assert copy._pool is None and copy._auth == {} and copy._sent == set()
    assert copy._encoded == OrderedDict() and isinstance(copy._encoded, OrderedDict)
    assert (copy.url, copy.timeout_s, copy.token_env) == (server.url, 7.0, "MEDVQA_TEETH_TOKEN")
    # the original keeps its own
    assert backend._pool is not None and backend._sent == {"digest-1"} and backend._encoded == {"k": "v"}
    assert backend._auth == {"authorization": "Bearer tok-secret-456"}
    assert copy._request("GET", "/y", "T").content == b"ok"  # the copy reconnects, token read again
    assert b"authorization: Bearer tok-secret-456\r\n" in server.requests[-1][0]


class Ticking(FakeTime):
    """A clock a whole second further on at every look: the deadline passes before any attempt."""

    def monotonic(self) -> float:
        self.skew += 1.0
        return time.monotonic() + self.skew


def test_a_deadline_gone_before_the_first_attempt_is_reported_not_a_name_error(serve, monkeypatch):
    monkeypatch.setattr(hc, "time", Ticking())
    server = serve(busy)
    with pytest.raises(ServerUnavailable) as e:
        HTTPToolBackend(url=server.url, timeout_s=0.5)._request("GET", "/x", "T")
    assert str(e.value) == "T is unavailable: no time left within 0.5 s. Try another tool or answer without it."
    assert e.value.problem == "no attempt made, 0 attempts" and server.requests == []
