"""Issue 41, item 5: two-class tools. ``medvqa-tools build classify`` and the classify tool work on
any label set of two or more (normal/pneumonia, yes/no, benign/malignant), the tool publishes the
labels it knows and matches ``x ray`` to its ``X-Ray``, and the tool-heuristic agent asks for those
labels -- or says that none fits. Real tiny CLIP training on images the test draws itself."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from medvqa_env.chat import Conversation
from tool_backends.base import ToolContext
from tool_backends.finetune import finetune
from tool_backends.finetune.classify import distractors
from tool_backends.finetune.common import FinetuneArgs, read_info

pytest.importorskip("torch")


@pytest.mark.parametrize("labels", [["normal", "pneumonia"], ["yes", "no"], ["benign", "malignant"], ["X-Ray", "CT"]])
def test_distractors_work_on_two_labels(labels):
    out = distractors(labels, np.random.default_rng(0), 8)  # raised ValueError on two one-word labels
    assert len(out) == len(set(out)) == 8 and not set(out) & set(labels)


def _two_class_manifest(root, labels=("normal", "pneumonia"), n=8):
    """Chest-X-ray-like pictures: a plain field (first label) or one with bright blotches (second)."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        grey = np.full((64, 64), 70, np.uint8) + rng.integers(0, 20, (64, 64), dtype=np.uint8)
        label = labels[i % 2]
        if i % 2:
            for _ in range(3):
                y, x = rng.integers(8, 56, 2)
                grey[y - 6:y + 6, x - 6:x + 6] = 230
        Image.fromarray(np.stack([grey] * 3, -1)).save(root / f"cxr{i}.png")
        rows.append({"id": f"cxr{i}", "image": f"cxr{i}.png", "question": f"Is there {labels[1]} in this chest x ray?",
                     "answer": "yes" if i % 2 else "no", "split": "train", "annotations": {"labels": [label]}})
    (root / "cxr.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "cxr.jsonl"


@pytest.fixture(scope="module")
def pneumonia_tool(tmp_path_factory):
    root = tmp_path_factory.mktemp("cxr")
    manifest = _two_class_manifest(root)
    out = root / "classify"
    finetune("classify", FinetuneArgs(out=str(out), dataset=str(manifest), split="train", steps=3, batch_size=4,
                                      val_split="none", progress=False))
    return out, manifest


def test_build_classify_on_two_labels_and_the_tool_answers(pneumonia_tool):
    from tool_backends.registry import build_tool

    folder, manifest = pneumonia_tool
    assert read_info(folder)["labels"] == ["normal", "pneumonia"]
    tool = build_tool("classify", engine="clip", model=str(folder))
    schema = tool.spec.parameters["properties"]["labels"]
    assert schema["items"]["examples"] == ["normal", "pneumonia"] and "['normal', 'pneumonia']" in tool.spec.description
    image = Image.open(manifest.parent / "cxr1.png").convert("RGB")
    out = tool([image], {"labels": ["normal", "pneumonia"]}, ToolContext())
    assert set(out.data["scores"]) == {"normal", "pneumonia"} and out.data["unknown_labels"] == []
    assert abs(sum(out.data["scores"].values()) - 1) < 1e-4 and "WARNING" not in out.text


def test_the_tool_matches_labels_without_case_spaces_or_punctuation(tmp_path):
    """'x ray' is the engine's 'X-Ray': asked with the engine's spelling, reported under the caller's."""
    from tool_backends.registry import build_tool

    root = tmp_path
    manifest = _two_class_manifest(root, labels=("CT", "X-Ray"), n=6)
    folder = root / "clf"
    finetune("classify", FinetuneArgs(out=str(folder), dataset=str(manifest), split="train", steps=2, batch_size=4,
                                      val_split="none", progress=False))
    tool = build_tool("classify", engine="clip", model=str(folder))
    image = Image.open(root / "cxr0.png").convert("RGB")
    spelled = tool([image], {"labels": ["x ray", "ct"]}, ToolContext())
    exact = tool([image], {"labels": ["X-Ray", "CT"]}, ToolContext())
    assert spelled.data["unknown_labels"] == [] and "WARNING" not in spelled.text
    assert list(spelled.data["scores"].values()) == pytest.approx(list(exact.data["scores"].values()), abs=1e-6)
    assert set(spelled.data["scores"]) == {"x ray", "ct"}


def test_the_heuristic_agent_asks_the_labels_the_tool_knows(pneumonia_tool):
    """The agent asked the two-class classifier for 'pneumonia chest x ray' (unknown to it) and
    'normal'; now it asks for 'pneumonia' against 'normal' and reads the verdict by those labels."""
    from agents.baselines import ToolThenAnswerAgent
    from eval.runner import EvalConfig, evaluate
    from medvqa_env.datasets import load_dataset

    folder, manifest = pneumonia_tool
    ds = load_dataset(str(manifest), split="train")
    out_dir = manifest.parent / "run"
    evaluate(ToolThenAnswerAgent(), ds, EvalConfig(workers=0, tools={"classify": {"engine": "clip", "model": str(folder)}},
                                                  progress=False, bootstrap=0), out_dir=out_dir)
    episodes = [json.loads(line) for line in (out_dir / "episodes.jsonl").read_text().splitlines()]
    calls = [c for e in episodes for turn in e["trace"] for c in turn.get("tool_calls", ())]
    assert calls and all(c["name"] == "classify" for c in calls)
    assert all(c["arguments"]["labels"] == ["pneumonia", "normal"] for c in calls), calls[0]["arguments"]
    assert all(not c["data"].get("unknown_labels") for c in calls)


def test_the_heuristic_agent_says_when_no_label_fits(pneumonia_tool):
    from agents.baselines import ToolThenAnswerAgent
    from medvqa_env.env import MedVQAEnv
    from medvqa_env.records import VQADataset, VQARecord

    folder, manifest = pneumonia_tool
    record = VQARecord("heart", (str(manifest.parent / "cxr0.png"),), "Is the heart enlarged?", "no", "CLOSED", "cxr")
    env = MedVQAEnv(VQADataset([record], "cxr"), tools={"classify": {"engine": "clip", "model": str(folder)},
                                                        "image_zoom_in": "local"})
    obs, info = env.reset(options={"index": 0})
    conversation = Conversation.start(obs, info)
    turn = ToolThenAnswerAgent().act(conversation)
    assert "classify knows the labels ['normal', 'pneumonia']; none of them fits this question" in turn
    assert '"name": "classify"' not in turn and '"name": "image_zoom_in"' in turn
    _, _, terminated, _, step_info = env.step(turn)
    assert not terminated and not step_info.get("format_errors"), step_info
    env.close()


@pytest.mark.parametrize("labels", [("yes", "no"), ("benign", "malignant")])
def test_medvqa_tools_build_classify_on_two_class_labels(tmp_path, capsys, labels):
    """The command the issue ran: ``medvqa-tools build classify`` on a two-class archive (it raised
    ValueError in distractors())."""
    from tool_backends.cli import main

    manifest = _two_class_manifest(tmp_path, labels=labels, n=4)
    out = tmp_path / "clf"
    code = main(["build", "classify", "--out", str(out), "--dataset", str(manifest), "--split", "train",
                 "--steps", "1", "--batch_size", "2", "--val_split", "none", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-800:]
    assert read_info(out)["labels"] == sorted(labels) and "Traceback" not in captured.err
