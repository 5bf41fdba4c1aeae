"""Loaded once: env copies that ask for the same checkpoint share one engine, loaded once per process
(:mod:`tool_backends.engines.loaded`), quietly; a changed checkpoint folder is loaded afresh."""

from __future__ import annotations

import os

import pytest

from medvqa_env.env import MedVQAEnv
from medvqa_env.records import VQADataset
from rewards import RuleReward
from tool_backends.engines.loaded import checkpoint_fingerprint, loaded_count
from tool_backends.registry import build_tool

torch = pytest.importorskip("torch")  # the [vision] extra; always present in the dev venv
CLASSIFY = '<tool_call>{"name": "classify", "arguments": {"labels": ["ct", "mri"]}}</tool_call>'


@pytest.fixture
def clip_folder(tmp_path):
    """A CLIP checkpoint folder (the tiny engine saved as a trained folder is)."""
    engine = build_tool("classify", engine="clip").engine
    engine.model.save_pretrained(tmp_path)
    engine.processor.save_pretrained(tmp_path)
    engine.tokenizer.save_pretrained(tmp_path)
    return tmp_path


def env_copy(scene, folder) -> MedVQAEnv:
    env = MedVQAEnv(VQADataset([scene.record]), tools={"classify": {"engine": "clip", "model": str(folder)}},
                    reward=RuleReward())
    env.reset(options={"index": 0})
    return env


def engine_of(env: MedVQAEnv):
    return env.toolbox._backends["classify"].tools["classify"].engine


def test_env_copies_share_one_engine_and_a_changed_folder_loads_afresh(scene, clip_folder, capfd):
    before = loaded_count()
    copies = [env_copy(scene, clip_folder) for _ in range(4)]  # each copy builds its own toolbox
    assert len({id(engine_of(e)) for e in copies}) == 1 and loaded_count() == before + 1
    assert "Loading weights" not in capfd.readouterr().err  # transformers' progress bar stays quiet
    copies[0].close()  # one copy closing leaves the engine to the others
    _, _, _, _, info = copies[1].step(CLASSIFY)
    assert info["tool_calls"][0]["error"] is None
    weights = clip_folder / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # new weights written in place
    fresh = env_copy(scene, clip_folder)
    assert engine_of(fresh) is not engine_of(copies[1]) and loaded_count() == before + 2
    for env in [*copies[1:], fresh]:
        env.close()


def test_progress_bars_show_when_asked(scene, clip_folder, capfd, monkeypatch):
    monkeypatch.setenv("MEDVQA_PROGRESS_BARS", "1")
    env_copy(scene, clip_folder).close()
    assert "Loading weights" in capfd.readouterr().err


def test_a_checkpoint_is_identified_by_its_files(clip_folder):
    first = checkpoint_fingerprint(str(clip_folder))
    assert first == checkpoint_fingerprint(clip_folder) and "model.safetensors" in {f[0] for f in first[1:]}
    (clip_folder / "medvqa_tool.json").write_text("{}")  # a manifest added
    assert checkpoint_fingerprint(clip_folder) != first
    assert checkpoint_fingerprint("openai/clip-vit-base-patch32") == ("openai/clip-vit-base-patch32",)
