"""Single-flight: identical calls in flight at once compute once, on the server and through the router.

Counted by the server itself (``/health``'s ``computed``: tool runs; ``calls``: calls that reached
the tool service), in real server and router processes on loopback, with 8 concurrent clients (a
GRPO group), each its own :class:`HTTPToolBackend`. The served tool is a test tool that holds its
computation until the test releases it (a file appears), so every call of the group is in flight
before the first one finishes -- no timing involved.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from medvqa_env.errors import ToolBackendError
from tool_backends.base import ToolContext
from tool_backends.http_client import HTTPToolBackend
from tool_backends.single_flight import SingleFlight

REPO = Path(__file__).resolve().parents[2]
GROUP = 8
HELD_TOOL_SERVER = '''
import sys, time
from pathlib import Path
from medvqa_env.errors import ToolError
from tool_backends.base import Tool, ToolResult, ToolSpec
from tool_backends.server import ServerSettings, create_app, serve
from tool_backends.toolbox import LocalBackend

RELEASE = Path(sys.argv[2])


class HeldTool(Tool):
    """Answers once the file RELEASE/<label> exists (or refuses, when asked to fail)."""

    spec = ToolSpec("held", "waits for the test", {"type": "object", "properties": {
        "label": {"type": "string"}, "fail": {"type": "boolean", "default": False}}, "required": ["label"]})

    def run(self, images, arguments, context):
        deadline = time.monotonic() + 60
        while not (RELEASE / arguments["label"]).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        if arguments["fail"]:
            raise ToolError(f"held tool failed on purpose for {arguments['label']!r}")
        return ToolResult(text=f"held {arguments['label']} on a {images[0].size[0]}x{images[0].size[1]} image")


settings = ServerSettings(max_concurrency=2 * 8, upload_wait_s=30)  # the whole group in the service at once
serve(create_app({"held": LocalBackend([HeldTool()])}, settings), port=int(sys.argv[1]))
'''


class HeldToolServer:
    """A real tool server process (uvicorn on a free loopback port) serving the held test tool."""

    def __init__(self, script: Path, release_dir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, str(script), str(port), str(release_dir)], cwd=REPO,
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server at {self.url} did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("release")


@pytest.fixture(scope="module")
def held_server(tmp_path_factory, release_dir):
    script = tmp_path_factory.mktemp("server") / "held_server.py"
    script.write_text(HELD_TOOL_SERVER)
    server = HeldToolServer(script, release_dir)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def image_on_server(held_server, release_dir):
    """The server holds the group's image: the clients' refs resolve at once, and every call of a
    group reaches the tool service (how the first turn's upload is shared: the last tests)."""
    warm, threads = group_calls(held_server.url, "warm-server", n=1)
    release(release_dir, "warm-server", threads)
    assert warm[0].ok


@pytest.fixture(scope="module")
def router(start_server, held_server):
    # the whole group inside the router at once (its calls pass the concurrency gate before they join a flight)
    return start_server(["router", "--upstream", f"held={held_server.url}", "--wait-s", "30", "--max-concurrency", "16"])


def health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=5).json()


def wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)


IMAGE = Image.new("RGB", (40, 30), (120, 60, 30))


def group_calls(url: str, label: str, n: int = GROUP, timeouts: dict[int, float] | None = None,
                fail: bool = False, stagger: "callable | None" = None, image: Image.Image = IMAGE,
                record_id: str = "q-1") -> tuple[list, list[threading.Thread]]:
    """Start n clients (threads, one HTTPToolBackend each) making the identical call; returns the
    list their outcomes land in (a ToolResult or the exception) and the threads."""
    outcomes: list = [None] * n

    def client(i: int) -> None:
        backend = HTTPToolBackend(tools=["held"], url=url, timeout_s=(timeouts or {}).get(i, 60.0), retries=0)
        try:
            outcomes[i] = backend.call("held", [image.copy()], {"label": label, "fail": fail},
                                       ToolContext(record_id=record_id, question="same question"))
        except ToolBackendError as e:
            outcomes[i] = e
        finally:
            backend.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for i, t in enumerate(threads):
        t.start()
        if stagger is not None:
            stagger(i)
    return outcomes, threads


