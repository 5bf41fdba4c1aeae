"""Shared helpers for the framework integration tests (docs/integrations.md): a free loopback port,
a subprocess server waited on by its port, and an embedded-default episode's image and context."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra: str) -> dict:
    """This interpreter's environment, offline, with the repository importable."""
    return {**os.environ, **OFFLINE, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            **extra}


class Served:
    """A server subprocess (``python -m MODULE ...``) on a loopback port; :meth:`wait` until it accepts."""

    def __init__(self, args: list[str], port: int, env: dict | None = None, python: str | None = None) -> None:
        self.port = port
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a full pipe would block the server
        self.proc = subprocess.Popen([python or sys.executable, *args], cwd=REPO, env=env or subprocess_env(),
                                     stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def wait(self, timeout_s: float = 60.0) -> "Served":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log.read()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"server on port {self.port} did not start in {timeout_s} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
