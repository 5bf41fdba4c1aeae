"""``benchmarks/tool_build_kernels.py`` keeps one row per CPU: a run on another VM adds its row
and leaves the others' hashes as they were (the comparison needs both halves)."""

from __future__ import annotations

import json


def test_a_run_replaces_this_machines_row_and_keeps_the_others(load_benchmark, monkeypatch, tmp_path):
    kernels = load_benchmark("tool_build_kernels")
    me = kernels.machine_id()
    assert me.startswith(("intel-", "amd-")) and "/" not in me
    other = "amd-1-2-3" if me != "amd-1-2-3" else "amd-4-5-6"  # never this machine's own id
    (tmp_path / "tool_build_kernels.json").write_text(json.dumps({"figures": {
        f"{other}.default": "aa" * 32, f"{other}.cpu": "AMD EPYC", f"{me}.default": "stale"}}))
    monkeypatch.setattr(kernels, "RESULTS", tmp_path)
    built = []
    monkeypatch.setattr(kernels, "build_hash", lambda setting: built.append(setting) or f"hash-{len(built)}")
    kept = {}
    monkeypatch.setattr(kernels, "record", lambda topic, text, figures, command: kept.update(figures=figures, text=text))
    assert kernels.main(["--settings", "default,avx2"]) == 0
    assert built == [kernels.SETTINGS["default"], kernels.SETTINGS["avx2"]]
    figures = kept["figures"]
    assert figures[f"{me}.default"] == "hash-1" and figures[f"{me}.avx2"] == "hash-2"
    assert figures[f"{other}.default"] == "aa" * 32  # the other VM's row stays
    assert f"| {other} (AMD EPYC) |" in kept["text"]


def test_the_record_commit_build_is_its_own_column_and_keeps_this_machines_settings(load_benchmark, monkeypatch,
                                                                                    tmp_path):
    kernels = load_benchmark("tool_build_kernels")
    me = kernels.machine_id()
    (tmp_path / "tool_build_kernels.json").write_text(json.dumps({"figures": {f"{me}.avx2": "kept-from-before"}}))
    monkeypatch.setattr(kernels, "RESULTS", tmp_path)
    monkeypatch.setattr(kernels, "build_hash", lambda setting: (_ for _ in ()).throw(AssertionError("built")))
    commits = []
    monkeypatch.setattr(kernels, "build_hash_at", lambda commit: commits.append(commit) or "at-record")
    kept = {}
    monkeypatch.setattr(kernels, "record", lambda topic, text, figures, command: kept.update(figures=figures, text=text))
    assert kernels.main(["--settings=", "--at-record-commit"]) == 0
    recorded = json.loads(kernels.RECORD.read_text())["identity"]
    assert commits == [recorded["code"]["git_commit"]]  # the commit that wrote the CLOSED record
    figures = kept["figures"]
    assert figures[f"{me}.record_commit"] == "at-record" and figures[f"{me}.avx2"] == "kept-from-before"
    assert figures["record.ground_b0"] == recorded["tools"]["ground"]["0"]["content_hash"]
    assert f"none, code at {recorded['code']['git_commit'][:7]}" in kept["text"]


def test_an_unknown_setting_is_refused_before_anything_is_built(load_benchmark, monkeypatch):
    import pytest

    kernels = load_benchmark("tool_build_kernels")
    monkeypatch.setattr(kernels, "build_hash", lambda setting: (_ for _ in ()).throw(AssertionError("built")))
    with pytest.raises(SystemExit):
        kernels.main(["--settings", "default,avx9000"])
