"""A trained tool is named by its content: the manifest of its build, the folder's content hash,
two builds of one recipe alike, the ``trained`` cache keyed by everything that decides the
weights, tools loaded by path and checked, and run records that say which tools they used.

Every build here is tiny (a dozen images, a few steps: about a CPU second each).
"""

from __future__ import annotations

import json
import os
import re
import shutil

import gymnasium as gym
import pytest

import medvqa_env  # noqa: F401  (registers MedVQA-v0)
from medvqa_env.errors import ConfigError
from tool_backends.finetune import finetune
from tool_backends.finetune.common import FinetuneArgs, read_info, write_info
from tool_backends.finetune.manifest import content_hash, verify_folder

pytest.importorskip("torch")
TINY = dict(max_images=12, steps=3, val_split="none", batch_size=4, progress=False)
HEX64 = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("tools") / "ground"
    finetune("ground", FinetuneArgs(out=str(out), **TINY))
    return out


def test_manifest_names_the_build_and_the_folder_hashes_to_it(built):
    import torch

    info = read_info(built)
    build = info["build"]
    assert build["kind"] == "ground" and build["seed"] == 0 and build["dataset"] == "embedded"
    assert build["recipe"]["steps"] == 3 and build["recipe"]["lr"] == 3e-3 and build["recipe"]["batch_size"] == 4
    assert HEX64.match(build["records"]["train"]["sha256"]) and build["records"]["train"]["n_images"] == 12
    assert build["records"]["val"] is None  # --val-split none: held out from training instead
    assert HEX64.match(build["code_version"]) and build["torch_version"] == torch.__version__
    assert build["torch_threads"] == 1 == info["torch_threads"]
    assert "git_commit" in info and info["held_out"].startswith("ground: held-out macro-F1 ")
    assert HEX64.match(info["content_hash"]) and content_hash(built) == info["content_hash"]


def test_content_hash_follows_weights_and_manifest_but_not_timings(built, tmp_path):
    original = read_info(built)["content_hash"]
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    assert content_hash(copy) == original  # another folder, the same content

    info = read_info(copy)
    write_info(copy, {**info, "created": "another day", "build_wall_seconds": 1e6, "git_dirty": True})
    assert content_hash(copy) == original  # volatile fields are not the content
    write_info(copy, {**info, "seed": 7})
    assert content_hash(copy) != original
    write_info(copy, info)

    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(weights))
    assert content_hash(copy) != original
    with pytest.raises(ConfigError, match="files changed after the build"):
        verify_folder(copy, "ground")


