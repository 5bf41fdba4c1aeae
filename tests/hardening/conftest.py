"""Fixtures for the hardening tests: real tool-server subprocesses on free loopback ports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # conftest may load before pytest adds this folder
from hardening_helpers import InThreadServer, ServerProcess  # noqa: E402


@pytest.fixture
def server_factory(tmp_path):
    """``make(command="serve", args=[...], env=None)`` -> a started :class:`ServerProcess`; all are
    stopped at teardown (SIGCONT first, so a stalled one can exit)."""
    started = []

    def make(command="serve", args=("--tools", "segment,image_zoom_in"), env=None, start=True):
        proc = ServerProcess(command, list(args), env=env, log_path=tmp_path / f"server{len(started)}.log")
        started.append(proc)
        return proc.start() if start else proc

    yield make
    for proc in started:
        proc.close()


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    """One shared server with ``segment`` and ``image_zoom_in`` and an image root, for read-only tests."""
    root = tmp_path_factory.mktemp("image-root")
    proc = ServerProcess("serve", ["--tools", "segment,image_zoom_in", "--image-root", str(root),
                                   "--max-body-mb", "4"],
                         log_path=tmp_path_factory.mktemp("logs") / "server.log")
    proc.start()
    proc.image_root = root
    yield proc
    proc.close()


@pytest.fixture
def in_thread_server():
    return InThreadServer
