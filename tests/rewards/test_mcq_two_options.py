"""An MCQ answer that names two options chose neither: it is not read as the first one named."""

from __future__ import annotations

import pytest

from medvqa_env.records import AnswerType
from rewards import RewardInput, RuleReward
from rewards.normalize import parse_mcq_letter

OPTIONS = {"A": "CT", "B": "MRI", "C": "Ultrasound", "D": "X-ray"}


@pytest.mark.parametrize("text,named", [("CT and MRI", "AB"), ("both CT and MRI", "AB"),
                                        ("MRI or ultrasound", "BC"), ("X-ray, then CT", "AD")])
def test_an_answer_naming_two_options_is_no_choice(text, named):
    assert parse_mcq_letter(text, OPTIONS) is None
    for letter in named:  # whichever of the two is the truth, the answer does not score as right
        sample = RewardInput(rf"\boxed{{{text}}}", text, letter, AnswerType.MCQ, options=OPTIONS, format_ok=True)
        assert RuleReward().score(sample).total == -1.0


def test_an_answer_naming_one_option_inside_a_sentence_chooses_it():
    assert parse_mcq_letter("it is an MRI of the head", OPTIONS) == "B"
    assert parse_mcq_letter("probably ultrasound", OPTIONS) == "C"
