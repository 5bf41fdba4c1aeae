"""The committed run records (``benchmarks/runs/``) name what their numbers depend on (issue 26).

Every folder is either current -- each trainer/eval record from a clean commit, every trained tool
by content hash, no absolute path of the machine that ran it -- or listed, with the reason, in
``benchmarks/runs/historical.json`` (recorded before records named their artefacts). A new record
written from a dirty tree or naming a trained tool only as ``{"engine": "trained"}`` fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[1] / "benchmarks" / "runs"
HISTORICAL = {k: v for k, v in json.loads((RUNS / "historical.json").read_text()).items() if not k.startswith("_")}
ABSOLUTE = re.compile(r'(?:^|[\s"\'=:,\[(])(/(?:work|root|home|tmp|Users|mnt|scratch|data|private|var)/[^\s"\']*)')


def _historical(path: Path) -> bool:
    rel = path.relative_to(RUNS).as_posix()
    return any(rel == h or rel.startswith(h + "/") for h in HISTORICAL)


def _current(pattern: str) -> list[Path]:
    return sorted(p for p in RUNS.rglob(pattern) if not _historical(p))


def test_every_historical_entry_is_a_folder_with_a_reason():
    for folder, why in HISTORICAL.items():
        assert (RUNS / folder).is_dir(), f"historical.json names {folder}, which is not under benchmarks/runs"
        assert len(why) > 20, folder


@pytest.mark.parametrize("record", _current("args.json"), ids=lambda p: p.relative_to(RUNS).parent.as_posix())
def test_a_current_run_record_is_from_a_clean_commit_and_names_its_trained_tools_by_hash(record):
    run = json.loads(record.read_text())
    provenance = run["provenance"]
    assert provenance["git_dirty"] is False and re.fullmatch(r"[0-9a-f]{40}", provenance["git_commit"])
    tools = run["resolved"].get("tools") or {}
    identity = run["resolved"].get("tool_identity") or {}
    for name, spec in tools.items():
        if isinstance(spec, dict) and spec.get("engine") == "trained":
            assert re.fullmatch(r"[0-9a-f]{64}", str(identity.get(name, {}).get("content_hash"))), (
                f"{record}: trained tool {name!r} is not named by content hash")
            if "seed" in spec:  # a protocol build: the hash is that build's (its folder names the seed)
                assert f"seed{spec['seed']}-" in identity[name]["path"], (name, identity[name]["path"])


@pytest.mark.parametrize("protocol", _current("protocol.json"), ids=lambda p: p.relative_to(RUNS).parent.as_posix())
def test_a_protocol_record_names_its_commit_tools_data_and_warm_starts(protocol):
    identity = json.loads(protocol.read_text())["identity"]
    assert identity["code"]["git_dirty"] is False
    for builds in identity["tools"].values():
        assert len({b.get("content_hash") or b.get("sha256") for b in builds.values()}) == len(builds) >= 3
    assert {"train", "val", "test"} <= set(identity["data"])
    commits = {json.loads(a.read_text())["provenance"]["git_commit"] for a in protocol.parent.glob("*/args.json")}
    assert commits == {identity["code"]["git_commit"]}, "every run of a protocol comes from its one commit"


@pytest.mark.parametrize("record", _current("eval.json"), ids=lambda p: p.relative_to(RUNS).parent.as_posix())
def test_a_current_evaluation_names_its_commit_and_its_trained_tools_by_hash(record):
    """``train.evaluate``'s ``eval.json`` (a warm start's test figure, a candidate's val probe) names the
    commit that made it and every trained tool by content hash, or its folder is listed historical."""
    run = json.loads(record.read_text())
    provenance = run.get("provenance") or {}
    assert provenance.get("git_dirty") is False and re.fullmatch(r"[0-9a-f]{40}", str(provenance.get("git_commit"))), record
    identity = run.get("tool_identity")
    assert isinstance(identity, dict), f"{record}: no tool_identity"
    for name, tool in identity.items():
        if tool.get("engine") == "trained":
            assert re.fullmatch(r"[0-9a-f]{64}", str(tool.get("content_hash"))), f"{record}: {name!r} has no hash"


def test_no_current_record_holds_an_absolute_path_of_the_machine_that_ran_it():
    found = []
    for path in sorted(p for p in RUNS.rglob("*") if p.is_file() and not _historical(p)):
        if path.suffix in (".gz", ".png", ".sh") or path.name == "historical.json":
            continue
        for match in ABSOLUTE.finditer(path.read_text(errors="replace")):
            found.append(f"{path.relative_to(RUNS)}: {match.group(1)[:80]}")
    assert not found, "\n".join(found[:10])


def test_the_historical_records_hold_no_absolute_path_either():
    found = [f"{p.relative_to(RUNS)}: {m.group(1)[:80]}" for p in sorted(RUNS.rglob("*"))
             if p.is_file() and _historical(p) and p.suffix not in (".gz", ".png", ".sh")
             for m in ABSOLUTE.finditer(p.read_text(errors="replace"))]
    assert not found, "\n".join(found[:10])


HEX64 = re.compile(r"[0-9a-f]{64}")


@pytest.mark.parametrize("record", _current("run_record.json"), ids=lambda p: p.relative_to(RUNS).parent.as_posix())
def test_a_verl_run_record_names_its_commit_tools_policy_and_data_and_matches_its_native_pair(record):
    """verl's runs write ``run_record.json`` (``launch.run_record``). Beside a native protocol record,
    seed k must have run on that record's tool build k mod builds and from that build's warm start."""
    run = json.loads(record.read_text())
    assert run["provenance"]["git_dirty"] is False and re.fullmatch(r"[0-9a-f]{40}", run["provenance"]["git_commit"])
    for name, tool in run["tool_identity"].items():
        if tool.get("engine") == "trained":
            assert HEX64.fullmatch(str(tool.get("content_hash"))), f"{record}: trained tool {name!r} has no hash"
    assert HEX64.fullmatch(str(run["policy"]["policy_sha256"]))
    assert all(HEX64.fullmatch(str(d["sha256"])) for d in run["data"].values()), run["data"]
    setting = record.parents[1]
    native = setting.parent / setting.name.removesuffix("_verl") / "protocol.json"
    if native.is_file():
        recorded = json.loads(native.read_text())
        build = str(int(record.parent.name.rsplit("_s", 1)[1]) % recorded["args"]["tool_builds"])
        ident = recorded["identity"]
        for name, builds in ident["tools"].items():
            assert run["tool_identity"][name]["content_hash"] == builds[build]["content_hash"], (record, name)
        assert run["policy"]["widened_from_policy_sha256"] == ident["warm_starts"][build]["policy_sha256"], record
