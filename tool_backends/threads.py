"""How many threads a tool server's (or engine's) torch and BLAS use, set on purpose.

torch starts with one intra-op thread per core it sees, which on a shared machine is not the
process's share: on 2 cores with another job on the second, a ~25 ms SAM forward took ~800 ms
when torch split it over both. :func:`apply_threads` sets the count once, at start:

* the setting (``--torch-threads N``, or ``MEDVQA_TORCH_THREADS``), else
* the user's own ``OMP_NUM_THREADS`` (what torch and OpenMP would take anyway; never overwritten
  unless the setting asks for another count, and then the start-up line says so), else
* :func:`cpu_share`: the CPUs this process may run on (``os.sched_getaffinity``), capped by the
  cgroup's CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``),
  rounded down, at least 1.

It returns what it did (:class:`ThreadSetting`), which the server prints at start and ``/health``
reports (:func:`current`).

>>> parse_threads("auto") is None, parse_threads("3"), cpu_share() >= 1
(True, 3, True)
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from medvqa_env.errors import ConfigError

ENV_VAR = "MEDVQA_TORCH_THREADS"
OMP_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""What torch/OpenMP/MKL read at import; a user's value is respected (see :func:`apply_threads`)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class ThreadSetting:
    """What :func:`apply_threads` set and why."""

    threads: int
    """torch intra-op threads (and BLAS threads where threadpoolctl can reach them)."""
    source: str
    """``setting`` (an argument), ``env`` (:data:`ENV_VAR`), ``OMP_NUM_THREADS`` (the user's, from the
    environment) or ``cpu share`` (:func:`cpu_share`)."""
    affinity_cpus: int
    """CPUs in this process's affinity mask."""
    cgroup_cpus: float | None
    """The cgroup's CPU quota in CPUs (``None``: no quota)."""
    torch_set: bool
    """Whether torch was importable and got the count."""
    blas_set: bool
    """Whether threadpoolctl limited the loaded BLAS/OpenMP pools."""
    overridden: tuple[str, ...] = ()
    """The user's ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` values (``"OMP_NUM_THREADS=4"``) that the
    setting replaced; empty when none was set or it already agreed."""
    ignored: str | None = None
    """A user ``OMP_NUM_THREADS`` that is not a count (``"OMP_NUM_THREADS='x'"``), left as it was."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["overridden"] = list(self.overridden)
        return d

    def line(self) -> str:
        """One line for a server's start-up output."""
        quota = "none" if self.cgroup_cpus is None else f"{self.cgroup_cpus:g}"
        why = {"setting": "the setting --torch-threads", "env": ENV_VAR,
               "OMP_NUM_THREADS": "OMP_NUM_THREADS from the environment",
               "cpu share": "cpu share"}.get(self.source, self.source)
        torch = ("set" if self.torch_set else
                 "not loaded: OMP_NUM_THREADS " + ("kept" if self.source == "OMP_NUM_THREADS" else "set")
                 + " for its import")
        extra = "".join(f"; overrides the environment's {o}" for o in self.overridden)
        if self.ignored:
            extra += f"; the environment's {self.ignored} ignored (not a positive integer)"
        return (f"threads: {self.threads} ({why}; affinity {self.affinity_cpus} CPUs, cgroup quota "
                f"{quota}; torch {torch}, BLAS {'set' if self.blas_set else 'untouched'}{extra})")


def affinity_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def cgroup_cpus(root: Path = CGROUP_ROOT) -> float | None:
    """The cgroup's CPU quota in CPUs (quota / period), or ``None`` when there is none or it
    cannot be read. Reads cgroup v2's ``cpu.max`` (``"max 100000"`` = none), else v1's files.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "cpu.max").write_text("150000 100000\\n")
    >>> cgroup_cpus(d)
    1.5
    """
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota_file, period_file = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
        if not quota_file.is_file():
            quota_file, period_file = root / "cpu.cfs_quota_us", root / "cpu.cfs_period_us"
        if quota_file.is_file() and period_file.is_file():
            quota, period = int(quota_file.read_text()), int(period_file.read_text())
            return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None
    return None


