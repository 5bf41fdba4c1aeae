"""Rule rewards (seed 000 §4.1): one \\boxed{} answer, MCQ letters, yes/no normalisation."""

from __future__ import annotations

import pytest

from medvqa_env.parser import parse_action
from medvqa_env.records import AnswerType
from rewards import RewardInput, RuleReward
from rewards.normalize import normalize_yes_no, parse_mcq_letter

OPTIONS = {"A": "CT", "B": "MRI", "C": "Ultrasound", "D": "X-ray"}


def _sample(completion: str, truth: str, kind: AnswerType, options=None) -> RewardInput:
    parsed = parse_action(completion)
    return RewardInput(completion, parsed.answer, truth, kind, options=options or {}, format_ok=parsed.format_ok)


@pytest.mark.parametrize("completion,expected", [
    (r"<think>ok</think> \boxed{yes}", 1.0),
    (r"\boxed{yes} and also \boxed{no}", -1.0),      # two final answers: format broken
    (r"\boxed{yes} \boxed{yes}", -1.0),              # even when they agree
    ("yes", -1.0),                                    # no \boxed{} at all
])
def test_exactly_one_boxed_answer(completion, expected):
    assert RuleReward().score(_sample(completion, "yes", AnswerType.CLOSED)).total == expected


@pytest.mark.parametrize("text", ["B", "(B)", "B.", "b)", "option B", "Option: (b)", "The answer is B",
                                  "B. MRI", "(B) MRI", "MRI", "mri", "I choose option B because",
                                  "answer: B"])
def test_mcq_letter_variants_parse_to_b(text):
    assert parse_mcq_letter(text, OPTIONS) == "B"
    assert RuleReward().score(_sample(rf"\boxed{{{text}}}", "B", AnswerType.MCQ, OPTIONS)).total == 1.0


@pytest.mark.parametrize("text", ["E", "(E)", "both CT and MRI", "", "none"])
def test_mcq_unparseable_or_ambiguous_is_wrong(text):
    assert parse_mcq_letter(text, OPTIONS) is None or parse_mcq_letter(text, OPTIONS) != "B"
    assert RuleReward().score(_sample(rf"\boxed{{{text}}}", "B", AnswerType.MCQ, OPTIONS)).total == -1.0


@pytest.mark.parametrize("text", ["a mass in the liver", "the answer is a mass in the liver",
                                  "answer: a mass in the liver", "Answer is a lesion", "the answer is i think CT",
                                  "Option: a mass in the liver", "choice - a mass in the liver",
                                  "my choice is a lesion", "the best option is i think CT"])
def test_the_article_a_is_not_option_a(text):
    options = {"A": "liver", "B": "spleen"} if "liver" not in text else {"A": "kidney", "B": "spleen"}
    assert parse_mcq_letter(text, options) is None
    assert RuleReward().score(_sample(rf"\boxed{{{text}}}", "A", AnswerType.MCQ, options)).total == -1.0
    # a letter is still a letter, and the option text still counts
    assert parse_mcq_letter("the answer is A because", options) == "A"
    assert parse_mcq_letter("answer: (a) mass", options) == "A"
    assert parse_mcq_letter("a mass in the spleen", options) == "B"
    assert parse_mcq_letter("option a", options) == parse_mcq_letter("Option: (a) mass", options) == "A"
    assert parse_mcq_letter("choice B) spleen", options) == "B"


def test_mcq_truth_given_as_option_text():
    sample = _sample(r"\boxed{(D)}", "X-ray", AnswerType.MCQ, OPTIONS)
    assert RuleReward().score(sample).total == 1.0


@pytest.mark.parametrize("text,expected", [
    ("yes", "yes"), ("Yes.", "yes"), ("YES!", "yes"), ("true", "yes"), ("True", "yes"), ("present", "yes"),
    ("Present.", "yes"), ("no", "no"), ("No.", "no"), ("FALSE", "no"), ("absent", "no"), ("Absent!", "no"),
    ("not present", "no"), ("Yes, there is a mass", "yes"), ("no evidence of bleeding", "no"),
    ("maybe", None), ("liver", None), ("", None),
])
def test_yes_no_normalisation(text, expected):
    assert normalize_yes_no(text) == expected


def test_closed_reward_uses_normalisation():
    r = RuleReward()
    assert r.score(_sample(r"\boxed{Present.}", "yes", AnswerType.CLOSED)).total == 1.0
    assert r.score(_sample(r"\boxed{absent}", "Yes", AnswerType.CLOSED)).total == -1.0
    out = r.score(_sample(r"\boxed{FALSE}", "no", AnswerType.CLOSED))
    assert out.total == 1.0 and out.components == {"accuracy": 1.0, "format": 1.0}


def test_missing_answer_scores_incorrect():
    out = RuleReward().score(RewardInput("", None, "yes", AnswerType.CLOSED, format_ok=False))
    assert out.total == -1.0 and out.components["accuracy"] == 0.0
