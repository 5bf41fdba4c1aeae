"""Issue 41, item 3: every archive's CLOSED golds scored right, in every language it ships.

SLAKE-zh answers yes/no questions by echoing the predicate (包含吗？ -> 包含 / 不包含), and a third
of its CLOSED test golds are such echoes: 是/否 must score right against them. Sentence answers are
read by their first clause in Chinese as in English. The records are written here in the shapes of
SLAKE's JSON and of VQA-Med 2019's pipe-separated test file (hand-written, not copied from either
set) and go through the real loaders."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from medvqa_env.records import AnswerType
from rewards.base import RewardInput
from rewards.matching import matches
from rewards.normalize import normalize_yes_no
from rewards.rule import RuleReward

# (question, gold) in SLAKE-zh's shape: CLOSED questions answered by their echoed predicate
SLAKE_ZH = [  # (question, gold, what the gold means)
    ("这张图片包含肝脏吗？", "包含", "yes"), ("这张图片包含肾脏吗？", "不包含", "no"),
    ("可以在这张图片中看到心脏吗？", "可以", "yes"), ("可以在这张图片中看到大脑吗？", "不可以", "no"),
    ("图中存在肺部肿块吗？", "存在", "yes"), ("图中存在积液吗？", "不存在", "no"),
    ("这张图片看起来正常吗？", "正常", "yes"), ("这个器官看起来正常吗？", "不正常", "no"),
    ("左肺有病变吗？", "有", "yes"), ("右肺有结节吗？", "没有", "no"),
    ("这是一张CT图像吗？", "是", "yes"), ("这是一张MRI图像吗？", "否", "no"),
    ("肝脏是否健康？", "健康", "yes"), ("这个病灶位于左侧吗？", "不对", "no"),
]


def _write_slake(root, rows):
    (root / "imgs" / "xmlab1").mkdir(parents=True)
    Image.fromarray(np.full((16, 16, 3), 90, np.uint8)).save(root / "imgs" / "xmlab1" / "source.jpg")
    entries = [{"img_id": 1, "img_name": "xmlab1/source.jpg", "question": q, "answer": a, "answer_type": "CLOSED",
                "q_lang": "zh", "modality": "CT", "location": "腹部", "content_type": "器官", "base_type": "vqa",
                "qid": 9000 + i} for i, (q, a, _) in enumerate(rows)]
    entries.append({"img_id": 1, "img_name": "xmlab1/source.jpg", "question": "Is this a CT?", "answer": "Yes",
                    "answer_type": "CLOSED", "q_lang": "en", "qid": 8999})
    (root / "test.json").write_text(json.dumps(entries, ensure_ascii=False), encoding="utf-8")


@pytest.fixture()
def slake_zh(tmp_path):
    from medvqa_env.datasets.slake import load_slake

    _write_slake(tmp_path, SLAKE_ZH)
    ds = load_slake("test", root=tmp_path, lang="zh")
    assert len(ds) == len(SLAKE_ZH) and all(r.answer_type is AnswerType.CLOSED for r in ds)
    return ds


def _rule(answer, record):
    return RuleReward().score(RewardInput(f"\\boxed{{{answer}}}", answer, record.answer, record.answer_type,
                                          record.options, True, dict(record.metadata))).total


def test_slake_zh_closed_golds_score_shi_and_fou_right(slake_zh):
    for record, (_, gold, meaning) in zip(slake_zh, SLAKE_ZH):
        assert record.answer == gold
        right, wrong = ("是", "否") if meaning == "yes" else ("否", "是")
        assert _rule(right, record) == 1.0, (record.question, gold, right)
        assert _rule(wrong, record) == -1.0, (record.question, gold, wrong)
        # English answers to a Chinese question are judged the same way
        assert _rule("Yes" if meaning == "yes" else "No", record) == 1.0, gold
        assert _rule(gold, record) == 1.0  # the echo itself
        assert normalize_yes_no(gold, closed=True) == meaning
    accuracy = sum(_rule("是" if meaning == "yes" else "否", r) == 1.0
                   for r, (_, _, meaning) in zip(slake_zh, SLAKE_ZH)) / len(slake_zh)
    assert accuracy == 1.0  # was 5 / 14: only 是/否/有/没有/不对 folded


@pytest.mark.parametrize("gold, answer, right", [
    ("包含", "不包含", False), ("不可以", "可以", False), ("存在", "不存在", False), ("正常", "不正常", False),
    ("不包含", "没有", True), ("可以", "有", True), ("存在", "是的", True), ("不正常", "不是", True),
    ("对", "错", False), ("不对", "错误", True),
])
def test_echoed_predicates_pair_with_each_other_and_with_shi_fou(gold, answer, right):
    assert matches(answer, gold, AnswerType.CLOSED) is right


@pytest.mark.parametrize("answer, gold, right", [
    ("是的，肝脏有病变。", "是", True), ("是的，图中包含肝脏", "包含", True), ("不，没有看到结节", "没有", True),
    ("不，图中不包含肾脏", "包含", False), ("是的，在左肺", "否", False), ("有，在右下叶", "有", True),
    ("Yes, the liver is included.", "包含", True), ("No, it is not.", "不存在", True),
    ("Yes, there is a lesion", "yes", True), ("No, it looks normal.", "no", True),
])
def test_sentence_answers_read_by_their_first_clause_in_both_languages(answer, gold, right):
    assert matches(answer, gold, AnswerType.CLOSED) is right


def test_the_echoed_predicates_stay_words_in_open_answers():
    """正常 answers "how does it look?" as a word, not a yes: only CLOSED folds the echoes."""
    assert not matches("是", "正常", AnswerType.OPEN) and matches("正常。", "正常", AnswerType.OPEN)
    assert normalize_yes_no("包含") is None and normalize_yes_no("是左肺", closed=True) is None
    # no opposite pair folds alike: 异常 (abnormal) is not an echo of 正常
    assert not matches("异常", "正常", AnswerType.CLOSED)


def test_vqamed_2019_shaped_closed_and_open_answers(tmp_path):
    """VQA-Med 2019's test file shape (image|category|question|answer, '#' alternatives): yes/no
    abnormality questions are CLOSED and a sentence answer "Yes, ..." is right; open answers take
    any accepted alternative."""
    from eval.scoring import score_episode
    from medvqa_env.datasets.vqamed import load_vqamed

    folder = tmp_path / "VQAMed2019Test"
    (folder / "VQAMed2019_Test_Images").mkdir(parents=True)
    for name in ("synpic1", "synpic2", "synpic3"):
        Image.fromarray(np.full((16, 16, 3), 120, np.uint8)).save(folder / "VQAMed2019_Test_Images" / f"{name}.jpg")
    (folder / "VQAMed2019_Test_Questions_w_Ref_Answers.txt").write_text(
        "synpic1|abnormality|is this image abnormal?|yes\n"
        "synpic2|abnormality|does this image look normal?|no\n"
        "synpic3|modality|what modality was used?|ct w/contrast (iv)#ct with iv contrast\n", encoding="utf-8")
    ds = load_vqamed("test", root=tmp_path, edition=2019)
    kinds = [r.answer_type for r in ds]
    assert kinds == [AnswerType.CLOSED, AnswerType.CLOSED, AnswerType.OPEN]
    given = {0: ("Yes, the image is abnormal.", True), 1: ("No, it does not.", True), 2: ("ct with iv contrast", True)}
    for i, (answer, right) in given.items():
        assert score_episode(ds[i], answer, True)["correct"] is right, (i, answer)
    assert score_episode(ds[0], "No, it is normal.", True)["correct"] is False
    assert _rule("Yes, the image is abnormal.", ds[0]) == 1.0 and _rule("No.", ds[0]) == -1.0