def cpu_share(root: Path = CGROUP_ROOT) -> int:
    """Threads this process's CPU share allows: its affinity CPUs, capped by the cgroup quota
    (rounded down, at least 1)."""
    cpus = affinity_cpus()
    quota = cgroup_cpus(root)
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return max(1, cpus)


def parse_threads(value: Any, what: str = "torch threads") -> int | None:
    """``None``/``""``/``"auto"`` -> ``None`` (the CPU share); else a positive int, or a
    :class:`ConfigError` naming what came."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"expected {what} to be a positive integer or 'auto', got {value!r}") from None
    if isinstance(value, bool) or n < 1 or (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"expected {what} to be a positive integer or 'auto', got {value!r}")
    return n


_CURRENT: ThreadSetting | None = None


_WRITTEN: dict[str, str] = {}
"""What :func:`apply_threads` itself last wrote to each of :data:`OMP_VARS` (not the user's)."""


def _user_value(var: str) -> str | None:
    """``var`` from the environment, unless unset, empty, or what :func:`apply_threads` wrote."""
    raw = os.environ.get(var)
    return None if raw is None or not raw.strip() or _WRITTEN.get(var) == raw else raw


def _user_omp() -> tuple[int | None, str | None]:
    """The user's ``OMP_NUM_THREADS`` as a count (its first level, ``"4,2"`` -> 4), or
    ``(None, why)`` when it is set but not a count, ``(None, None)`` when unset."""
    raw = _user_value("OMP_NUM_THREADS")
    if raw is None:
        return None, None
    try:
        n = int(raw.split(",")[0].strip())
    except ValueError:
        return None, f"OMP_NUM_THREADS={raw!r}"
    return (n, None) if n >= 1 else (None, f"OMP_NUM_THREADS={raw!r}")


def apply_threads(setting: Any = None, root: Path = CGROUP_ROOT) -> ThreadSetting:
    """Set torch's intra-op threads (and loaded BLAS pools') to ``setting``, else
    :data:`ENV_VAR`, else the user's ``OMP_NUM_THREADS``, else :func:`cpu_share`; returns (and
    remembers, for :func:`current`) what was set and why (:meth:`ThreadSetting.line`). A torch
    already imported is set; otherwise OMP_NUM_THREADS/MKL_NUM_THREADS are, which torch reads when
    it is imported (so a server whose engines need no torch never imports it). A user's
    OMP_NUM_THREADS/MKL_NUM_THREADS is never changed unless the setting or :data:`ENV_VAR` asks
    for another count; each value so replaced is named in the result."""
    global _CURRENT
    n = parse_threads(setting)
    source = "setting"
    if n is None:
        n = parse_threads(os.environ.get(ENV_VAR), ENV_VAR)
        source = "env"
    user_omp, ignored = _user_omp()
    if n is None and user_omp is not None:
        n, source = user_omp, "OMP_NUM_THREADS"
    if n is None:
        n, source = cpu_share(root), "cpu share"
    overridden: list[str] = []
    torch_set = blas_set = False
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
        torch_set = True
    for var in OMP_VARS:  # for torch's import, and for the OpenMP/MKL pools of whatever loads next
        had = _user_value(var)
        if had is not None and (source == "OMP_NUM_THREADS" or var == "OMP_NUM_THREADS" and ignored):
            continue  # the user's own setting (or one we could not read): theirs, left as it was
        if had is not None and had.strip() != str(n):
            overridden.append(f"{var}={had}")
        os.environ[var] = _WRITTEN[var] = str(n)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
        blas_set = True
    except ImportError:
        pass
    _CURRENT = ThreadSetting(n, source, affinity_cpus(), cgroup_cpus(root), torch_set, blas_set,
                             tuple(overridden), ignored)
    return _CURRENT


def current() -> dict[str, Any] | None:
    """What the last :func:`apply_threads` set (for ``/health``), or ``None`` if it never ran."""
    return None if _CURRENT is None else _CURRENT.to_dict()


__all__ = ["ThreadSetting", "apply_threads", "current", "cpu_share", "cgroup_cpus", "affinity_cpus",
           "parse_threads", "ENV_VAR", "OMP_VARS"]
