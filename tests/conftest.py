"""Shared fixtures. ``vqa_rad_root`` points at the real VQA-RAD copy when it is there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:  # no Hypothesis example has a time bound: speed is measured in benchmarks, never asserted
    import tempfile

    from hypothesis import settings
    from hypothesis.configuration import set_hypothesis_home_dir

    settings.register_profile("medvqa", deadline=None)
    settings.load_profile("medvqa")
    # its example database and caches live outside the checkout: tests write only to temporary folders
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "medvqa-hypothesis"))
except ImportError:  # the dev extra is not installed: no property test runs either
    pass

REPO = Path(__file__).resolve().parents[1]
VQA_RAD = Path(os.environ.get("MEDVQA_VQA_RAD", REPO.parent / "shared" / "data" / "vqa_rad"))


@pytest.fixture(scope="session")
def vqa_rad_root() -> Path:
    if not (VQA_RAD / "source" / "testset.json").is_file():
        pytest.skip(f"VQA-RAD not found at {VQA_RAD} (set MEDVQA_VQA_RAD)")
    return VQA_RAD


@pytest.fixture(autouse=True, scope="session")
def _offline_and_cache(tmp_path_factory):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("MEDVQA_CACHE", str(tmp_path_factory.mktemp("medvqa-cache")))
    yield


@pytest.fixture()
def load_benchmark(monkeypatch):
    """``load_benchmark("protocol_rerun")``: a fresh copy of ``benchmarks/<name>.py`` as a module,
    with ``benchmarks/`` on the path for its own imports (``figures``), as when it runs as a script."""
    import importlib.util

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