def test_same_recipe_built_twice_gives_identical_weights(built, tmp_path):
    import torch

    torch.manual_seed(12345)  # whatever the caller's random state, the build draws from its own seed
    torch.rand(3)
    again = tmp_path / "again"
    finetune("ground", FinetuneArgs(out=str(again), **TINY))
    assert (again / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()
    assert read_info(again)["content_hash"] == read_info(built)["content_hash"]


def test_a_build_runs_deterministic_algorithms_on_fixed_threads_and_restores_both():
    import torch

    from tool_backends.finetune.common import training_run

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    with training_run(seed=0, threads=1) as clock:
        assert torch.are_deterministic_algorithms_enabled() and torch.get_num_threads() == 1
        assert clock["torch_threads"] == 1
    assert torch.get_num_threads() == threads and torch.are_deterministic_algorithms_enabled() == deterministic


def test_another_seed_is_another_tool(built, tmp_path):
    other = tmp_path / "seed1"
    finetune("ground", FinetuneArgs(out=str(other), seed=1, **TINY))
    assert read_info(other)["content_hash"] != read_info(built)["content_hash"]


# ---- the ``trained`` engines' cache key ------------------------------------------------------
SMALL = {"dataset_options": {"n": 48}, "val_options": {"n": 8}, "steps": 2}


def _key(**kw):
    from tool_backends.finetune.cache import cache_args

    return cache_args("ground", **{**SMALL, **kw}).out


def test_cache_key_changes_with_code_recipe_threads_torch_and_data(monkeypatch):
    import torch

    from tool_backends.finetune import ground, manifest

    base = _key()
    assert _key() == base  # stable
    assert _key(torch_threads=2) != base
    assert _key(seed=1) != base
    assert _key(dataset_options={"n": 56}) != base  # other records
    assert _key(steps=3) != base

    real = manifest.code_version
    monkeypatch.setattr(manifest, "code_version", lambda kind: {**real(kind), "sha256": "0" * 64})
    assert _key() != base
    monkeypatch.undo()

    monkeypatch.setattr(ground, "RECIPE", {**ground.RECIPE, "width": 32})  # a recipe value no option sets
    assert _key() != base
    monkeypatch.undo()

    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert _key() != base


def test_code_version_follows_the_trainer_source(monkeypatch, tmp_path):
    from tool_backends.finetune import manifest

    before = manifest.code_version("ground")["sha256"]
    repo = tmp_path / "repo"
    for rel in manifest.code_version("ground")["files"]:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(manifest.REPO_ROOT / rel, repo / rel)
    monkeypatch.setattr(manifest, "REPO_ROOT", repo)
    assert manifest.code_version("ground")["sha256"] == before
    path = repo / "tool_backends/finetune/ground.py"
    path.write_text(path.read_text().replace('"steps": 300', '"steps": 301'))
    assert manifest.code_version("ground")["sha256"] != before


# ---- configs name built tools by path ------------------------------------------------------
def test_trained_engine_loads_a_built_folder_by_path_and_checks_it(built, tmp_path):
    from tool_backends.toolbox import Toolbox

    env = gym.make("MedVQA-v0", tools={"ground": {"engine": "trained", "path": str(built)}}, max_turns=2)
    env.reset(seed=0)
    obs, *_ = env.step('<tool_call>{"name": "ground", "arguments": {"text": "liver"}}</tool_call>')
    assert "[ground]" in obs["text"] and "WARNING" not in obs["text"]
    env.close()

    digest = read_info(built)["content_hash"]
    Toolbox.from_config({"ground": {"engine": "trained", "path": str(built), "content_hash": digest[:12]}},
                        cache=False).close()
    with pytest.raises(ConfigError, match="expected 000000000000"):
        Toolbox.from_config({"ground": {"engine": "trained", "path": str(built), "content_hash": "0" * 12}}, cache=False)
    with pytest.raises(ConfigError, match=r"\['steps'\] describe a build"):
        Toolbox.from_config({"ground": {"engine": "trained", "path": str(built), "steps": 5}}, cache=False)
    with pytest.raises(ConfigError, match="not a 'segment' one"):
        Toolbox.from_config({"segment": {"engine": "trained", "path": str(built)}}, cache=False)


def test_medvqa_tools_build_shows_progress_quality_and_hash(tmp_path, capsys):
    from tool_backends.cli import main

    out = tmp_path / "g"
    assert main(["build", "ground", "--out", str(out), "--max-images", "12", "--steps", "3", "--val-split", "none",
                 "--batch-size", "4"]) == 0
    captured = capsys.readouterr()
    assert re.search(r"building ground: 100%\|.*\| 3/3 .*loss \d", captured.err)  # tqdm: steps, rate/ETA, loss
    assert "ground: held-out macro-F1" in captured.out
    assert f"content hash {read_info(out)['content_hash'][:12]}" in captured.out


# ---- what run records hold, and what a resume compares -------------------------------------
def test_describe_tools_names_trained_tools_by_hash(built, tmp_path, monkeypatch):
    from tool_backends.identity import describe_tools

    monkeypatch.setenv("MEDVQA_CACHE", str(tmp_path))
    desc = describe_tools({"ground": {"engine": "trained", "path": str(built)}, "segment": "classical",
                           "classify": {"engine": "trained", "steps": 2, "dataset_options": {"n": 48}}})
    g = desc["ground"]
    assert g["engine"] == "trained" and g["content_hash"] == read_info(built)["content_hash"]
    assert g["manifest"]["torch_threads"] == 1 and g["manifest"]["held_out"].startswith("ground: held-out")
    assert g["manifest"]["code_version"] == read_info(built)["build"]["code_version"]
    assert desc["segment"] == {"backend": "local", "engine": "classical", "options": {}, "path": None,
                               "content_hash": None, "manifest": None}
    c = desc["classify"]  # not built yet: named by its cache folder, no hash
    assert c["content_hash"] is None and c["path"].startswith("<tool cache>/classify-embedded-train-seed0-")


def test_run_provenance_names_commit_and_package_versions():
    import gymnasium
    import numpy
    import torch

    from medvqa_env.provenance import provenance

    prov = provenance()
    assert prov["gymnasium"] == gymnasium.__version__ and prov["numpy"] == numpy.__version__
    assert prov["torch"] == torch.__version__.split("+")[0] or prov["torch"] == torch.__version__
    assert {"git_commit", "git_dirty", "package_version", "transformers"} <= set(prov)
    assert prov["machine"]["cores"] == os.cpu_count() and prov["machine"]["cpu"]
    assert prov["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def _with_threads(folder, tmp_path, threads):
    other = tmp_path / f"threads{threads}"
    shutil.copytree(folder, other)
    info = read_info(other)
    info["torch_threads"] = threads
    info.pop("content_hash")
    write_info(other, info)
    return other


def test_tool_differences_name_what_changed(built, tmp_path):
    from tool_backends.identity import describe_tools, tool_differences

    old = describe_tools({"ground": {"engine": "trained", "path": str(built)}})
    assert tool_differences(old, describe_tools({"ground": {"engine": "trained", "path": str(built)}})) == []
    moved = tmp_path / "moved"
    shutil.copytree(built, moved)
    assert tool_differences(old, describe_tools({"ground": {"engine": "trained", "path": str(moved)}})) == []
    new = describe_tools({"ground": {"engine": "trained", "path": str(_with_threads(built, tmp_path, 2))}})
    (diff,) = tool_differences(old, new)
    assert diff.startswith(f"ground: content hash {old['ground']['content_hash'][:12]} -> ") and "torch_threads: 1 -> 2" in diff
    assert tool_differences(old, describe_tools({"ground": "classical"})) == [
        f"ground: content hash {old['ground']['content_hash'][:12]} -> none (engine 'trained' -> 'classical')"]


def test_resuming_a_trainer_run_with_another_tool_stops_and_names_the_change(built, tmp_path):
    from dataclasses import dataclass

    from train.common import check_resume, write_run_record

    @dataclass
    class Args:  # the fields check_resume and write_run_record read
        tools: object
        steps: int = 10
        allow_changed: str = ""

    tool = tmp_path / "tool"
    shutil.copytree(built, tool)
    tools = {"ground": {"engine": "trained", "path": str(tool)}}
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_5"
    ckpt.mkdir(parents=True)
    record = write_run_record(run, Args(tools), None)
    assert record["resolved"]["tool_identity"]["ground"]["content_hash"] == read_info(built)["content_hash"]
    check_resume(run, Args(tools), ckpt)  # the same tool: resumes
    shutil.rmtree(tool)
    shutil.copytree(_with_threads(built, tmp_path, 2), tool)  # the same config, another build in the folder
    with pytest.raises(ConfigError, match=r"(?s)used other tools.*torch_threads: 1 -> 2.*--allow-changed tools"):
        check_resume(run, Args(tools), ckpt)
    check_resume(run, Args(tools, allow_changed="tools"), ckpt)


def test_evaluating_into_a_run_with_another_tool_stops_and_names_the_change(built, tmp_path):
    from eval.runner import check_resume
    from tool_backends.identity import describe_tools

    out = tmp_path / "eval"
    out.mkdir()
    old = {"tool_identity": describe_tools({"ground": {"engine": "trained", "path": str(built)}})}
    (out / "run.json").write_text(json.dumps(old))
    check_resume(out, old)
    new = {"tool_identity": describe_tools({"ground": {"engine": "trained",
                                                       "path": str(_with_threads(built, tmp_path, 2))}})}
    with pytest.raises(ConfigError, match=r"(?s)used other tools.*torch_threads: 1 -> 2.*--overwrite"):
        check_resume(out, new)
    check_resume(out, new, overwrite=True)


def test_eval_run_of_a_checkpoint_whose_trained_tool_was_rebuilt_stops_and_names_the_change(built, tmp_path, capsys):
    from eval.run import main
    from train import sft
    from train.common import parse_args

    tool = tmp_path / "tool"
    shutil.copytree(built, tool)
    tools = json.dumps({"image_zoom_in": "local", "ground": {"engine": "trained", "path": str(tool)}})
    sft.main(parse_args(sft.Args, ["--policy", "tiny-qwen2-vl", "--answer-types", "CLOSED", "--eval-size", "2",
                                   "--max-new-tokens", "4", "--batch-size", "2", "--tools", tools, "--steps", "1",
                                   "--max-turns", "1", "--no-tensorboard", "--out", str(tmp_path / "sft")]))
    ckpt = tmp_path / "sft" / "final"
    saved = json.loads((ckpt / "medvqa_run.json").read_text())
    assert saved["resolved"]["tool_identity"]["ground"]["content_hash"] == read_info(built)["content_hash"]
    shutil.rmtree(tool)
    shutil.copytree(_with_threads(built, tmp_path, 2), tool)  # the config names the same folder; another build is in it

    def evaluate(out, *flags):
        return main(["--agent", "vlm", "--agent-opt", f"model={ckpt}", "--agent-opt", "max_new_tokens=3",
                     "--dataset", "embedded", "--limit", "1", "--workers", "0", "--no-open-metrics", "--no-progress",
                     "--bootstrap", "0", "--out", str(tmp_path / out), *flags])

    assert evaluate("refused") == 2
    err = capsys.readouterr().err
    assert "the checkpoint used other tools" in err and "torch_threads: 1 -> 2" in err
    assert "--allow-changed tools" in err and "Traceback" not in err
    assert evaluate("allowed", "--allow-changed", "tools") == 0
    run = json.loads((tmp_path / "allowed" / "run.json").read_text())
    assert run["tool_identity"]["ground"]["content_hash"] == content_hash(tool)


def test_the_command_a_first_use_build_names_builds_the_very_tool_it_caches(tmp_path, monkeypatch):
    import shlex

    from tool_backends.cli import main
    from tool_backends.finetune.cache import build_command, cache_args, trained_folder

    monkeypatch.setenv("MEDVQA_CACHE", str(tmp_path / "cache"))
    folder = trained_folder("ground", **SMALL, progress=False)
    command = build_command("ground", cache_args("ground", **SMALL), out=str(tmp_path / "explicit"))
    assert command.startswith("medvqa-tools build ground ")
    assert main(shlex.split(command)[1:]) == 0  # with a progress bar, which the cached build did not show
    assert content_hash(tmp_path / "explicit") == content_hash(folder) == read_info(folder)["content_hash"]


def test_a_run_on_tool_build_k_records_build_k_and_the_protocol_names_the_same_hash(tmp_path, monkeypatch):
    """A protocol seed runs on build ``seed mod builds`` (``--tool-opt ground.seed=k``): its run
    record's tool identity is build k's (not the recipe's default seed 0), and the protocol's
    identity block names the same hash as the runs of that build."""
    from dataclasses import dataclass, field

    from tool_backends.finetune.cache import trained_folder
    from train import protocol
    from train.common import write_run_record

    monkeypatch.setenv("MEDVQA_CACHE", str(tmp_path / "cache"))
    builds = [content_hash(trained_folder("ground", **SMALL, seed=k, progress=False)) for k in (0, 1)]
    assert builds[0] != builds[1]
    spec = json.dumps({"ground": {"engine": "trained", **SMALL}})

    @dataclass
    class Args:  # the fields write_run_record reads
        tools: object
        tool_opt: list = field(default_factory=list)

    (tmp_path / "run_s1").mkdir()
    record = write_run_record(tmp_path / "run_s1", Args(spec, ["ground.seed=1"]), None)
    assert record["resolved"]["tools"]["ground"]["seed"] == 1
    assert record["resolved"]["tool_identity"]["ground"]["content_hash"] == builds[1]

    args = protocol.Args(tools=spec, seeds="0,1", tool_builds=2, dataset_opt=["n=60"], val_size=8, eval_size=8)
    named = protocol.identity(args, tmp_path / "protocol")["tools"]["ground"]
    assert [protocol.tool_hash(named[str(k)]) for k in (0, 1)] == builds


def test_a_verl_run_record_names_its_tools_policy_and_data_by_content(built, tmp_path):
    """verl's trainer writes no args.json; ``launch.run_record`` is its record: the same
    ``tool_identity`` the native trainer records, the policy folder and the parquet files by SHA-256."""
    from omegaconf import OmegaConf

    from medvqa_env.provenance import content_sha256, provenance
    from train.checkpoint import policy_sha256
    from train.verl_integration.launch import run_record

    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text("{}")
    (policy / "medvqa_widened.json").write_text(json.dumps({"source_policy_sha256": "ab" * 32}))
    parquet = tmp_path / "train.parquet"
    parquet.write_bytes(b"rows")
    cfg = OmegaConf.create({"medvqa": {"env": {"tools": {"ground": {"engine": "trained", "path": str(built)}}}},
                            "actor_rollout_ref": {"model": {"path": str(policy)}},
                            "data": {"train_files": str(parquet), "val_files": str(tmp_path / "missing.parquet")}})
    record = run_record(cfg)
    assert record["tool_identity"]["ground"]["content_hash"] == read_info(built)["content_hash"]
    assert record["policy"]["policy_sha256"] == policy_sha256(policy)
    assert record["policy"]["widened_from_policy_sha256"] == "ab" * 32
    assert record["data"]["train"]["sha256"] == content_sha256(parquet)
    assert record["data"]["val"]["sha256"] is None  # absent: said, not guessed
    assert record["provenance"] == provenance()
    (policy / "config.json").write_text('{"changed": 1}')
    assert run_record(cfg)["policy"]["policy_sha256"] != record["policy"]["policy_sha256"]


def test_a_verl_run_record_names_every_file_of_a_list_of_data_files(tmp_path):
    """verl takes ``data.train_files=[a.parquet,b.parquet]``: each file gets its own SHA-256."""
    from omegaconf import OmegaConf

    from medvqa_env.provenance import content_sha256
    from train.verl_integration.launch import data_files_record

    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    a.write_bytes(b"rows a")
    b.write_bytes(b"rows b")
    files = OmegaConf.create({"train_files": [str(a), str(b)]}).train_files
    assert [r["sha256"] for r in data_files_record(files)] == [content_sha256(a), content_sha256(b)]
    assert data_files_record(str(a))["sha256"] == content_sha256(a)


def test_the_machine_record_tells_apart_cpus_that_share_a_name(monkeypatch, tmp_path):
    """Two VMs both "Intel(R) Xeon(R) Processor", both AVX-512 to torch, train a recipe to different
    bits when one has AMX: the record keeps the kernel-relevant flags and the settings that pin kernels."""
    from medvqa_env import provenance

    def fake(flags: str):
        text = f"processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\ncpu family\t: 6\nmodel\t\t: 143\n" \
               f"stepping\t: 8\nflags\t\t: fpu {flags}\n\nprocessor\t: 1\nflags\t\t: other\n"
        path = tmp_path / f"cpuinfo-{len(flags)}"
        path.write_text(text)
        return path

    real_open = open
    for flags, expected in (("avx2 fma avx512f", ["avx2", "fma", "avx512f"]),
                            ("avx2 fma avx512f amx_tile amx_bf16", ["avx2", "fma", "avx512f", "amx_tile", "amx_bf16"])):
        path = fake(flags)
        monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(path if p == "/proc/cpuinfo" else p, *a, **k))
        got = provenance.machine()
        assert got["kernel_flags"] == expected and got["cpuid"] == "6/143/8"
    monkeypatch.setenv("MKL_CBWR", "AVX512")
    assert provenance.machine()["kernel_settings"] == {"MKL_CBWR": "AVX512"}
