"""Tools trained on a dataset's annotations (``python -m tool_backends.finetune``): the folders
their real engines load by path, the ``trained`` engines' first-use cache, and held-out quality.

Training here is tiny (a dozen images, a few steps) except in the quality test, which trains the
grounder for real on the embedded train split and must beat the classical grounder on the test
split's presence questions.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import medvqa_env  # noqa: F401  (registers MedVQA-v0)
from medvqa_env.datasets import load_dataset
from medvqa_env.errors import ConfigError
from medvqa_env.images import load_image
from medvqa_env.parser import ToolCall
from tool_backends.base import ToolContext
from tool_backends.finetune import finetune
from tool_backends.finetune.common import TOOL_INFO, FinetuneArgs, read_info
from tool_backends.toolbox import Toolbox

pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[2]
TINY = dict(max_images=12, steps=3, val_split="none", batch_size=4)


@pytest.fixture(scope="module")
def ground_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tools") / "ground"
    finetune("ground", FinetuneArgs(out=str(out), **TINY))
    return out


def _ground_call(text: str) -> str:
    return '<tool_call>' + json.dumps({"name": "ground", "arguments": {"text": text}}) + '</tool_call>'


def test_ground_folder_records_provenance_and_loads_in_the_env_by_path(ground_dir):
    info = read_info(ground_dir)
    assert {"config.json", "model.safetensors", TOOL_INFO} <= {p.name for p in ground_dir.iterdir()}
    assert (info["tool"], info["dataset"], info["split"], info["steps"], info["seed"]) == ("ground", "embedded", "train", 3, 0)
    assert "liver lesion" in info["labels"] and info["package_version"] and info["build_cpu_seconds"] > 0
    assert info["validation"]["source"].startswith("the last 1 training images")
    env = gym.make("MedVQA-v0", tools={"ground": {"engine": "centernet", "model": str(ground_dir)}}, max_turns=2)
    env.reset(seed=0)
    obs, *_ = env.step(_ground_call("lesion"))
    text = obs["text"]
    assert "[ground]" in text and "WARNING" not in text and "randomly-initialised" not in text
    assert "expanded to the 8 labels the model was trained on that contain it; each box names its label" in text
    obs, *_ = env.step(_ground_call("nodule"))
    assert "finds only the labels it was trained on" in obs["text"] and "'nodule' matches none" in obs["text"]
    env.close()


def test_ground_boxes_carry_the_trained_label_and_the_tool_default_is_the_chosen_threshold(ground_dir):
    from tool_backends.registry import build_tool

    tool = build_tool("ground", engine="centernet", model=str(ground_dir))
    info = read_info(ground_dir)
    assert tool.spec.parameters["properties"]["threshold"]["default"] == info["threshold"]
    record = load_dataset("embedded", split="test", n=4)[0]
    out = tool([load_image(record.image_paths[0])], {"text": "kidney", "threshold": 0.0, "max_boxes": 20},
               ToolContext())
    assert out.data["queried_labels"] == ["left kidney", "left kidney lesion", "right kidney", "right kidney lesion"]
    assert out.data["boxes"] and {b["label"] for b in out.data["boxes"]} <= set(out.data["queried_labels"])
    scores = [b["score"] for b in out.data["boxes"]]
    assert scores == sorted(scores, reverse=True)


def test_segment_and_classify_folders_load_in_the_real_transformers_engines(tmp_path):
    from tool_backends.registry import build_tool

    seg, clf = tmp_path / "seg", tmp_path / "clf"
    finetune("segment", FinetuneArgs(out=str(seg), **TINY))
    finetune("classify", FinetuneArgs(out=str(clf), **TINY))
    assert read_info(seg)["labels"] and read_info(clf)["labels"] == ["CT", "MRI", "X-Ray", "lesion", "no lesion"]
    record = load_dataset("embedded", split="test", n=4)[0]
    image = load_image(record.image_paths[0])
    segment = build_tool("segment", engine="sam", model=str(seg))
    out = segment([image], {"bbox": [60, 60, 120, 120]}, ToolContext())
    assert segment.engine.random_weights is False and "WARNING" not in out.text
    classify = build_tool("classify", engine="clip", model=str(clf))
    out = classify([image], {"labels": ["CT", "MRI", "X-Ray"]}, ToolContext())
    assert classify.engine.random_weights is False and "WARNING" not in out.text
    assert abs(sum(out.data["scores"].values()) - 1) < 1e-4


def test_out_that_is_not_a_tool_folder_is_never_replaced(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a trained tool folder"):
        finetune("ground", FinetuneArgs(out=str(tmp_path), **TINY))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_cli_trains_and_bad_input_is_a_prog_error(tmp_path, capsys):
    from tool_backends.finetune.__main__ import main

    assert main(["ground", "--out", str(tmp_path / "g"), "--max-images", "12", "--steps", "2",
                 "--val-split", "none", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "load it with tools={'ground': {'engine': 'trained', 'path': " in out and "content hash" in out
    assert main(["ground", "--out", str(tmp_path / "x"), "--dataset", "nosuch", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "python -m tool_backends.finetune: error:" in err and "Traceback" not in err


# ---- the ``trained`` engines: built on first use, cached, safe to race -----------------------
TRAINED = {"steps": 2, "dataset_options": {"n": 48}, "val_options": {"n": 8}}


def test_trained_engine_builds_once_then_loads_from_the_cache(tmp_path, monkeypatch, caplog, capsys):
    from tool_backends.finetune import cache

    monkeypatch.setenv("MEDVQA_CACHE", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="tool_backends.finetune.cache"):
        tb = Toolbox.from_config({"ground": {"engine": "trained", **TRAINED}}, cache=False)
    assert "training it now on embedded/train" in caplog.text and "trained in" in caplog.text
    assert "medvqa-tools build ground --out DIR --dataset-opt n=48 --val-opt n=8 --steps 2" in caplog.text
    assert "ground: held-out macro-F1" in caplog.text
    assert "building ground: 100%" in capsys.readouterr().err  # the build's progress bar, as the command shows it
    (folder,) = (tmp_path / "tools").glob("ground-embedded-train-seed0-*")
    assert read_info(folder)["steps"] == 2
    record = load_dataset("embedded", split="test", n=4)[0]
    out = tb.call(ToolCall("ground", {"text": "lesion"}), [load_image(record.image_paths[0])], ToolContext()).result
    assert "WARNING" not in out.text and out.data["random_weights"] is False
    tb.close()

    def no_training(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr("tool_backends.finetune.finetune", no_training)
    again = Toolbox.from_config({"ground": {"engine": "trained", **TRAINED}}, cache=False)  # no second training
    again.close()
    assert cache.trained_folder("ground", "embedded", "train", TRAINED["dataset_options"], TRAINED["val_options"],
                                steps=2) == folder


RACE = """
import json, sys
from tool_backends.finetune.cache import trained_folder
folder = trained_folder("ground", dataset_options={"n": 48}, val_options={"n": 8}, steps=2, seed=1)
print(json.dumps({"folder": str(folder)}))
"""


def test_racing_first_builds_train_once_and_agree(tmp_path):
    env = {"MEDVQA_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", RACE], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    folders = {json.loads(o[0].strip().splitlines()[-1])["folder"] for o in outs}
    assert len(folders) == 1
    logs = "".join(o[1] for o in outs)
    assert logs.count("training it now") == 1, logs[-3000:]  # the other process waited, then loaded it
    assert [p.name for p in (tmp_path / "tools").iterdir() if not p.name.startswith(".")] == [Path(folders.pop()).name]


# ---- held-out quality -----------------------------------------------------------------------
PRESENCE = re.compile(r"Is there a lesion in the (.*)\?")


def _presence_accuracy(toolbox, records) -> float:
    right = []
    for r in records:
        host = PRESENCE.match(r.question).group(1)
        out = toolbox.call(ToolCall("ground", {"text": f"{host} lesion"}), [load_image(r.image_paths[0])],
                           ToolContext(annotations=r.annotations)).result
        right.append(("yes" if out.data.get("boxes") else "no") == r.answer)
    return float(np.mean(right))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about a CPU minute and a half; a shared, loaded box stretches the wall time
def test_trained_ground_beats_classical_on_held_out_presence_questions(tmp_path):
    out = tmp_path / "ground"
    finetune("ground", FinetuneArgs(out=str(out), steps=QUALITY_STEPS, batch_size=8, val_opt=["n=200"], torch_threads=1))
    records = [r for r in load_dataset("embedded", split="test") if r.question_type == "PRES"]
    assert len(records) == 64
    trained = Toolbox.from_config({"ground": {"engine": "centernet", "model": str(out)}}, cache=False)
    classical = Toolbox.from_config({"ground": {"engine": "classical"}}, cache=False)
    acc_trained, acc_classical = _presence_accuracy(trained, records), _presence_accuracy(classical, records)
    assert acc_trained >= acc_classical + MARGIN, (acc_trained, acc_classical)
    assert acc_trained >= FLOOR, acc_trained


QUALITY_STEPS = 300  # at batch 8 on the 200 default train images: about a CPU minute of training
MARGIN = 0.2
FLOOR = 0.8


def test_classify_flags_labels_outside_what_the_trained_engine_learned(tmp_path, caplog):
    """A trained classifier scores any label, but one it never learned ("normal") is named: in
    the model's text, in the env's info (``tool_calls[i]["data"]["unknown_labels"]``) and in one
    logged warning; known labels raise no flag, and an open-vocabulary engine never does."""
    clf = tmp_path / "clf"
    finetune("classify", FinetuneArgs(out=str(clf), **TINY))
    env = gym.make("MedVQA-v0", dataset="embedded", split="test", dataset_options={"n": 4},
                   tools={"classify": {"engine": "clip", "model": str(clf)}})
    env.reset(seed=0, options={"index": 0})
    call = '<tool_call>{"name": "classify", "arguments": {"labels": %s}}</tool_call>'
    with caplog.at_level(logging.WARNING, logger="tool_backends.classify"):
        obs, *_, info = env.step(call % '["normal", "lesion"]')
        obs2, *_, info2 = env.step(call % '["normal", "no lesion"]')
    data = info["tool_calls"][0]["data"]
    assert data["unknown_labels"] == ["normal"]
    assert "'normal' is not among them" in obs["text"] and "no lesion" in obs["text"]
    assert info2["tool_calls"][0]["data"]["unknown_labels"] == ["normal"]
    warned = [r.getMessage() for r in caplog.records if "outside the labels it was trained on" in r.getMessage()]
    assert len(warned) == 1 and "'normal'" in warned[0]  # once per label, not once per call
    env.close()

    known = gym.make("MedVQA-v0", dataset="embedded", split="test", dataset_options={"n": 4},
                     tools={"classify": {"engine": "clip", "model": str(clf)}})
    known.reset(seed=0, options={"index": 0})
    obs, *_, info = known.step(call % '["lesion", "no lesion"]')
    assert info["tool_calls"][0]["data"]["unknown_labels"] == [] and "not among them" not in obs["text"]
    known.close()
