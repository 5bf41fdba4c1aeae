"""What must be identical between two runs of the same episodes (everything but timings)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

TIMING_KEYS = {"timing", "env_s", "latency_s", "score_s", "cached"}


def strip_timing(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: strip_timing(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [strip_timing(v) for v in value]
    return value


def by_key(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {r["key"]: strip_timing(r) for r in rows}


class AbortsInAWorker:
    """Mixed into a :class:`~medvqa_env.records.VQARecord`: reading its images aborts the process
    (SIGABRT, as GDCM's uncaught C++ exception on a corrupt JPEG-Baseline DICOM does) when that
    process is a spawned env worker; in the test's own process the record reads normally."""

    def __getattribute__(self, name):
        if name == "image_paths":
            import multiprocessing
            import os

            if multiprocessing.parent_process() is not None:
                os.abort()
        return super().__getattribute__(name)


from medvqa_env.records import VQARecord  # noqa: E402


class AbortingRecord(AbortsInAWorker, VQARecord):
    """A record whose image aborts the env worker that reads it (see :class:`AbortsInAWorker`)."""


def with_aborting_record(dataset, index: int):
    """``dataset`` with record ``index`` replaced by an :class:`AbortingRecord` (same fields)."""
    import dataclasses

    from medvqa_env.records import VQADataset

    records = list(dataset)
    rec = records[index]
    records[index] = AbortingRecord(**{f.name: getattr(rec, f.name) for f in dataclasses.fields(rec) if f.init})
    return VQADataset(records, name=dataset.name)
