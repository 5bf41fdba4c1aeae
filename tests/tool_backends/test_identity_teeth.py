"""Teeth for the tool identity and manifest checks (issue 42, mutation testing):
``tool_backends/identity.py`` (what a run record says its tools were, and what a resume or an eval
compares) and the manifest checks of ``tool_backends/finetune/manifest.py`` (content hash,
``verify_folder``). A "trained tool" here is a hand-made folder (a weights file and a manifest),
not a build, so every test is milliseconds: ``benchmarks/mutation.py`` runs it per mutant."""

from __future__ import annotations

import json

import pytest

from medvqa_env.errors import ConfigError
from tool_backends.finetune.common import TOOL_INFO, read_info, write_info
from tool_backends.finetune.manifest import content_hash, hashed_manifest, verify_folder
from tool_backends.identity import _public, _short, check_tools, describe_tools, shown_path, tool_differences

H1, H2 = "a" * 64, "b" * 64
INFO = {"tool": "ground", "engine": "trained", "dataset": "embedded", "split": "train", "seed": 3, "steps": 5,
        "torch_version": "2.x", "torch_threads": 1, "git_commit": "c0ffee", "created": "today",
        "build": {"recipe": {"lr": 0.1}, "records": {"train": {"sha256": "t" * 64}, "val": None},
                  "code_version": "v" * 64},
        "validation": {"macro_f1": 0.5, "threshold": 0.3, "n_images": 4}}


def _folder(path, info=INFO, weights=b"weights-1", hashed=True):
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.bin").write_bytes(weights)
    info = dict(info)
    if hashed:
        info["content_hash"] = content_hash(path, info)
    write_info(path, info)
    return path


# ---------------------------------------------------------------- tool_differences
def _trained(h, **manifest):
    return {"backend": "local", "engine": "trained", "options": {}, "content_hash": h, "manifest": manifest}


def test_the_same_tools_have_no_differences():
    a = {"zoom": {"backend": "local", "engine": "default", "options": {"x": 1}}, "ground": _trained(H1, seed=0)}
    assert tool_differences(a, json.loads(json.dumps(a))) == []
    assert tool_differences({}, {}) == []


def test_an_added_and_a_removed_tool_are_named_in_order():
    old = {"b": {"engine": "x"}, "c": {"engine": "x"}}
    new = {"a": {"engine": "x"}, "b": {"engine": "x"}}
    assert tool_differences(old, new) == ["a: added", "c: removed"]


def test_same_hash_means_same_tool_whatever_else_differs():
    old, new = _trained(H1, seed=0), _trained(H1, seed=9)
    new.update(options={"path": "elsewhere"}, engine="other")
    assert tool_differences({"g": old}, {"g": new}) == []


def test_a_changed_hash_lists_every_changed_manifest_field_but_held_out():
    old = _trained(H1, seed=0, torch_threads=1, recipe={"lr": 0.1}, held_out="F1 0.5", same="s")
    new = _trained(H2, seed=1, torch_threads=2, recipe={"lr": 0.2}, held_out="F1 0.9", same="s")
    assert tool_differences({"g": old}, {"g": new}) == [
        'g: content hash aaaaaaaaaaaa -> bbbbbbbbbbbb (seed: 0 -> 1; torch_threads: 1 -> 2; recipe: {"lr": 0.1} -> {"lr": 0.2})']


def test_a_changed_hash_with_the_same_manifest_says_only_the_hashes():
    assert tool_differences({"g": _trained(H1, seed=0)}, {"g": _trained(H2, seed=0)}) == [
        "g: content hash aaaaaaaaaaaa -> bbbbbbbbbbbb"]
    old = {"g": {**_trained(H1), "manifest": None}}
    new = {"g": {**_trained(H2), "manifest": None}}
    assert tool_differences(old, new) == ["g: content hash aaaaaaaaaaaa -> bbbbbbbbbbbb"]


def test_a_manifest_field_missing_in_the_new_one_shows_as_null():
    old, new = _trained(H1, seed=0), {**_trained(H2), "manifest": None}
    assert tool_differences({"g": old}, {"g": new}) == ["g: content hash aaaaaaaaaaaa -> bbbbbbbbbbbb (seed: 0 -> null)"]


def test_a_hash_on_one_side_only_names_the_engine_change_or_not_built_here():
    built = _trained(H1, seed=0)
    classical = {"backend": "local", "engine": "classical", "options": {}, "content_hash": None, "manifest": None}
    assert tool_differences({"g": built}, {"g": classical}) == [
        "g: content hash aaaaaaaaaaaa -> none (engine 'trained' -> 'classical')"]
    assert tool_differences({"g": classical}, {"g": built}) == [
        "g: content hash none -> aaaaaaaaaaaa (engine 'classical' -> 'trained')"]
    unbuilt = {**built, "content_hash": None}
    assert tool_differences({"g": built}, {"g": unbuilt}) == ["g: content hash aaaaaaaaaaaa -> none (not built here)"]


