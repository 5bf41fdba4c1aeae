"""Edges of answer matching that mutation testing found unguarded (benchmarks/mutation.py):
``exact_match`` on its own, an option whose text holds another's, an option with no text."""

from __future__ import annotations

import pytest

from rewards.normalize import exact_match, normalize_text, parse_mcq_letter


@pytest.mark.parametrize("prediction,truth,same", [
    ("The liver.", "liver", True),               # case, punctuation and articles do not count
    ("a mass", "the mass", True),
    ("liver", "spleen", False),                  # neither is yes/no: only the text decides
    ("present", "yes", True),                    # yes/no synonyms fold
    ("yes, there is", "yes", True),
    ("absent", "yes", False),
    ("present", "liver", False),                 # a yes-word against a non-yes/no truth
    (None, "yes", False),                        # no answer matches nothing
    (None, "none", False),
])
def test_exact_match(prediction, truth, same):
    assert exact_match(prediction, truth) is same


def test_articles_become_a_single_space():
    assert normalize_text("The  liver, a  lobe") == "liver lobe"


def test_an_option_whose_text_holds_another_is_chosen_by_its_whole_text():
    options = {"A": "mass", "B": "mass effect"}
    assert parse_mcq_letter("mass effect", options) == "B"
    assert parse_mcq_letter("Mass.", options) == "A"


def test_an_option_with_no_text_is_never_contained():
    assert parse_mcq_letter("a CT scan", {"A": "CT", "B": "?"}) == "A"
