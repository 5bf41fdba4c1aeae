"""Where a result came from: package version, git commit, library versions (:func:`provenance`),
and the data it was computed on: the files a loader read and the rows it skipped
(:class:`DatasetProvenance`).

Recorded in ``run.json`` (evaluation) and ``args.json`` / ``medvqa_run.json`` (training), so a
figure can be traced to the code and the data that made it.
"""

from __future__ import annotations

import functools
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def provenance() -> dict[str, Any]:
    """``{"package_version", "git_commit", "git_dirty", "torch", "transformers", "gymnasium", "numpy"}``
    (``None`` where unknown, e.g. an installed wheel has no git checkout). The run identity every
    record holds; trained tools are named separately by content hash
    (:func:`tool_backends.identity.describe_tools`)."""
    from importlib import metadata

    out: dict[str, Any] = {}
    try:
        out["package_version"] = metadata.version("medvqa-gym")
    except metadata.PackageNotFoundError:
        out["package_version"] = None
    out["git_commit"], out["git_dirty"] = _git()
    for lib in ("torch", "transformers", "gymnasium", "numpy"):
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    out["machine"] = machine()
    return out


# CPU features that change which float kernels MKL and oneDNN run (and so the bits a recipe trains to)
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
                "amx_tile", "amx_bf16", "amx_int8")
# settings that pin those kernels (MKL's conditional numerical reproducibility, oneDNN's ISA cap)
KERNEL_SETTINGS = ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")


def cpuinfo() -> dict[str, str]:
    """The first processor's ``/proc/cpuinfo`` fields (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def machine() -> dict[str, Any]:
    """The CPU a record was made on: float kernels differ between CPUs, so two machines can train
    a recipe to different bits. An AMD EPYC VM and an Intel Xeon VM with AMX (both AVX-512 to torch,
    model names as generic as "Intel(R) Xeon(R) Processor") trained the CLOSED protocol's ground
    tool to different weights, so the record keeps the cpuid, the kernel-relevant flags and the
    cache size beside the name, and any setting that pins the kernels. ``torch_cpu_capability`` only where torch is already imported (never
    imported for this)."""
    import os
    import platform
    import sys

    info = cpuinfo()
    flags = set(info.get("flags", "").split())
    out: dict[str, Any] = {"cpu": info.get("model name") or platform.processor() or platform.machine(),
                           "cores": os.cpu_count(), "system": platform.system()}
    if info.get("model"):  # family/model/stepping: tells apart CPUs that share a marketing name
        out["cpuid"] = "/".join(info.get(k, "?") for k in ("cpu family", "model", "stepping"))
    if flags:
        out["kernel_flags"] = [f for f in KERNEL_FLAGS if f in flags]
    if info.get("cache size"):
        out["cache"] = info["cache size"]
    pinned = {k: os.environ[k] for k in KERNEL_SETTINGS if os.environ.get(k)}
    if pinned:
        out["kernel_settings"] = pinned
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        except Exception:  # an old torch: no such query
            pass
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


# ----------------------------------------------------------------------------------------------
# Where a dataset came from: its files, how it was checked, and the rows it left out.
# ----------------------------------------------------------------------------------------------
SKIPPED_FILE = "skipped_records.jsonl"
"""The run-directory file listing a dataset's skipped rows (one JSON object per row)."""


@dataclass
class DatasetProvenance:
    """What a loader read and what it left out (``on_invalid="skip"``).

    ``skipped``: one entry per row left out: ``source`` (the file), ``where`` (``"line 7"``,
    ``"entry 3"``, ``"row 5"``), ``record_id`` (when the row got that far) and ``reason``.
    ``n_images_checked``: distinct images checked (``check_images`` ``exists`` or ``decode``);
    ``n_images_decoded``: of those, decoded without error (``decode`` only). A mixture lists its
    components' provenance in ``components`` and their skipped rows in its own ``skipped``.
    """

    name: str
    sources: list[str] = field(default_factory=list)
    n_records: int = 0
    on_invalid: str = "error"
    check_images: str = "exists"
    n_images_checked: int = 0
    n_images_decoded: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    components: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n_skipped(self) -> int:
        return len(self.skipped)

    def skipped_by_reason(self) -> dict[str, int]:
        """Skipped rows counted by the kind of reason (its text up to the first quote or colon).

        >>> DatasetProvenance("d", skipped=[{"reason": "record 'a' has an empty answer (got '')"},
        ...     {"reason": "image '/x.png' does not exist"}]).skipped_by_reason()
        {'empty answer': 1, 'image does not exist': 1}
        """
        out: dict[str, int] = {}
        for row in self.skipped:
            kind = _reason_kind(str(row.get("reason", "")))
            out[kind] = out.get(kind, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "n_skipped": self.n_skipped, "skipped_by_reason": self.skipped_by_reason()}

    def summary(self) -> dict[str, Any]:
        """:meth:`to_dict` without the row lists (what ``run.json`` keeps; the rows go to
        :data:`SKIPPED_FILE`)."""
        out = {k: v for k, v in self.to_dict().items() if k != "skipped"}
        out["components"] = [{k: v for k, v in c.items() if k != "skipped"} for c in self.components]
        return out


