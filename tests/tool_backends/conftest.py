"""Fixtures for the tool tests: an annotated synthetic scene on disk and real tool servers.

The scene is a 160x120 "scan": mid-grey body, a bright disc (the annotated ``nodule``), a dark
square (the annotated ``cyst``) and image-level label ``ct``. Masks are PNG files beside it.
Servers are real ``medvqa-tools serve`` subprocesses on free loopback ports.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from medvqa_env.records import Annotations, AnswerType, Box, Mask, VQARecord

REPO = Path(__file__).resolve().parents[2]
DISC = (50, 60, 14)  # cx, cy, r
SQUARE = (100, 40, 130, 70)  # x0, y0, x1, y1


@dataclass
class Scene:
    root: Path
    image: Image.Image
    record: VQARecord
    disc_mask: np.ndarray
    square_mask: np.ndarray

    @property
    def disc_box(self) -> list[int]:
        cx, cy, r = DISC
        return [cx - r, cy - r, cx + r + 1, cy + r + 1]


def make_scene(root: Path) -> Scene:
    h, w = 120, 160
    yy, xx = np.mgrid[:h, :w]
    arr = np.full((h, w), 20, np.uint8)
    arr[10:110, 15:150] = 110
    cx, cy, r = DISC
    disc = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    arr[disc] = 230
    square = np.zeros((h, w), bool)
    x0, y0, x1, y1 = SQUARE
    square[y0:y1, x0:x1] = True
    arr[square] = 45
    rng = np.random.default_rng(0)
    arr = np.clip(arr.astype(int) + rng.integers(-4, 5, arr.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(arr).convert("RGB")
    root.mkdir(parents=True, exist_ok=True)
    image.save(root / "scan.png")
    Image.fromarray(disc.astype(np.uint8) * 255).save(root / "nodule_mask.png")
    Image.fromarray(square.astype(np.uint8) * 255).save(root / "cyst_mask.png")
    ann = Annotations(
        boxes=(Box("nodule", (cx - r, cy - r, cx + r + 1, cy + r + 1)),),
        masks=(Mask("nodule", str(root / "nodule_mask.png")), Mask("cyst", str(root / "cyst_mask.png"))),
        labels=("ct",),
    )
    record = VQARecord(id="scene-1", image_paths=(str(root / "scan.png"),), question="Is there a nodule?",
                       answer="yes", answer_type=AnswerType.CLOSED, dataset="scene", annotations=ann)
    return Scene(root, Image.open(root / "scan.png").convert("RGB"), record, disc, square)


@pytest.fixture(scope="session")
def scene(tmp_path_factory) -> Scene:
    return make_scene(tmp_path_factory.mktemp("scene"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A ``medvqa-tools`` subprocess (serve or router) on a free loopback port."""

    def __init__(self, args: list[str], env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "tool_backends.cli", *args, "--port", str(self.port)],
                                     cwd=REPO, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait(self, timeout_s: float = 60.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=0.5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server at {self.url} did not start in {timeout_s} s")

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture(scope="module")
def start_server():
    """Factory: ``start_server(args, env)`` -> started ServerProcess; all stopped after the module.
    Start several before waiting on any (``wait=False``) to overlap their imports."""
    started: list[ServerProcess] = []

    def start(args: list[str], env: dict | None = None, wait: bool = True) -> ServerProcess:
        server = ServerProcess(args, env)
        started.append(server)
        return server.wait() if wait else server

    yield start
    for server in started:
        server.stop()
