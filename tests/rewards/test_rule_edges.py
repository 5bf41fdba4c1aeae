"""Rule and exact-match rewards where mutation testing found no test (benchmarks/mutation.py): a wrong
MCQ letter, a CLOSED question whose truth is not yes/no, open answers, ``ExactMatchReward``."""

from __future__ import annotations

import pytest

from medvqa_env.records import AnswerType
from rewards import RewardInput, RuleReward
from rewards.rule import ExactMatchReward, answer_matches

OPTIONS = {"A": "CT", "B": "MRI"}


def _sample(answer, truth, kind, options=None, format_ok=True):
    return RewardInput(rf"\boxed{{{answer}}}", answer, truth, kind, options=options or {}, format_ok=format_ok)


@pytest.mark.parametrize("answer,truth,right", [("A", "B", False), ("CT", "B", False), ("B", "B", True),
                                                ("B", "MRI", True), ("MRI", "A", False)])
def test_an_mcq_answer_is_right_only_when_it_names_the_true_option(answer, truth, right):
    assert answer_matches(_sample(answer, truth, AnswerType.MCQ, OPTIONS)) is right
    assert RuleReward().score(_sample(answer, truth, AnswerType.MCQ, OPTIONS)).total == (1.0 if right else -1.0)


@pytest.mark.parametrize("answer,truth,right", [("right", "left", False), ("Left.", "left", True),
                                                ("no", "yes", False), ("positive", "yes", True)])
def test_a_closed_answer_is_compared_as_yes_no_or_else_as_text(answer, truth, right):
    assert answer_matches(_sample(answer, truth, AnswerType.CLOSED)) is right


@pytest.mark.parametrize("answer,truth,right", [("The liver.", "liver", True), ("spleen", "liver", False)])
def test_an_open_answer_is_an_exact_match_after_normalisation(answer, truth, right):
    assert RuleReward().score(_sample(answer, truth, AnswerType.OPEN)).total == (1.0 if right else -1.0)


def test_exact_match_reward_is_plus_one_only_for_a_right_answer_in_format():
    reward = ExactMatchReward()
    right, wrong, unformatted = reward([_sample("The liver.", "liver", AnswerType.OPEN),
                                        _sample("spleen", "liver", AnswerType.OPEN),
                                        _sample("liver", "liver", AnswerType.OPEN, format_ok=False)])
    assert (right.total, right.components) == (1.0, {"accuracy": 1.0, "format": 1.0})
    assert (wrong.total, wrong.components) == (-1.0, {"accuracy": 0.0, "format": 1.0})
    assert (unformatted.total, unformatted.components) == (-1.0, {"accuracy": 1.0, "format": 0.0})
