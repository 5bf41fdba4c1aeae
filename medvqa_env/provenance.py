"""Where a result came from: package version, git commit, library versions.

Recorded in ``run.json`` (evaluation) and ``args.json`` / ``medvqa_run.json`` (training), so a
figure can be traced to the code that made it.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def provenance() -> dict[str, Any]:
    """``{"package_version", "git_commit", "git_dirty", "torch", "transformers"}`` (``None`` where
    unknown, e.g. an installed wheel has no git checkout)."""
    from importlib import metadata

    out: dict[str, Any] = {}
    try:
        out["package_version"] = metadata.version("medvqa-gym")
    except metadata.PackageNotFoundError:
        out["package_version"] = None
    out["git_commit"], out["git_dirty"] = _git()
    for lib in ("torch", "transformers"):
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    return out


def _git() -> tuple[str | None, bool | None]:
    if not (REPO_ROOT / ".git").exists():
        return None, None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, bool(status.strip()) if commit else None
