"""Resumable per-episode results: one JSON object per line, appended and fsynced as each episode ends.

A run killed at any moment loses nothing that finished: every line on disk is complete except
possibly the last one, which :func:`load_results` ignores and :class:`ResultsWriter` cuts off
before appending again. Episodes are keyed ``"<record_id>#<sample>"``; rerunning skips keys that
are already there.

>>> episode_key("vqarad_test_3", 2)
'vqarad_test_3#2'
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

RESULTS_FILE = "episodes.jsonl"


def episode_key(record_id: str, sample: int) -> str:
    return f"{record_id}#{sample}"


def _iter_lines(path: Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """Yield ``(end_offset, row)``; ``row`` is ``None`` for a line that is not a JSON object."""
    offset = 0
    with path.open("rb") as f:
        for raw in f:
            offset += len(raw)
            if not raw.endswith(b"\n"):
                yield offset, None  # a torn last line from a killed writer
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                yield offset, None
                continue
            yield offset, row if isinstance(row, dict) and "key" in row else None


def load_results(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete episode rows in ``path`` (the last row wins for a repeated key)."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        return []
    rows: dict[str, dict[str, Any]] = {}
    for _, row in _iter_lines(path):
        if row is not None:
            rows[row["key"]] = row
    return list(rows.values())


class ResultsWriter:
    """Appends episode rows to ``path``, flushing and fsyncing each one (thread-unsafe: one writer)."""

    def __init__(self, path: str | os.PathLike, fsync: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.done: set[str] = set()
        if self.path.is_file():
            good_end = 0
            for end, row in _iter_lines(self.path):
                if row is None:
                    break  # everything from the first bad line on is dropped
                self.done.add(row["key"])
                good_end = end
            if good_end != self.path.stat().st_size:
                with self.path.open("r+b") as f:
                    f.truncate(good_end)
        self._file = self.path.open("a", encoding="utf-8")

    def append(self, row: Mapping[str, Any]) -> None:
        self.append_many([row])

    def append_many(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Write ``rows`` and make them durable with one flush + fsync (a group commit)."""
        lines = []
        for row in rows:
            if "key" not in row:
                raise ValueError(f"expected an episode row with a 'key', got keys {sorted(row)!r}")
            lines.append(json.dumps(sanitize(row), ensure_ascii=False, default=_json_default, allow_nan=False) + "\n")
        if not lines:
            return
        self._file.write("".join(lines))
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self.done.update(row["key"] for row in rows)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _json_default(value: Any) -> Any:
    """numpy scalars and arrays, tuples, sets, enums -> JSON; anything else -> ``repr``."""
    import enum

    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


_PLAIN = (str, int, bool, type(None))


def sanitize(value: Any) -> Any:
    """Replace non-finite floats by ``None`` recursively (JSON has no NaN)."""
    import math

    if type(value) in _PLAIN:  # most of a row: checked first, exact types (typing checks are slow)
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if type(value) is dict or isinstance(value, Mapping):
        return {str(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    return value