def release(release_dir, label: str, threads: list[threading.Thread]) -> None:
    (release_dir / label).touch()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a client never got an answer"


@pytest.mark.timeout(120)
def test_a_group_of_identical_calls_computes_once_on_the_server(held_server, release_dir, image_on_server):
    before = health(held_server.url)
    outcomes, threads = group_calls(held_server.url, "group")
    wait_until(lambda: health(held_server.url)["calls_received"] - before["calls_received"] == GROUP,
               "all 8 calls are in the server's tool service")
    release(release_dir, "group", threads)
    after = health(held_server.url)
    assert [r.text for r in outcomes] == ["held group on a 40x30 image"] * GROUP
    assert after["computed"] - before["computed"] == 1  # the server's own count of tool runs
    assert after["joined_in_flight"] - before["joined_in_flight"] == GROUP - 1
    # they joined on the event loop, before the slots: one request took a slot and a thread
    assert after["calls"] - before["calls"] == 1


@pytest.mark.timeout(120)
def test_a_result_served_again_reuses_its_response_bytes(held_server, release_dir, image_on_server):
    """The group's later calls (cache hits: the same result object) are not serialised again, and
    every client still reads the same result."""
    outcomes, threads = group_calls(held_server.url, "again", n=1)
    release(release_dir, "again", threads)
    before = health(held_server.url)
    outcomes = []
    for _ in range(3):  # one after another: each its own request (at once, they would join one)
        outcome, threads = group_calls(held_server.url, "again", n=1)
        release(release_dir, "again", threads)
        outcomes += outcome
    after = health(held_server.url)
    assert [r.text for r in outcomes] == ["held again on a 40x30 image"] * 3
    assert after["computed"] == before["computed"] and after["responses_reused"] - before["responses_reused"] == 3


@pytest.mark.timeout(120)
def test_a_cached_answer_needs_no_slot_while_every_slot_is_busy(held_server, release_dir, image_on_server):
    """A call whose result (and response) the server holds is answered on its event loop: with all
    16 slots held by other calls it still answers at once, instead of queueing behind them."""
    before = health(held_server.url)
    busy = [group_calls(held_server.url, f"busy-{i}", n=1) for i in range(16)]
    wait_until(lambda: health(held_server.url)["calls"] - before["calls"] == 16, "16 calls hold the 16 slots")
    cached = HTTPToolBackend(tools=["held"], url=held_server.url, timeout_s=10, retries=0)
    try:
        result = cached.call("held", [IMAGE.copy()], {"label": "warm-server", "fail": False},
                             ToolContext(record_id="q-1", question="same question"))
    finally:
        cached.close()
        for i, (_, threads) in enumerate(busy):
            release(release_dir, f"busy-{i}", threads)
    after = health(held_server.url)
    assert result.text == "held warm-server on a 40x30 image"
    assert after["computed"] - before["computed"] == 16  # the busy calls; the cached one ran nothing
    assert after["cache_hits"] - before["cache_hits"] == 1 and after["calls"] - before["calls"] == 17


@pytest.mark.timeout(120)
def test_a_failing_computation_fails_every_waiter_with_the_same_error(held_server, release_dir, image_on_server):
    before = health(held_server.url)
    outcomes, threads = group_calls(held_server.url, "broken", fail=True)
    wait_until(lambda: health(held_server.url)["calls_received"] - before["calls_received"] == GROUP, "all 8 calls are in flight")
    release(release_dir, "broken", threads)
    assert {r.error for r in outcomes} == {"held tool failed on purpose for 'broken'"}
    assert health(held_server.url)["computed"] - before["computed"] == 1
    # a failure is not cached: the next identical call computes again (and fails again, alone)
    again, threads = group_calls(held_server.url, "broken", n=1, fail=True)
    for t in threads:
        t.join(60)
    assert again[0].error == "held tool failed on purpose for 'broken'"
    assert health(held_server.url)["computed"] - before["computed"] == 2


