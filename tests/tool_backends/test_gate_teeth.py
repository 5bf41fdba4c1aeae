"""Teeth for the tool server's request path (issue 40, mutation testing): ``RequestGate`` and the
head checks in front of every endpoint, driven by raw ASGI calls in this process (no socket, no
server: ``benchmarks/mutation.py`` runs this file per mutant). Each test pins what a one-token change
of ``tool_backends/server.py``'s gate would move:

* auth: the token (exactly ``Bearer <token>``) before any body byte, ``/health`` alone open; without
  a token, a loopback ``Host``/``Origin`` and ``application/json`` before any body byte;
* limits: the declared and the streamed body size (the limit itself passes, one byte over is 413),
  the per-part and the whole-body deadlines (408, each with its own sentence), a malformed length;
* framing: the app gets exactly the body, once, then only the client's going; a refusal closes the
  connection with a ``{"detail"}`` body of the right length; a client that goes cancels its request
  (not one whose answer is complete, not a cancel from outside);
* the settings' own bounds (``check_settings``) and the loopback names.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from starlette.datastructures import Headers

from medvqa_env.errors import ConfigError
from tool_backends import server as srv
from tool_backends.server import (RequestGate, ServerSettings, _host_name, _plain, _within, check_settings,
                                  is_loopback, refuse_head, refuse_media)

TOKEN = "s3cret-token"


class App:
    """The app behind the gate: records what it was handed; reads the body unless told not to."""

    def __init__(self, read: bool = True, then=None) -> None:
        self.calls: list[dict] = []
        self.read, self.then = read, then
        self.received: list[dict] = []
        self.cancelled = False
        self.done = False

    async def __call__(self, scope, receive, send):
        self.calls.append(scope)
        self.receive = receive
        try:
            if self.read:
                while True:
                    message = await receive()
                    self.received.append(message)
                    if not message.get("more_body"):
                        break
            if self.then is not None:
                await self.then(receive, send)
            else:
                body = b"".join(m.get("body", b"") for m in self.received)
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": body})
            self.done = True
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class Client:
    """The client side of one ASGI request: ``steps`` are messages (dicts) or pauses (seconds);
    past them it stays connected (``gone=False``) or says it has gone."""

    def __init__(self, steps=(), gone: bool = False) -> None:
        self.steps, self.gone = list(steps), gone
        self.reads = 0
        self.sent: list[dict] = []

    async def receive(self):
        self.reads += 1
        while self.steps:
            step = self.steps.pop(0)
            if isinstance(step, dict):
                return step
            await asyncio.sleep(step)
        if self.gone:
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)

    async def send(self, message):
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)

    @property
    def headers(self) -> dict[bytes, bytes]:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return dict(start["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    @property
    def detail(self) -> str:
        return json.loads(self.body)["detail"]


def scope_of(method="POST", path="/call", headers=(), kind="http") -> dict:
    return {"type": kind, "method": method, "path": path, "headers": [(k.encode(), v.encode()) for k, v in headers],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "scheme": "http", "query_string": b"",
            "root_path": ""}


JSON = (("host", "127.0.0.1"), ("content-type", "application/json"))


def body(data: bytes, more: bool = False) -> dict:
    return {"type": "http.request", "body": data, "more_body": more}


def drive(settings: ServerSettings, client: Client, app: App | None = None, timeout: float = 3.0, **scope) -> App:
    app = app or App()
    gate = RequestGate(app, settings)
    asyncio.run(asyncio.wait_for(gate(scope_of(**scope), client.receive, client.send), timeout))
    return app


def assert_refused_unread(client: Client, app: App, status: int) -> None:
    """Answered ``status`` with a detail, the connection closed, no body byte read, the app never run."""
    assert client.status == status
    assert client.headers[b"connection"] == b"close"
    assert client.reads == 0
    assert app.calls == []


# ---------------------------------------------------------------- the token, before the body
@pytest.mark.parametrize("auth", [None, "", "Bearer", f"Bearer {TOKEN}x", f"bearer {TOKEN}", f"Bearer  {TOKEN}",
                                  TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN[:-1]}"])
@pytest.mark.parametrize("path", ["/call", "/call_batch", "/get_observation", "/nope"])
def test_a_wrong_or_missing_token_is_401_before_any_body_byte(auth, path):
    headers = JSON + ((("authorization", auth),) if auth is not None else ())
    client = Client([body(b"{}")])
    app = drive(ServerSettings(token=TOKEN), client, path=path, headers=headers)
    assert_refused_unread(client, app, 401)
    assert client.detail == "missing or wrong bearer token"
    assert TOKEN not in client.body.decode()


def test_the_right_token_lets_the_body_through_to_the_app():
    client = Client([body(b'{"a": 1}')])
    app = drive(ServerSettings(token=TOKEN), client,
                headers=(("host", "example.org"), ("authorization", f"Bearer {TOKEN}"), ("content-type", "text/plain")))
    # with a token, neither the Host nor the content type is checked
    assert client.status == 200 and client.body == b'{"a": 1}'
    assert len(app.calls) == 1 and app.calls[0]["path"] == "/call"


@pytest.mark.parametrize("method,path", [("GET", "/tools"), ("POST", "/health"), ("GET", "/health/x"),
                                         ("GET", "/healthz"), ("OPTIONS", "/health"), ("GET", "/")])
def test_only_get_and_head_of_health_are_open(method, path):
    client = Client()
    app = drive(ServerSettings(token=TOKEN), client, method=method, path=path, headers=JSON)
    assert_refused_unread(client, app, 401)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_health_needs_no_token_and_gets_and_heads_are_handed_on_unread(method):
    for path, settings in (("/health", ServerSettings(token=TOKEN)), ("/tools", ServerSettings())):
        client = Client([body(b"never read")])
        app = drive(settings, client, App(read=False), method=method, path=path, headers=JSON)
        assert client.status == 200
        assert len(app.calls) == 1 and client.reads == 0
        assert app.receive == client.receive  # the client's own receive: nothing buffered, nothing checked


def test_an_authorised_head_with_characters_past_latin_1_is_a_401_not_an_error():
    headers = {"authorization": "Bearer \u20ac" + TOKEN, "host": "127.0.0.1"}
    assert refuse_head({"path": "/call", "method": "POST"}, headers, ServerSettings(token=TOKEN)) == \
        (401, "missing or wrong bearer token")
    good = {"authorization": f"Bearer {TOKEN}"}
    assert refuse_head({"path": "/call", "method": "POST"}, good, ServerSettings(token=TOKEN)) is None


def test_a_non_http_scope_goes_to_the_app_untouched():
    client = Client([{"type": "lifespan.startup"}])
    seen = {}

    async def app(scope, receive, send):
        seen["scope"], seen["receive"] = scope, receive

    gate = RequestGate(app, ServerSettings(token=TOKEN))
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
    asyncio.run(gate(scope, client.receive, client.send))
    assert seen["scope"] is scope and seen["receive"] == client.receive
    assert client.sent == [] and client.reads == 0


# ---------------------------------------------------------------- without a token: Host, Origin, media
@pytest.mark.parametrize("host", ["example.org", "10.0.0.1", "0.0.0.0:7660", "evil.localhost", "127.0.0.1.nip.io"])
def test_without_a_token_a_foreign_host_is_403_before_the_body(host):
    client = Client([body(b"{}")])
    app = drive(ServerSettings(), client, headers=(("host", host), ("content-type", "application/json")))
    assert_refused_unread(client, app, 403)
    assert client.detail == (f"Host {host!r} is not a loopback name: a server without a token answers only "
                             "requests addressed to this machine (set --token-env to serve other names)")


@pytest.mark.parametrize("origin", ["http://example.org", "https://evil.com:443", "null", "ftp://127.0.0.1",
                                    "file://localhost", "http://10.1.1.1:7660", "127.0.0.1"])
def test_without_a_token_a_foreign_origin_is_403_before_the_body(origin):
    client = Client([body(b"{}")])
    app = drive(ServerSettings(), client, headers=JSON + (("origin", origin),))
    assert_refused_unread(client, app, 403)
    assert client.detail == (f"Origin {origin!r} is not this machine: a server without a token answers "
                             "no web page but its own")


@pytest.mark.parametrize("origin", ["http://127.0.0.1:7660", "https://localhost", "http://[::1]:80",
                                    "http://127.9.9.9"])
@pytest.mark.parametrize("host", ["127.0.0.1:7660", "localhost", "[::1]:7660", "::1", None])
def test_without_a_token_loopback_names_are_served(host, origin):
    headers = (("content-type", "application/json"), ("origin", origin))
    if host is not None:
        headers += (("host", host),)
    client = Client([body(b"[1]")])
    drive(ServerSettings(), client, headers=headers)
    assert client.status == 200 and client.body == b"[1]"


def test_a_long_foreign_host_or_origin_is_quoted_only_in_part():
    long = "h" * 200
    refusal = refuse_head({"path": "/call", "method": "POST"}, {"host": long}, ServerSettings())
    assert refusal[0] == 403 and repr("h" * 80) in refusal[1] and "h" * 81 not in refusal[1]
    refusal = refuse_head({"path": "/call", "method": "POST"}, {"origin": "http://" + long}, ServerSettings())
    assert refusal[0] == 403 and repr(("http://" + long)[:80]) in refusal[1] and "h" * 74 not in refusal[1]


@pytest.mark.parametrize("media", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                   "application/jsonx", "json"])
def test_without_a_token_a_body_not_said_to_be_json_is_415_before_its_first_byte(media):
    headers = (("host", "127.0.0.1"),) + ((("content-type", media),) if media is not None else ())
    client = Client([body(b"{}")])
    app = drive(ServerSettings(), client, headers=headers)
    assert_refused_unread(client, app, 415)
    assert client.detail == f"expected content-type application/json, got {media or 'none'!r}"


@pytest.mark.parametrize("media", ["application/json", "Application/JSON", "application/json; charset=utf-8",
                                   " application/json ;x=y"])
def test_json_said_any_usual_way_is_served(media):
    client = Client([body(b"{}")])
    drive(ServerSettings(), client, headers=(("host", "127.0.0.1"), ("content-type", media)))
    assert client.status == 200 and client.body == b"{}"


def test_refuse_media_names_at_most_60_characters_and_skips_bodiless_methods_and_tokens():
    long = {"content-type": "x" * 100}
    status, detail = refuse_media({"method": "POST"}, long, ServerSettings())
    assert status == 415 and repr("x" * 60) in detail and "x" * 61 not in detail
    for method in ("GET", "HEAD", "OPTIONS"):
        assert refuse_media({"method": method}, long, ServerSettings()) is None
    for method in ("PUT", "PATCH", "DELETE"):
        assert refuse_media({"method": method}, long, ServerSettings())[0] == 415
    assert refuse_media({"method": "POST"}, long, ServerSettings(token=TOKEN)) is None
    assert refuse_media({"method": "POST"}, {}, ServerSettings())[1].endswith("got 'none'")


def test_the_declared_size_is_checked_before_the_media_type():
    client = Client([body(b"{}")])
    app = drive(ServerSettings(max_body_bytes=2048), client,
                headers=(("host", "127.0.0.1"), ("content-type", "text/plain"), ("content-length", "2049")))
    assert_refused_unread(client, app, 413)


# ---------------------------------------------------------------- the body's size
LIMIT = 2048


@pytest.mark.parametrize("length", ["+5", "-1", " 5", "5 ", "0x10", "1e3", ""])
def test_a_malformed_content_length_is_400_unread(length):
    client = Client([body(b"12345")])
    app = drive(ServerSettings(max_body_bytes=LIMIT), client, headers=JSON + (("content-length", length),))
    assert_refused_unread(client, app, 400)
    assert client.detail == f"malformed content-length {length!r}"


def test_a_declared_length_over_the_limit_is_413_unread_and_the_limit_itself_passes():
    client = Client([body(b"x" * LIMIT)])
    app = drive(ServerSettings(max_body_bytes=LIMIT), client, headers=JSON + (("content-length", str(LIMIT + 1)),))
    assert_refused_unread(client, app, 413)
    assert client.detail == f"request body of {LIMIT + 1} bytes is over the limit of {LIMIT}"
    client = Client([body(b"x" * LIMIT)])
    drive(ServerSettings(max_body_bytes=LIMIT), client, headers=JSON + (("content-length", str(LIMIT)),))
    assert client.status == 200 and client.body == b"x" * LIMIT


def test_a_streamed_body_one_byte_over_the_limit_is_413_however_it_is_split():
    for parts in ([LIMIT + 1], [LIMIT, 1], [1, LIMIT], [700, 700, 649]):
        steps = [body(b"x" * n, more=i < len(parts) - 1) for i, n in enumerate(parts)]
        client = Client(steps)
        app = drive(ServerSettings(max_body_bytes=LIMIT), client, headers=JSON)
        assert client.status == 413, parts
        assert client.detail == f"request body is over the limit of {LIMIT} bytes"
        assert client.headers[b"connection"] == b"close" and app.calls == []
        assert client.reads == len(parts)  # refused at the part that went over, not later


def test_a_streamed_body_of_exactly_the_limit_reaches_the_app_whole_and_once():
    for parts in ([LIMIT], [LIMIT - 1, 1], [1000, 0, 1000, 48], [0]):
        steps = [body(bytes([65 + i]) * n, more=i < len(parts) - 1) for i, n in enumerate(parts)]
        whole = b"".join(s["body"] for s in steps)
        client = Client(steps)
        app = drive(ServerSettings(max_body_bytes=LIMIT), client, headers=JSON)
        assert client.status == 200 and client.body == whole, parts
        assert app.received == [{"type": "http.request", "body": whole, "more_body": False}]


def test_a_part_without_a_body_key_counts_as_empty():
    client = Client([{"type": "http.request", "more_body": True}, body(b"ab")])
    drive(ServerSettings(), client, headers=JSON)
    assert client.status == 200 and client.body == b"ab"


def test_a_client_that_goes_mid_body_gets_no_answer_and_the_app_never_runs():
    client = Client([body(b"ab", more=True), {"type": "http.disconnect"}])
    app = drive(ServerSettings(), client, headers=JSON)
    assert client.sent == [] and app.calls == []


# ---------------------------------------------------------------- the body's deadlines
def test_a_body_part_later_than_the_read_timeout_is_408_stalled():
    client = Client([body(b"a", more=True), 1.0, body(b"b")])
    start = time.monotonic()
    app = drive(ServerSettings(read_timeout_s=0.1, body_timeout_s=30), client, headers=JSON)
    took = time.monotonic() - start
    assert client.status == 408 and app.calls == []
    assert client.detail == "the request body stalled for over 0.1 s"
    assert client.headers[b"connection"] == b"close"
    assert 0.08 < took < 0.8, took


def test_a_dripping_body_is_408_at_its_whole_body_deadline():
    drip = []
    for _ in range(200):
        drip += [0.02, body(b"x", more=True)]
    client = Client(drip)
    start = time.monotonic()
    app = drive(ServerSettings(read_timeout_s=0.5, body_timeout_s=0.3), client, headers=JSON)
    took = time.monotonic() - start
    assert client.status == 408 and app.calls == []
    assert client.detail == "the request body was not in within 0.3 s"
    assert 0.25 < took < 1.2, took


def test_parts_in_time_are_not_cut_short():
    client = Client([body(b"a", more=True), 0.05, body(b"b", more=True), 0.05, body(b"c")])
    drive(ServerSettings(read_timeout_s=0.3, body_timeout_s=0.6), client, headers=JSON)
    assert client.status == 200 and client.body == b"abc"


def test_a_body_whose_deadline_has_passed_is_408_even_with_parts_ready():
    async def late():  # the whole-body deadline passes while the gate is held up elsewhere
        client = Client([body(b"a", more=True), body(b"b")])
        slow = client.receive

        async def receive():
            message = await slow()
            time.sleep(0.15)  # the loop itself stalls past the deadline: no await left to time out
            return message

        app = App()
        await RequestGate(app, ServerSettings(body_timeout_s=0.1))(scope_of(headers=JSON), receive, client.send)
        return client, app

    client, app = asyncio.run(late())
    assert client.status == 408 and client.detail == "the request body was not in within 0.1 s" and app.calls == []


# ---------------------------------------------------------------- after the body: the app and the client
def test_after_the_body_the_app_hears_only_the_client_going():
    async def then(receive, send):
        with pytest.raises(asyncio.TimeoutError):  # no second body, no disconnect yet
            await asyncio.wait_for(receive(), 0.1)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    client = Client([body(b"{}")])
    app = drive(ServerSettings(), client, App(then=then), headers=JSON)
    assert app.done and client.body == b"ok"


def test_a_client_that_goes_cancels_its_waiting_request_and_the_task_is_left_uncancelled():
    async def then(receive, send):
        await asyncio.sleep(3600)  # waiting for an upload, a slot, a shared computation

    async def main():
        client = Client([body(b"{}"), 0.05, {"type": "http.disconnect"}])
        app = App(then=then)
        start, before = time.monotonic(), asyncio.all_tasks()
        await RequestGate(app, ServerSettings())(scope_of(headers=JSON), client.receive, client.send)
        took = time.monotonic() - start
        me = asyncio.current_task()
        if hasattr(me, "cancelling"):  # Python 3.11: the gate's own cancel is undone
            assert me.cancelling() == 0
        await _within(asyncio.sleep(0.01), 1.0)  # later timeouts still work
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() - before if not t.done()]
        return app, client, took, left

    app, client, took, left = asyncio.run(asyncio.wait_for(main(), 3))
    assert app.cancelled and not app.done
    assert client.sent == []
    assert took < 1.0
    assert left == []  # the watcher is gone with its request


def test_a_client_that_goes_after_its_whole_answer_does_not_cancel_the_rest():
    async def then(receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})
        await asyncio.sleep(0.2)  # after the answer (a background task, say): the disconnect has come

    client = Client([body(b"{}"), {"type": "http.disconnect"}])
    app = drive(ServerSettings(), client, App(then=then), headers=JSON)
    assert app.done and not app.cancelled and client.body == b"done"


def test_a_client_that_goes_mid_answer_cancels_the_rest():
    async def then(receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        await asyncio.sleep(3600)

    client = Client([body(b"{}"), 0.05, {"type": "http.disconnect"}])
    app = drive(ServerSettings(), client, App(then=then), headers=JSON)
    assert app.cancelled and not app.done


def test_a_cancel_from_outside_is_not_swallowed():
    async def then(receive, send):
        await asyncio.sleep(3600)

    async def main():
        client = Client([body(b"{}")])  # stays connected
        app = App(then=then)
        task = asyncio.ensure_future(RequestGate(app, ServerSettings())(scope_of(headers=JSON), client.receive,
                                                                          client.send))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return app

    app = asyncio.run(asyncio.wait_for(main(), 3))
    assert app.cancelled


def test_an_error_in_the_app_propagates():
    async def then(receive, send):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        drive(ServerSettings(), Client([body(b"{}")]), App(then=then), headers=JSON)


# ---------------------------------------------------------------- the refusal's own framing
@pytest.mark.parametrize("close", [True, False])
def test_a_plain_answer_is_json_detail_with_its_length(close):
    client = Client()
    asyncio.run(_plain(client.send, 418, "caf\u00e9 \"x\"", close=close))
    assert [m["type"] for m in client.sent] == ["http.response.start", "http.response.body"]
    assert client.status == 418
    raw = json.dumps({"detail": "caf\u00e9 \"x\""}).encode()
    assert client.body == raw
    expected = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if close:
        expected.append((b"connection", b"close"))
    assert client.sent[0]["headers"] == expected
    assert not client.sent[1].get("more_body")


def test_a_plain_answer_keeps_the_connection_unless_told():
    client = Client()
    asyncio.run(_plain(client.send, 400, "x"))
    assert b"connection" not in client.headers


# ---------------------------------------------------------------- _within
def test_within_returns_the_value_or_times_out_on_time(monkeypatch):
    async def value(delay, v):
        await asyncio.sleep(delay)
        return v

    async def main():
        assert await _within(value(0, 7), None) == 7
        assert await _within(value(0.01, 8), 1.0) == 8
        start = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await _within(value(5, 9), 0.05)
        return time.monotonic() - start

    assert asyncio.run(main()) < 1.0
    monkeypatch.delattr(asyncio, "timeout", raising=False)  # Python 3.10: asyncio.wait_for
    assert asyncio.run(main()) < 1.0


# ---------------------------------------------------------------- names and settings
@pytest.mark.parametrize("value,name", [("127.0.0.1:7660", "127.0.0.1"), ("[::1]:80", "::1"), ("[::1]", "::1"),
                                        ("localhost", "localhost"), ("::1", "::1"), ("host:1:2", "host:1:2"),
                                        ("a:", "a"), (":80", ""), ("[fe80::1", "fe80::1")])
def test_host_names(value, name):
    assert _host_name(value) == name


@pytest.mark.parametrize("host,loop", [("localhost", True), ("127.0.0.1", True), ("127.255.0.9", True), ("::1", True),
                                       ("0.0.0.0", False), ("10.0.0.1", False), ("example.org", False), ("", False),
                                       ("LOCALHOST", False), ("localhost.", False), ("::", False)])
def test_loopback_names(host, loop):
    assert is_loopback(host) is loop


def test_settings_need_a_token_off_loopback_and_limits_above_zero():
    check_settings(ServerSettings())
    check_settings(ServerSettings(host="0.0.0.0", token="t"))
    check_settings(ServerSettings(max_concurrency=1, max_body_bytes=1024, max_request_pixels=None,
                                  max_result_pixels=None, read_timeout_s=0.001, body_timeout_s=0.001))
    with pytest.raises(ConfigError, match="refusing to serve on '0.0.0.0' without a token"):
        check_settings(ServerSettings(host="0.0.0.0"))
    with pytest.raises(ConfigError, match="max_concurrency >= 1 and max_body_bytes >= 1024"):
        check_settings(ServerSettings(max_concurrency=0))
    with pytest.raises(ConfigError, match="max_concurrency >= 1 and max_body_bytes >= 1024"):
        check_settings(ServerSettings(max_body_bytes=1023))
    for name in ("max_batch_calls", "max_request_pixels", "max_result_pixels", "max_action_chars", "max_connections",
                 "read_timeout_s", "body_timeout_s"):
        for bad in (0, -1):
            with pytest.raises(ConfigError, match="expected every limit to be > 0") as e:
                check_settings(ServerSettings(**{name: bad}))
            assert f"'{name}': {bad}" in str(e.value)
        check_settings(ServerSettings(**{name: 1}))


def test_the_app_is_gated_end_to_end():
    """The real app carries the gate: a tokenless /call's body is never read (ASGI in process)."""
    from fastapi import FastAPI

    from tool_backends.server import create_app

    app = create_app({}, ServerSettings(token=TOKEN))
    assert isinstance(app, FastAPI)
    client = Client([body(b'{"tool": "x"}')])
    asyncio.run(asyncio.wait_for(app(scope_of(headers=JSON), client.receive, client.send), 5))
    assert client.status == 401 and client.reads == 0
    with pytest.raises(ConfigError):
        create_app({}, ServerSettings(max_body_bytes=10))
    assert srv.RequestGate is RequestGate