def _reason_kind(reason: str) -> str:
    import re

    text = re.sub(r"'[^']*'|\"[^\"]*\"", "", reason)   # quoted ids, paths and values
    text = re.sub(r"\([^)]*\)", "", text)                # details in brackets
    text = re.sub(r"^\s*record\s*(has an|has|:)?\s*", "", text)
    words = " ".join(text.replace(":", " ").split()[:4])
    return words or "invalid"


def attach_provenance(dataset: Any, provenance: DatasetProvenance) -> Any:
    """Attach ``provenance`` to ``dataset`` (read back with :func:`dataset_provenance`)."""
    dataset.provenance = provenance
    return dataset


def dataset_provenance(dataset: Any) -> DatasetProvenance | None:
    """The :class:`DatasetProvenance` a loader attached, or ``None`` (a dataset built by hand)."""
    prov = getattr(dataset, "provenance", None)
    return prov if isinstance(prov, DatasetProvenance) else None


def write_skipped(dataset: Any, run_dir: str | Path, **fields: Any) -> Path:
    """Write the dataset's skipped rows to ``run_dir/skipped_records.jsonl`` (replacing an older
    list), one JSON object per row with ``fields`` added. Every run folder gets the file: empty
    when nothing was skipped, so "no skips" is written down, not assumed."""
    return write_skipped_of([(dataset, fields)], run_dir)


def write_skipped_of(datasets: Any, run_dir: str | Path) -> Path:
    """:func:`write_skipped` for several ``(dataset, fields)`` pairs into one file (a trainer's
    train and held-out splits, ``fields={"split": ...}``)."""
    import json

    path = Path(run_dir) / SKIPPED_FILE
    lines = []
    for dataset, fields in datasets:
        prov = dataset_provenance(dataset)
        for row in ([] if prov is None else prov.skipped):
            lines.append(json.dumps({"dataset": prov.name, **fields, **row}, ensure_ascii=False, default=str) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    tmp.replace(path)
    return path


# ---- artefacts named by their content ---------------------------------------------------------
def content_sha256(path: str | Path, exclude: tuple[str, ...] = ()) -> str:
    """SHA-256 of a file's bytes, or of a folder's files (their paths relative to it, sorted, and
    their bytes; files or folders named in ``exclude`` and dot-files left out): the same content gives the same
    digest wherever it lies.

    >>> import tempfile; a, b = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    >>> _ = (a / "w.bin").write_bytes(b"1"), (b / "w.bin").write_bytes(b"1")
    >>> content_sha256(a) == content_sha256(b), content_sha256(a)[:8]
    (True, 'd8780f63')
    >>> _ = (b / "w.bin").write_bytes(b"2"); content_sha256(a) == content_sha256(b)
    False
    """
    import hashlib

    path = Path(path)
    h = hashlib.sha256()
    if path.is_file():
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    files = sorted(p for p in path.rglob("*") if p.is_file()
                   and not any(part.startswith(".") or part in exclude for part in p.relative_to(path).parts))
    for f in files:
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + content_sha256(f).encode() + b"\n")
    return h.hexdigest()


def records_sha256(records: Any) -> str:
    """SHA-256 of the records a run used, by content: every field but the image paths, which count by
    their files' bytes (so the same data in another folder, or on another machine, has the same digest)."""
    import hashlib
    import json

    h = hashlib.sha256()
    images: dict[str, str] = {}
    for r in records:
        data = r.to_dict()
        data["image_paths"] = [images.setdefault(p, content_sha256(p)) for p in data["image_paths"]]
        h.update(json.dumps(data, sort_keys=True, default=str).encode() + b"\n")
    return h.hexdigest()


def check_not_all_skipped(dataset: Any, listed_in: str | Path | None = None) -> None:
    """Raise a :class:`DatasetError` naming it when a loader skipped every row (``on_invalid='skip'``
    left nothing to run), with the reasons counted and where the list is."""
    from medvqa_env.errors import DatasetError

    prov = dataset_provenance(dataset)
    if len(dataset) or prov is None or not prov.n_skipped:
        return
    reasons = ", ".join(f"{k} {v}" for k, v in prov.skipped_by_reason().items())
    first = prov.skipped[0]
    where = f"; every row is listed in {listed_in}" if listed_in is not None else ""
    raise DatasetError(f"every row of dataset {prov.name!r} was skipped ({prov.n_skipped} of {prov.n_skipped} rows, "
                       f"on_invalid='skip'): {reasons}; the first: {first['source']} {first['where']}: "
                       f"{first['reason']}{where}")
