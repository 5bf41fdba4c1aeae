"""Fuzz for what stays hand-written on the request path (issue 40): ``RequestGate``'s body reader.
Every endpoint, ``/call`` included, is routed by FastAPI past the gate, so the app must see exactly
the bytes the client sent, however the server split them, or the request gets a 4xx with a
sentence; never a 5xx, never a body the app half-reads. (The head checks and the request JSON
bounds are fuzzed in ``test_request_path.py``.)"""

from __future__ import annotations

import asyncio
import json

from hypothesis import example, given, settings as hsettings, strategies as st

from tool_backends.server import RequestGate, ServerSettings

LIMIT = 4096


async def echo(scope, receive, send):
    """The app behind the gate: answers with the body it was given."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def run_gate(chunks: list[bytes], length: str | None, path: str = "/call") -> tuple[int, bytes]:
    gate = RequestGate(echo, ServerSettings(max_body_bytes=LIMIT))
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", length.encode()))
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers, "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2), "scheme": "http", "query_string": b"", "root_path": ""}
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # the client stays connected: the gate must not wait on it

    async def send(message):
        sent.append(message)

    asyncio.run(asyncio.wait_for(gate(scope, receive, send), 10))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@hsettings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=2000), min_size=1, max_size=6),
       length=st.one_of(st.none(), st.just("exact"), st.integers(0, 3 * LIMIT).map(str),
                        st.text("0123456789+- x", min_size=1, max_size=8)),
       path=st.sampled_from(["/call", "/call_batch", "/get_observation", "/nope"]))
@example(chunks=[b"x" * (LIMIT - 1), b"y"], length=None, path="/call")  # the limits' edges, streamed
@example(chunks=[b"x" * LIMIT, b"y"], length=None, path="/call")
@example(chunks=[b"x" * LIMIT, b"y"], length="exact", path="/call")
@example(chunks=[b"x" * LIMIT], length="exact", path="/call")
def test_the_app_gets_exactly_the_body_or_the_client_a_4xx(chunks, length, path):
    whole = b"".join(chunks)
    declared = str(len(whole)) if length == "exact" else length
    status, body = run_gate(chunks, declared, path)
    if status == 200:
        assert body == whole and len(whole) <= LIMIT
    else:
        assert status in (400, 413), status
        assert json.loads(body)["detail"]
    if len(whole) > LIMIT or (declared is not None and declared.isdigit() and int(declared) > LIMIT):
        assert status == 413
    if declared is not None and not declared.isdigit():
        assert status == 400
