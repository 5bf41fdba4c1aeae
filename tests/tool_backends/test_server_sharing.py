"""Only identical calls share an answer (issue 40, attack 1): an image entry is decoded as exactly
what it names and shared under that name, so one client cannot make another receive the result
of a different image -- directly, through the router, or with the victim's own answer cached.

A real server (and router) on loopback; the tool is a slow echo of the digest of the image it
was given, so a second request reliably arrives while the first is being computed."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import pytest
from PIL import Image

from medvqa_env.images import image_digest
from tool_backends.base import ToolResult, ToolSpec
from tool_backends.router import create_router_app
from tool_backends.server import ServerSettings, connection_limits, create_app
from tool_backends.wire import encode_image


class SlowEcho:
    """A tool backend answering with the digest of the image its call targets, after ``delay_s``."""

    spec = ToolSpec("echo", "the digest of the image", {"type": "object", "properties": {}})

    def __init__(self, delay_s: float = 0.6) -> None:
        self.delay_s = delay_s

    def specs(self):
        return [self.spec]

    def call(self, name, images, arguments, context):
        time.sleep(self.delay_s)
        return ToolResult(text=image_digest(images[0]))

    def close(self):
        pass


class Served:
    def __init__(self, app) -> None:
        import socket

        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False, **connection_limits(app)))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def servers():
    started = []

    def start(app):
        started.append(Served(app))
        return started[-1]

    yield start
    for s in reversed(started):
        s.close()


VICTIM = Image.new("RGB", (32, 24), (200, 10, 10))
ATTACKER = Image.new("RGB", (32, 24), (10, 200, 10))


def post(url: str, entry) -> httpx.Response:
    return httpx.post(url + "/call", json={"tool": "echo", "arguments": {}, "images": [entry]}, timeout=30)


def race(url: str, attack_entry, victim_entry, head_start_s: float = 0.2) -> tuple[httpx.Response, httpx.Response]:
    """The attacker's request, then (while it computes) the victim's."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        attack = pool.submit(post, url, attack_entry)
        time.sleep(head_start_s)
        victim = pool.submit(post, url, victim_entry)
        return attack.result(), victim.result()


@pytest.fixture
def upstream(servers):
    served = servers(create_app({"echo": SlowEcho()}, ServerSettings(cache_size=64)))
    for image in (VICTIM, ATTACKER):  # both images stored (and the victim's answer cached)
        assert post(served.url, encode_image(image, "png")).json()["result"]["text"] == image_digest(image)
    return served


@pytest.mark.parametrize("through", ["direct", "router"])
def test_a_ref_claiming_another_images_digest_is_refused_and_the_victim_gets_its_own_result(upstream, servers, through):
    url = upstream.url if through == "direct" else servers(create_router_app({"echo": upstream.url})).url
    victim_digest, attacker_digest = image_digest(VICTIM), image_digest(ATTACKER)
    mixed = {"ref": attacker_digest, "digest": victim_digest, **{"png": encode_image(VICTIM, "png")["png"]}}
    for victim_entry in ({"ref": victim_digest}, encode_image(VICTIM, "png")):
        attack, victim = race(url, mixed, victim_entry)
        assert attack.status_code == 400 and "exactly one of 'png', 'raw', 'path' or 'ref'" in attack.json()["detail"]
        assert victim.status_code == 200 and victim.json()["result"]["text"] == victim_digest


@pytest.mark.parametrize("through", ["direct", "router"])
def test_two_uploads_claiming_one_digest_each_get_their_own_image_or_a_refusal(upstream, servers, through):
    """The attacker uploads its own pixels under the victim's digest while the victim's call runs:
    the attacker gets the victim's image's answer or a 400, never the victim the attacker's."""
    url = upstream.url if through == "direct" else servers(create_router_app({"echo": upstream.url})).url
    for n, victim_first in enumerate((True, False)):
        fresh = Image.new("RGB", (32, 24), (1, 2, 3 + n))  # not stored yet: its upload is decoded
        own = encode_image(fresh, "png")
        forged = {**encode_image(ATTACKER, "png"), "digest": own["digest"]}
        if victim_first:
            victim, attack = race(url, own, forged)
            assert attack.status_code == 400 or attack.json()["result"]["text"] == own["digest"]
        else:
            attack, victim = race(url, forged, own)
            assert attack.status_code == 400 and "does not match" in attack.json()["detail"]
        assert victim.status_code == 200 and victim.json()["result"]["text"] == own["digest"]


@pytest.mark.parametrize("entry", [
    {"ref": "ab", "png": "aGk="},
    {"ref": "ab", "digest": "cd"},
    {"png": "aGk=", "raw": "aGk=", "size": [1, 1]},
    {"path": "/x.png", "png": "aGk="},
    {"ref": 5},
    {"png": "aGk=", "digest": 7},
    {"png": "aGk=", "extra": 1},
])
def test_a_mixed_or_malformed_entry_is_a_400_with_a_sentence(upstream, entry):
    response = post(upstream.url, entry)
    assert response.status_code == 400 and "exactly one of 'png', 'raw', 'path' or 'ref'" in response.json()["detail"]