@pytest.mark.parametrize("key", ["backend", "engine", "options"])
def test_untrained_tools_compare_backend_engine_and_options(key):
    old = {"backend": "local", "engine": "classical", "options": {"k": 1}}
    new = {**old, key: {"k": 2} if key == "options" else "other"}
    (line,) = tool_differences({"t": old}, {"t": new})
    shown = {"backend": "local -> other", "engine": "classical -> other", "options": '{"k": 1} -> {"k": 2}'}[key]
    assert line == f"t: {key} {shown}"


def test_options_compare_as_json_with_sorted_keys():
    old = {"engine": "x", "options": {"a": 1, "b": 2}}
    new = {"engine": "x", "options": {"b": 2, "a": 1}}
    assert tool_differences({"t": old}, {"t": new}) == []


def test_every_differing_key_of_a_tool_is_listed():
    old = {"backend": "local", "engine": "a", "options": {}}
    new = {"backend": "http", "engine": "b", "options": {"u": 1}}
    assert tool_differences({"t": old}, {"t": new}) == ["t: backend local -> http", "t: engine a -> b",
                                                        't: options {} -> {"u": 1}']


def test_the_observation_image_is_compared_only_when_both_records_have_it():
    old = {"engine": "x", "options": {}, "observation_image": {"kind": "first"}}
    new = {"engine": "x", "options": {}, "observation_image": {"kind": "latest"}}
    assert tool_differences({"t": old}, {"t": new}) == [
        't: observation_image {"kind": "first"} -> {"kind": "latest"}']
    legacy = {"engine": "x", "options": {}}
    assert tool_differences({"t": legacy}, {"t": new}) == []
    assert tool_differences({"t": old}, {"t": legacy}) == []


# ---------------------------------------------------------------- check_tools
def test_check_tools_stops_with_the_run_the_differences_and_the_hint():
    with pytest.raises(ConfigError) as e:
        check_tools({"g": _trained(H1), "z": {"engine": "a"}}, {"g": _trained(H2), "z": {"engine": "b"}},
                    "runs/x", "Use --allow-changed tools.")
    assert str(e.value) == ("runs/x used other tools than these:\n"
                            "  g: content hash aaaaaaaaaaaa -> bbbbbbbbbbbb\n"
                            "  z: engine a -> b\n"
                            "Use --allow-changed tools.")


def test_check_tools_passes_the_same_tools_and_an_old_record_without_identity():
    same = {"g": _trained(H1)}
    check_tools(same, dict(same), "r", "h")
    check_tools(None, {"g": _trained(H1)}, "r", "h")
    check_tools({}, {"g": _trained(H1)}, "r", "h")


# ---------------------------------------------------------------- _short, _public
def test_short_cuts_hashes_to_twelve_and_long_text_to_eighty():
    assert _short(H1) == "a" * 12
    assert _short("A" * 64) == "A" * 64  # upper case is not a hex digest here
    assert _short("a" * 63) == "a" * 63 and _short("g" * 64) == "g" * 64
    assert _short("x" * 80) == "x" * 80
    assert _short("x" * 81) == "x" * 77 + "..."
    assert _short({"a": 1}) == '{"a": 1}' and _short(None) == "null" and _short(3) == "3"
    assert _short(list(range(40))) == json.dumps(list(range(40)))[:77] + "..."


def test_public_options_are_json_values():
    from pathlib import Path
    assert _public({"b": Path("/x"), "a": (1, 2)}) == {"a": [1, 2], "b": "/x"}


# ---------------------------------------------------------------- describe_tools
def test_untrained_tools_are_described_by_backend_engine_and_options():
    desc = describe_tools({"image_zoom_in": "local", "segment": {"backend": "http", "url": "http://h:1"}})
    seg = desc["segment"]
    assert seg == {"backend": "http", "engine": "default", "options": {"url": "http://h:1"}, "path": None,
                   "content_hash": None, "manifest": None}
    zoom = desc["image_zoom_in"]
    assert zoom["backend"] == "local" and zoom["engine"] == "default" and zoom["content_hash"] is None


def test_a_trained_folder_is_described_by_its_content_hash_and_manifest(tmp_path):
    folder = _folder(tmp_path / "g")
    desc = describe_tools({"ground": {"engine": "trained", "path": str(folder)}})["ground"]
    assert desc["engine"] == "trained" and desc["backend"] == "local"
    assert desc["content_hash"] == read_info(folder)["content_hash"] == content_hash(folder)
    assert desc["manifest"]["seed"] == 3 and desc["manifest"]["torch_threads"] == 1
    assert desc["manifest"]["held_out"].startswith("ground: held-out macro-F1 0.500")
    assert desc["path"] == str(folder) == desc["options"]["path"]  # outside the repo and the cache: as given
    assert "note" not in desc


def test_a_folder_changed_after_its_build_is_noted(tmp_path):
    folder = _folder(tmp_path / "g")
    recorded = read_info(folder)["content_hash"]
    (folder / "model.bin").write_bytes(b"weights-2")
    desc = describe_tools({"ground": {"engine": "trained", "path": str(folder)}})["ground"]
    assert desc["content_hash"] == content_hash(folder) != recorded
    assert desc["note"] == f"files changed after the build (its manifest records {recorded[:12]})"


