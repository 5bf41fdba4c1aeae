"""Helpers shared by the hardening tests (a uniquely named module: every test folder has a
``conftest.py``, so ``from conftest import ...`` would be ambiguous in a whole-suite run).

The server-process helper lives in ``benchmarks/bench_load.py`` (the load benchmark and the soak
use it too); it is loaded from its file because ``benchmarks`` is not a package.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load_bench():
    name = "bench_load"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "bench_load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bench_load = _load_bench()
ServerProcess = bench_load.ServerProcess


class InThreadServer:
    """A uvicorn server for an app built in this process (for settings the CLI does not expose)."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = bench_load.free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("in-thread uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
