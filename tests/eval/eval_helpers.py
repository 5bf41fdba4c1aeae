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
