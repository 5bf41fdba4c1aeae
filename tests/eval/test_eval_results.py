"""Resumable JSONL: every complete line survives, a torn last line is dropped and cut off."""

from __future__ import annotations

import json
import math

import pytest

from eval.results import ResultsWriter, episode_key, load_results


def test_append_is_on_disk_at_once_and_reloads(tmp_path):
    path = tmp_path / "episodes.jsonl"
    with ResultsWriter(path) as w:
        w.append({"key": "a#0", "x": 1})
        # readable by another reader before the writer closes
        assert [r["key"] for r in load_results(path)] == ["a#0"]
        w.append({"key": "a#1", "x": float("nan")})
    rows = load_results(path)
    assert [r["key"] for r in rows] == ["a#0", "a#1"]
    assert rows[1]["x"] is None  # NaN is not JSON: stored as null


def test_torn_last_line_is_ignored_then_truncated(tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps({"key": "a#0"}) + "\n" + '{"key": "a#1", "pred')  # killed mid-write
    assert [r["key"] for r in load_results(path)] == ["a#0"]
    with ResultsWriter(path) as w:
        assert w.done == {"a#0"}
        w.append({"key": "a#1"})
    lines = path.read_text().splitlines()
    assert [json.loads(l)["key"] for l in lines] == ["a#0", "a#1"]


def test_last_row_wins_for_a_repeated_key(tmp_path):
    path = tmp_path / "episodes.jsonl"
    with ResultsWriter(path) as w:
        w.append({"key": "a#0", "error": {"kind": "agent_error"}})
        w.append({"key": "a#0", "error": None})
    assert load_results(path) == [{"key": "a#0", "error": None}]


def test_row_without_key_is_refused(tmp_path):
    with ResultsWriter(tmp_path / "e.jsonl") as w, pytest.raises(ValueError, match="'key'"):
        w.append({"x": 1})


def test_missing_file_and_folder_forms(tmp_path):
    assert load_results(tmp_path / "nope.jsonl") == []
    with ResultsWriter(tmp_path / "episodes.jsonl") as w:
        w.append({"key": episode_key("q1", 3), "v": math.pi})
    assert load_results(tmp_path)[0]["key"] == "q1#3"
