"""One answer rule for every consumer (issue 27): a record is scored the same by the env's reward,
the evaluation, verl's reward function and the TRL hook, alternatives credited everywhere by
default, and the oracle agent answers from the dataset exactly as the env has it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from answer_book import AnswerBook
from medvqa_env.records import AnswerType, VQADataset, VQARecord

# (record id, answer type, gold, accepted alternatives, the answer given, right?)
CASES = [
    ("alt_open", "OPEN", "septic cerebral emboli", ["mass"], "mass", True),          # VQA-Med's '#'
    ("alt_closed", "CLOSED", "yes", ["present"], "Yes.", True),
    ("zh_exact", "OPEN", "肺", [], "肺。", True),                                    # full-width stop
    ("zh_near", "OPEN", "左肺", [], "右肺", False),
    ("zh_closed", "CLOSED", "是", [], "是的！", True),
    ("es_open", "OPEN", "pulmón izquierdo", [], "Pulmón izquierdo.", True),
    ("es_wrong", "OPEN", "pulmón izquierdo", [], "hígado", False),
    ("mcq", "MCQ", "B", [], "(b) MRI", True),
    # issue 41: SLAKE-zh's echoed CLOSED golds, sentence answers in both languages, full-width OPEN text
    ("zh_echo", "CLOSED", "包含", [], "是", True),
    ("zh_echo_no", "CLOSED", "不可以", [], "否。", True),
    ("zh_echo_wrong", "CLOSED", "不存在", [], "是的", False),
    ("zh_sentence", "CLOSED", "是", [], "是的，肝脏有病变。", True),
    ("en_sentence_wrong", "CLOSED", "no", [], "Yes, there is one.", False),
    ("closed_alt_second", "CLOSED", "左侧", ["left"], "Left.", True),      # an either-or gold, its alternative
    ("open_fullwidth", "OPEN", "CT", [], "ＣＴ", True),
    ("mcq_wrong", "MCQ", "B", [], "A", False),
]
EXACT_MATCH = {"zh_echo": False, "zh_echo_no": False}
"""Where normalised exact match and the rule differ: an echoed predicate is right, not the same text."""


def _dataset(root: Path) -> VQADataset:
    root.mkdir(parents=True, exist_ok=True)
    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype("uint8")).save(root / "img.png")
    records = []
    for rid, kind, gold, alternatives, _, _ in CASES:
        records.append(VQARecord(rid, (str(root / "img.png"),), f"Question {rid}?", gold, kind, "mixed",
                                 options={"A": "CT", "B": "MRI"} if kind == "MCQ" else {},
                                 metadata={"answer_alternatives": alternatives} if alternatives else {}))
    return VQADataset(records, "mixed")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return _dataset(tmp_path_factory.mktemp("one_rule"))


def _env_scores(dataset):
    from medvqa_env.env import MedVQAEnv

    env = MedVQAEnv(dataset=dataset, tools=[], reward="default")
    out = {}
    for i, (rid, *_, given, _) in enumerate(CASES):
        env.reset(seed=0, options={"index": i})
        _, reward, _, _, info = env.step(f"\\boxed{{{given}}}")
        out[rid] = (reward, info["correct"])
    env.close()
    return out


def _eval_rows(dataset, agent, tmp_path):
    from eval.runner import EvalConfig, evaluate

    config = EvalConfig(workers=0, tools=[], reward="default", progress=False, bootstrap=0)
    evaluate(agent, dataset, config, out_dir=tmp_path)
    return {r["record_id"]: r for r in map(json.loads, (tmp_path / "episodes.jsonl").read_text().splitlines())}


def test_every_consumer_gives_one_record_the_same_score(dataset, tmp_path, monkeypatch):
    from train.trl_hook import EnvReward
    from train.verl_integration import reward as verl_reward
    from train.verl_integration.data import record_to_row

    monkeypatch.setattr(verl_reward, "_REWARDS", {})  # a fresh process-wide reward: thresholds at their start
    env = _env_scores(dataset)
    rows = _eval_rows(dataset, AnswerBook({rid: given for rid, *_, given, _ in CASES}), tmp_path / "eval")
    trl = EnvReward({"dataset": dataset, "tools": [], "reward": "default"})(
        [None] * len(CASES), [f"\\boxed{{{c[4]}}}" for c in CASES], record_index=list(range(len(CASES))))
    for i, (rid, kind, gold, alternatives, given, right) in enumerate(CASES):
        record = dataset[i]
        extra = record_to_row(record, i, "system", image_mode="none")["extra_info"]
        verl = verl_reward.compute_score(f"medvqa/{record.dataset}", f"\\boxed{{{given}}}", gold, extra)
        reward, correct = env[rid]
        assert correct is right and rows[rid]["correct"] is right and bool(verl["acc"]) is right, rid
        if kind != "MCQ":  # an option named by its letter and text is right, not an exact match
            assert rows[rid]["exact_match"] is EXACT_MATCH.get(rid, right), rid
        assert rows[rid]["reward"] == pytest.approx(reward, abs=1e-6), rid
        assert verl["score"] == pytest.approx(reward, abs=1e-6), rid
        assert trl[i] == pytest.approx(reward, abs=1e-6), rid
        if kind != "OPEN":
            assert reward == (1.0 if right else -1.0), rid
        elif right:
            assert reward > 0.9, rid  # the best alternative, not the record's first answer
        else:
            assert reward < 0.5, rid
    assert rows["alt_open"]["reward_components"]["alternative"] == 1.0


def test_the_oracle_answers_the_dataset_the_env_has(tmp_path, capsys):
    """``--agent oracle`` reads the evaluated dataset itself, with its options (``on_invalid=skip``):
    it needs no second ``dataset=`` (which is refused) and is right on every question."""
    from eval.run import main

    ds = _dataset(tmp_path / "data")
    manifest = tmp_path / "data" / "qa.jsonl"
    rows = [{**r.to_dict(), "image_paths": ["img.png"]} for r in ds]
    rows.append({"id": "broken", "image_paths": ["img.png"], "question": "Q?", "answer": "。", "answer_type": "OPEN"})
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    base = ["--agent", "oracle", "--dataset", str(manifest), "--dataset-opt", "on_invalid=skip", "--workers", "0",
            "--no-progress", "--bootstrap", "0", "--tools", "none", "--no-open-metrics"]
    assert main([*base, "--out", str(tmp_path / "run")]) == 0
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == len(CASES) and all(e["correct"] and e["reward"] == 1.0 for e in episodes)
    skipped = [json.loads(line) for line in (tmp_path / "run" / "skipped_records.jsonl").read_text().splitlines()]
    assert [(s["record_id"], s["where"]) for s in skipped] == [("broken", f"line {len(CASES) + 1}")]
    assert "empty answer once normalised" in skipped[0]["reason"]
    assert main([*base, "--out", str(tmp_path / "run2"), "--agent-opt", f"dataset={manifest}"]) == 2
    assert "the oracle reads the evaluated dataset" in capsys.readouterr().err