def test_a_folder_named_by_model_is_a_trained_tool_too(tmp_path):
    folder = _folder(tmp_path / "g")
    desc = describe_tools({"ground": {"engine": "centernet", "model": str(folder)}})["ground"]
    assert desc["engine"] == "centernet" and desc["content_hash"] == content_hash(folder)


def test_a_folder_without_a_manifest_is_not_a_trained_tool(tmp_path):
    (tmp_path / "plain").mkdir()
    desc = describe_tools({"ground": {"engine": "centernet", "model": str(tmp_path / "plain")}})["ground"]
    assert desc["content_hash"] is None and desc["manifest"] is None


def test_an_http_tool_naming_a_folder_is_not_hashed(tmp_path):
    folder = _folder(tmp_path / "g")
    desc = describe_tools({"ground": {"backend": "http", "url": "http://h:1", "path": str(folder)}})["ground"]
    assert desc["content_hash"] is None


def test_shown_path_is_relative_in_the_repo_and_labelled_in_the_cache(tmp_path, monkeypatch):
    from medvqa_env.provenance import REPO_ROOT
    from tool_backends.finetune.cache import cache_root

    monkeypatch.setenv("MEDVQA_CACHE", str(tmp_path / "cache"))
    inside = cache_root() / "ground-x"
    inside.mkdir(parents=True)
    assert shown_path(inside) == "<tool cache>/ground-x"
    assert shown_path(REPO_ROOT / "tool_backends") == "tool_backends"
    assert shown_path(tmp_path / "elsewhere") == str(tmp_path / "elsewhere")


# ---------------------------------------------------------------- manifest checks
def test_the_content_hash_covers_files_and_manifest_but_not_volatile_fields(tmp_path):
    folder = _folder(tmp_path / "g", hashed=False)
    base = content_hash(folder)
    assert len(base) == 64
    info = read_info(folder)
    assert content_hash(folder, {**info, "created": "tomorrow", "git_commit": "other", "content_hash": "x"}) == base
    assert content_hash(folder, {**info, "seed": 4}) != base
    assert content_hash(folder, {**info, "settings": {"out": "a", "progress": True}}) == \
        content_hash(folder, {**info, "settings": {"out": "b", "progress": False}})
    assert content_hash(folder, {**info, "settings": {"lr": 1}}) != content_hash(folder, {**info, "settings": {"lr": 2}})
    (folder / ".hidden").write_bytes(b"ignored")
    assert content_hash(folder) == base
    (folder / "extra.bin").write_bytes(b"")
    assert content_hash(folder) != base
    (folder / "extra.bin").unlink()
    (folder / "model.bin").rename(folder / "renamed.bin")
    assert content_hash(folder) != base  # names count, not only bytes


def test_hashed_manifest_drops_exactly_the_volatile_fields():
    info = {"seed": 1, "created": "x", "git_dirty": True, "content_hash": "h", "settings": {"out": "o", "lr": 1}}
    assert hashed_manifest(info) == {"seed": 1, "settings": {"lr": 1}}
    assert hashed_manifest({"settings": "not a mapping"}) == {"settings": "not a mapping"}


def test_content_hash_of_a_folder_without_a_manifest_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=f"is not a trained tool folder \\(no readable {TOOL_INFO}\\)"):
        content_hash(tmp_path)


def test_verify_folder_passes_a_sound_folder_and_returns_its_hash(tmp_path):
    folder = _folder(tmp_path / "g")
    info = verify_folder(folder, kind="ground", expected=read_info(folder)["content_hash"][:12])
    assert info["content_hash"] == content_hash(folder) and info["seed"] == 3
    assert verify_folder(folder)["tool"] == "ground"


def test_verify_folder_refuses_a_missing_manifest_another_kind_changed_files_and_another_hash(tmp_path):
    with pytest.raises(ConfigError, match=r"no readable medvqa_tool.json\); build one with `medvqa-tools build segment"):
        verify_folder(tmp_path, kind="segment")
    folder = _folder(tmp_path / "g")
    with pytest.raises(ConfigError, match="holds a trained 'ground' tool, not a 'segment' one"):
        verify_folder(folder, kind="segment")
    with pytest.raises(ConfigError, match=r"content hash \w{12}, expected bbbbbbbbbbbb"):
        verify_folder(folder, expected=H2)
    recorded = read_info(folder)["content_hash"]
    (folder / "model.bin").write_bytes(b"tampered")
    with pytest.raises(ConfigError) as e:
        verify_folder(folder)
    assert f"records content hash {recorded[:12]}, the files hash to {content_hash(folder)[:12]}" in str(e.value)
    assert "`medvqa-tools build ground --out" in str(e.value)


def test_a_folder_from_before_content_hashes_passes_and_gets_one(tmp_path):
    folder = _folder(tmp_path / "g", hashed=False)
    assert "content_hash" not in read_info(folder)
    assert verify_folder(folder)["content_hash"] == content_hash(folder)