@pytest.mark.timeout(120)
def test_clients_that_give_up_do_not_cancel_the_others(held_server, release_dir, image_on_server):
    """Client 0 starts the computation and client 1 joins it; both hang up (their deadline passes)
    before it ends. The other six still get its result, and it ran once."""
    before = health(held_server.url)

    def one_at_a_time(i: int) -> None:  # client 0 is in before anyone else: it computes
        if i < 2:
            wait_until(lambda: health(held_server.url)["calls_received"] - before["calls_received"] == i + 1, f"client {i} is in")

    outcomes, threads = group_calls(held_server.url, "quitters", timeouts={0: 1.5, 1: 1.5}, stagger=one_at_a_time)
    wait_until(lambda: health(held_server.url)["calls_received"] - before["calls_received"] == GROUP, "all 8 calls are in flight")
    threads[0].join(60)
    threads[1].join(60)
    assert all(isinstance(outcomes[i], ToolBackendError) and "timed out" in str(outcomes[i]) for i in (0, 1))
    release(release_dir, "quitters", threads)
    assert [r.text for r in outcomes[2:]] == ["held quitters on a 40x30 image"] * (GROUP - 2)
    assert health(held_server.url)["computed"] - before["computed"] == 1


@pytest.mark.timeout(120)
def test_a_group_through_the_router_reaches_the_server_once(held_server, router, release_dir):
    warm, threads = group_calls(router.url, "warm", n=1)  # the server holds the image: the group's refs resolve
    release(release_dir, "warm", threads)
    assert warm[0].ok
    server_before, router_before = health(held_server.url), health(router.url)
    outcomes, threads = group_calls(router.url, "routed")
    wait_until(lambda: health(router.url)["joined_in_flight"] - router_before["joined_in_flight"] == GROUP - 1,
               "7 of the group's calls wait on the first one's forward")
    release(release_dir, "routed", threads)
    server_after, router_after = health(held_server.url), health(router.url)
    assert [r.text for r in outcomes] == ["held routed on a 40x30 image"] * GROUP
    assert server_after["calls"] - server_before["calls"] == 1  # one request reached the tool server
    assert server_after["computed"] - server_before["computed"] == 1
    assert router_after["forwarded"] - router_before["forwarded"] == 1


@pytest.mark.timeout(120)
def test_a_group_uploads_its_new_image_once(held_server, release_dir):
    """First turn: the server has never seen the image. One client's ref misses (409) and it
    uploads; the others wait for that upload instead of uploading too (or, arriving after it,
    find the image stored), then share the result. Counted by the server: image bytes received."""
    fresh = Image.new("RGB", (40, 30), (7, 77, 177))
    before = health(held_server.url)
    outcomes, threads = group_calls(held_server.url, "first turn", image=fresh, record_id="q-2")
    # within half the server's upload wait: the upload wakes the waiters, not the end of its call
    wait_until(lambda: health(held_server.url)["calls_received"] - before["calls_received"] == GROUP,
               "all 8 calls are in the server's tool service", timeout_s=15)
    release(release_dir, "first turn", threads)
    after = health(held_server.url)
    assert [r.text for r in outcomes] == ["held first turn on a 40x30 image"] * GROUP
    assert after["uploads"] - before["uploads"] == 1  # one client sent the image's bytes
    assert after["computed"] - before["computed"] == 1 and after["calls_received"] - before["calls_received"] == GROUP
    # the 7 others joined the upload's own request on the event loop: one request took a slot and a thread
    assert after["calls"] - before["calls"] == 1


