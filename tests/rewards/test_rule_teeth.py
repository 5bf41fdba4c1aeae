"""Issue 41, "the one answer rule has teeth": each branch of :mod:`rewards.matching` and of the
normalisation it stands on is pinned by a case whose verdict a one-line change would flip
(``benchmarks/mutation.py --only rewards/matching.py`` runs these against every mutant). Fast, no
models: the consumers' own paths are covered in ``tests/eval/test_one_answer_rule.py`` and
``tests/rewards/test_armed_normalised.py``."""

from __future__ import annotations

import pytest

from medvqa_env.records import AnswerType
from rewards.base import RewardInput
from rewards.matching import answer_matches, exact_match_any, matches, matches_one, references
from rewards.normalize import CLOSED_NO, CLOSED_YES, normalize_yes_no, semantic_text
from rewards.rule import ExactMatchReward, RuleReward

OPTIONS = {"A": "CT", "B": "MRI", "C": "X-ray"}


def test_references_put_the_gold_first_and_drop_repeats_and_empties():
    assert references("mass", {"answer_alternatives": ["emboli", "mass", "", ".", "emboli"]}) == ["mass", "emboli"]
    assert references("mass", None) == ["mass"] and references("mass", {"answer_alternatives": "lump"}) == ["mass", "lump"]


@pytest.mark.parametrize("answer, truth, right", [
    ("B", "B", True), ("(b)", "B", True), ("MRI", "B", True), ("option c", "C", True),
    ("A", "B", False), ("MRI", "A", False), ("nothing of the kind", "B", False), (None, "B", False),
    ("B", "MRI", True),   # a gold written as the option's text
    ("B", "b", True),     # a gold letter in lower case
    ("D", "D", False),    # a letter that is no option is never chosen
])
def test_mcq_compares_the_chosen_option_letter(answer, truth, right):
    assert matches_one(answer, truth, AnswerType.MCQ, OPTIONS) is right
    assert matches_one(answer, truth, "MCQ", OPTIONS) is right  # the answer type as a string


def test_mcq_without_options_is_never_right():
    assert matches_one("B", "B", AnswerType.MCQ, None) is False


@pytest.mark.parametrize("answer, truth, right", [
    ("yes", "yes", True), ("Yes.", "present", True), ("no", "yes", False), ("maybe", "yes", False),
    ("yes", "no", False), ("No evidence of it", "no", True), (None, "yes", False), ("", "no", False),
    ("是", "包含", True), ("否", "包含", False), ("不包含", "否", True), ("包含", "不包含", False),
    ("ct", "CT", True), ("MRI", "CT", False),      # an either-or CLOSED gold: exact match decides
    ("左", "左", True), ("右", "左", False),
])
def test_closed_folds_yes_and_no_else_compares_the_text(answer, truth, right):
    assert matches_one(answer, truth, AnswerType.CLOSED) is right


@pytest.mark.parametrize("answer, truth, right", [
    ("CT", "ct", True), ("ＣＴ", "CT", True), ("肺。", "肺", True), ("left lung", "right lung", False),
    ("yes", "present", True), ("是", "包含", False),   # only CLOSED questions fold the echoes
    (None, "lung", False), ("the", "lung", False), ("", "lung", False), ("。", "肺", False),
])
def test_open_is_normalised_exact_match(answer, truth, right):
    assert matches_one(answer, truth, AnswerType.OPEN) is right


def test_any_accepted_alternative_counts_for_every_answer_type():
    assert matches("mass", "emboli", AnswerType.OPEN, alternatives=["lump", "mass"])
    assert not matches("mass", "emboli", AnswerType.OPEN, alternatives=["lump"])
    assert matches("否", "no", AnswerType.CLOSED, alternatives=["不正常"]) and matches("C", "A", "MCQ", OPTIONS, ["C"])
    sample = RewardInput("\\boxed{mass}", "mass", "emboli", AnswerType.OPEN, metadata={"answer_alternatives": ["mass"]})
    assert answer_matches(sample) and not answer_matches(RewardInput("\\boxed{mass}", "mass", "emboli", AnswerType.OPEN))
    assert exact_match_any("Mass.", ["emboli", "mass"]) and not exact_match_any("lump", ["emboli", "mass"])
    assert not exact_match_any("mass", []) and not exact_match_any(None, ["mass"])


def test_rule_and_exact_match_rewards_read_the_rule_and_the_format():
    rule, em = RuleReward(), ExactMatchReward()
    right = RewardInput("\\boxed{是}", "是", "存在", AnswerType.CLOSED)
    badly = RewardInput("\\boxed{是}", "是", "存在", AnswerType.CLOSED, format_ok=False)
    wrong = RewardInput("\\boxed{否}", "否", "存在", AnswerType.CLOSED)
    assert [o.total for o in rule([right, badly, wrong])] == [1.0, -1.0, -1.0]
    assert [o.components["accuracy"] for o in rule([right, badly, wrong])] == [1.0, 1.0, 0.0]
    assert RuleReward(correct=2.0, incorrect=-0.5)([right, wrong])[1].total == -0.5
    assert RuleReward(correct=2.0, incorrect=-0.5)([right])[0].total == 2.0
    same = RewardInput("\\boxed{存在}", "存在", "存在", AnswerType.CLOSED)
    assert [o.total for o in em([right, same])] == [-1.0, 1.0]  # exact match: the text, not the echo


@pytest.mark.parametrize("text, closed, want", [
    ("包含", True, "yes"), ("包含", False, None), ("不包含", True, "no"), ("没有包含", True, "no"),
    ("可以", True, "yes"), ("不可以", True, "no"), ("存在", True, "yes"), ("不存在", True, "no"),
    ("正常", True, "yes"), ("不正常", True, "no"), ("异常", True, None), ("错", True, "no"), ("错误", True, "no"),
    ("是的", False, "yes"), ("是的，在左肺", False, "yes"), ("不，没有", False, "no"), ("是左肺", True, None),
    ("有，在左肺", False, "yes"), ("不包含，无", True, "no"), ("包含，有", False, None),
    ("yes", False, "yes"), ("No.", False, "no"), ("yes there is", False, "yes"), ("no evidence", False, "no"),
    ("correct answer is left", False, None), ("n/a", False, None), ("Y-shaped", False, None), (None, False, None),
    ("", True, None), ("。", True, None), ("Sí, claro", False, "yes"), ("present", True, "yes"),
])
def test_yes_no_folding(text, closed, want):
    assert normalize_yes_no(text, closed=closed) == want


def test_no_word_folds_both_ways():
    assert not CLOSED_YES & CLOSED_NO
    assert {"包含", "可以", "存在", "正常", "是的"} <= CLOSED_YES and {"不包含", "不可以", "不存在", "不正常"} <= CLOSED_NO


@pytest.mark.parametrize("text, want", [
    ("ＣＴ", "ct"), ("Left lung.", "left lung"), ("  left   lung  ", "left lung"), ("肺。", "肺"), ("（左肺）", "左肺"),
    ("left-lower lobe", "left-lower lobe"), ("...", ""), ("", ""), (None, ""), ("a.b", "a.b"), ("!x!", "x"),
    ("left lung .", "left lung"), ("( CT )", "ct"), ("。 肺", "肺"),
])
def test_semantic_text(text, want):
    assert semantic_text(text) == want
