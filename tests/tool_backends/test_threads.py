"""Threads set on purpose: the setting wins, else the env variable, else the process's CPU share
(affinity capped by the cgroup quota); torch really gets the count, and what was set is reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from medvqa_env.errors import ConfigError
from tool_backends import threads

REPO = Path(__file__).resolve().parents[2]


def _cgroup(tmp_path: Path, v2: str | None = None, v1: tuple[str, str] | None = None) -> Path:
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2)
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(v1[0])
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(v1[1])
    return tmp_path


@pytest.mark.parametrize("v2, v1, expected", [
    ("max 100000\n", None, None),
    ("150000 100000\n", None, 1.5),
    (None, ("-1", "100000"), None),
    (None, ("50000", "100000"), 0.5),
    (None, None, None),
    ("garbage\n", None, None),
])
def test_the_cgroup_quota_is_read_from_v2_or_v1(tmp_path, v2, v1, expected):
    assert threads.cgroup_cpus(_cgroup(tmp_path, v2, v1)) == expected


def test_the_cpu_share_is_affinity_capped_by_the_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 8)
    for name in "abc":
        (tmp_path / name).mkdir()
    assert threads.cpu_share(_cgroup(tmp_path / "a", "max 100000")) == 8
    assert threads.cpu_share(_cgroup(tmp_path / "b", "250000 100000")) == 2  # 2.5 CPUs -> 2 threads
    assert threads.cpu_share(_cgroup(tmp_path / "c", "20000 100000")) == 1  # never 0


def test_setting_then_env_then_cpu_share(tmp_path, monkeypatch):
    import torch

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(threads.ENV_VAR, "2")
        s = threads.apply_threads(1, root=tmp_path)
        assert (s.threads, s.source, s.torch_set) == (1, "setting", True) and torch.get_num_threads() == 1
        s = threads.apply_threads(None, root=tmp_path)
        assert (s.threads, s.source) == (2, "env") and torch.get_num_threads() == 2
        monkeypatch.delenv(threads.ENV_VAR)
        s = threads.apply_threads("auto", root=_cgroup(tmp_path, "100000 100000"))
        assert (s.threads, s.source, s.cgroup_cpus) == (1, "cpu share", 1.0) and torch.get_num_threads() == 1
        assert threads.current() == s.to_dict()
        assert s.line().startswith("threads: 1 (cpu share; affinity ") and "cgroup quota 1;" in s.line()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bad", [0, -2, "two", 1.5, True])
def test_a_bad_setting_says_what_came(bad):
    with pytest.raises(ConfigError, match="expected torch threads to be a positive integer or 'auto'"):
        threads.apply_threads(bad)


def test_a_process_pinned_to_one_cpu_gets_one_thread():
    """torch left alone takes every core it sees; apply_threads takes the affinity mask."""
    code = ("import os, json, torch; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "before = torch.get_num_threads(); from tool_backends.threads import apply_threads; "
            "s = apply_threads(); print(json.dumps([before, s.threads, torch.get_num_threads(), s.line()]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    before, chosen, now, line = json.loads(out.stdout.strip().splitlines()[-1])
    assert chosen == now == 1 and line.startswith("threads: 1 (cpu share; affinity 1 CPUs")


def _fresh_process(code: str, **env: str) -> list:
    """Run ``code`` in a fresh interpreter without torch imported, with only ``env`` set."""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_APPLY = ("import os, json, sys; from tool_backends.threads import apply_threads; s = apply_threads({arg}); "
          "print(json.dumps([s.threads, s.source, os.environ.get('OMP_NUM_THREADS'), "
          "os.environ.get('MKL_NUM_THREADS'), s.line(), 'torch' in sys.modules]))")


def test_a_users_omp_num_threads_is_respected_not_overwritten():
    """The user's OMP_NUM_THREADS=3 is what torch would take: apply_threads keeps it (and says so)
    instead of writing the CPU share over it."""
    chosen, source, omp, mkl, line, torch_loaded = _fresh_process(_APPLY.format(arg=""), OMP_NUM_THREADS="3")
    assert (chosen, source, omp) == (3, "OMP_NUM_THREADS", "3") and not torch_loaded
    assert mkl == "3"  # MKL, unset by the user, follows the count chosen
    assert line.startswith("threads: 3 (OMP_NUM_THREADS from the environment;") and "OMP_NUM_THREADS kept" in line


def test_the_setting_wins_over_omp_num_threads_and_says_it_overrides():
    chosen, source, omp, mkl, line, _ = _fresh_process(_APPLY.format(arg="2"), OMP_NUM_THREADS="3",
                                                       MKL_NUM_THREADS="2")
    assert (chosen, source, omp, mkl) == (2, "setting", "2", "2")
    assert "overrides the environment's OMP_NUM_THREADS=3" in line and "MKL_NUM_THREADS=2" not in line
    chosen, source, omp, _, line, _ = _fresh_process(_APPLY.format(arg=""), OMP_NUM_THREADS="3",
                                                     **{threads.ENV_VAR: "1"})
    assert (chosen, source, omp) == (1, "env", "1") and "overrides the environment's OMP_NUM_THREADS=3" in line


def test_an_unreadable_omp_num_threads_is_left_and_named():
    chosen, source, omp, _, line, _ = _fresh_process(_APPLY.format(arg=""), OMP_NUM_THREADS="lots")
    assert source == "cpu share" and chosen >= 1 and omp == "lots"
    assert "the environment's OMP_NUM_THREADS='lots' ignored" in line


def test_a_users_omp_num_threads_sets_an_imported_torch(monkeypatch, tmp_path):
    import torch

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv(threads.ENV_VAR, raising=False)
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # not a count an earlier apply_threads wrote here
        monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
        s = threads.apply_threads(None, root=_cgroup(tmp_path, "100000 100000"))  # the share would be 1
        assert (s.threads, s.source, s.torch_set, s.overridden) == (3, "OMP_NUM_THREADS", True, ())
        assert torch.get_num_threads() == 3 and threads.current()["source"] == "OMP_NUM_THREADS"
    finally:
        torch.set_num_threads(before)