@pytest.mark.timeout(120)
def test_a_group_uploads_its_new_image_once_through_a_router_with_few_slots(held_server, start_server, release_dir):
    """First turn through a router with its default 4 slots: the group's ref requests wait at the
    router for the one upload (outside its slots: waiting inside, they held every slot while the
    upload queued behind them until the wait timed out), then join its computation: at the router
    (an identical request in flight, joined without a slot) or at the server."""
    narrow = start_server(["router", "--upstream", f"held={held_server.url}", "--wait-s", "30"])
    fresh = Image.new("RGB", (40, 30), (170, 17, 71))
    server_before, router_before = health(held_server.url), health(narrow.url)
    outcomes, threads = group_calls(narrow.url, "narrow", image=fresh, record_id="q-3")
    joined = lambda: (health(narrow.url)["joined_in_flight"] - router_before["joined_in_flight"]  # noqa: E731
                      + health(held_server.url)["joined_in_flight"] - server_before["joined_in_flight"])
    wait_until(lambda: joined() == GROUP - 1, "7 calls join the one upload's computation", timeout_s=15)
    release(release_dir, "narrow", threads)
    server_after = health(held_server.url)
    assert [r.text for r in outcomes] == ["held narrow on a 40x30 image"] * GROUP
    assert server_after["uploads"] - server_before["uploads"] == 1
    assert server_after["computed"] - server_before["computed"] == 1


# -- the mechanism itself, in one process -----------------------------------------------------
def test_waiters_share_the_result_and_the_flight_ends_with_it():
    flights, gate, runs = SingleFlight(), threading.Event(), []

    def compute():
        runs.append(1)
        gate.wait(30)
        return object()

    results = [None] * 6
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, flights.run("k", compute)))
               for i in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: flights.joined == 5, "five callers joined the first one")
    gate.set()
    for t in threads:
        t.join(30)
    assert len(runs) == 1 and len({id(r) for r in results}) == 1 and len(flights) == 0
    assert flights.run("k", lambda: "fresh") == "fresh"  # a later call computes again


def test_a_waiter_that_gives_up_leaves_the_others_their_result():
    flights, gate = SingleFlight(), threading.Event()
    leader = threading.Thread(target=lambda: flights.run("k", lambda: gate.wait(30) and "done"))
    leader.start()
    wait_until(lambda: len(flights) == 1, "the computation started")
    with pytest.raises(TimeoutError, match="goes on for the others"):
        flights.run("k", lambda: "never run", timeout=0.05)
    late: list = []
    waiter = threading.Thread(target=lambda: late.append(flights.run("k", lambda: "never run")))
    waiter.start()
    wait_until(lambda: flights.joined == 2, "another caller joined")
    gate.set()
    leader.join(30)
    waiter.join(30)
    assert late == ["done"] and flights.computed == 1


def test_every_caller_of_a_failing_flight_gets_its_error():
    flights, gate = SingleFlight(), threading.Event()
    errors: list = []

    def compute():
        gate.wait(30)
        raise ValueError("upstream said no")

    def caller():
        try:
            flights.run("k", compute)
        except ValueError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: flights.joined == 3, "three callers joined")
    gate.set()
    for t in threads:
        t.join(30)
    assert errors == ["upstream said no"] * 4 and flights.computed == 1


def test_an_upload_the_server_already_holds_is_not_decoded_again():
    """A group's clients each upload the shared image after their optimistic refs missed; once one
    upload is stored, the others' payloads are not decoded (nor their digests recomputed)."""
    from medvqa_env.images import image_digest
    from tool_backends.wire import ImageStore, decode_image_entry, encode_image

    store, image = ImageStore(), Image.new("RGB", (40, 30), (120, 60, 30))
    first = decode_image_entry(encode_image(image, "raw"), store=store)
    assert image_digest(first) == image_digest(image) and len(store) == 1
    again = decode_image_entry({"raw": "not even base64!", "size": [40, 30], "digest": image_digest(image)},
                               store=store)
    assert again is first
