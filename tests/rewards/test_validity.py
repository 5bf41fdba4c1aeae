"""Validity on real VQA-RAD open answers: ARMed separates paraphrases from other answers."""

from __future__ import annotations

import pytest

from rewards.armed import ARMedReward
from rewards.validity import build_pairs, evaluate, load_open_answers, paraphrases, roc_auc


def test_paraphrases_are_light_and_never_the_answer():
    ps = paraphrases("Small bowel")
    assert "small bowel" not in ps and "Small bowel" not in ps
    assert {"small bowels", "the small bowel", "bowel small"} <= ps
    assert paraphrases("") == set()


def test_roc_auc_hand_values():
    assert roc_auc([1, 2, 3], [0, 0]) == 1.0
    assert roc_auc([0], [1]) == 0.0
    assert roc_auc([1, 1], [1, 1]) == 0.5
    with pytest.raises(ValueError, match="both sides"):
        roc_auc([], [1])


@pytest.mark.data
def test_armed_beats_exact_match_on_vqa_rad(vqa_rad_root, minilm):
    answers = load_open_answers(vqa_rad_root, 60)
    assert len(answers) == 60 and all(a for _, a in answers)
    pairs = build_pairs(answers, negatives=2)
    auc = evaluate(pairs, ARMedReward(token_encoder=minilm))
    assert auc["armed"] > auc["exact_match"] and auc["armed"] > 0.9
    assert set(auc) >= {"bleu1", "rouge1", "bertscore", "cosine", "r_c", "r_as"}


@pytest.mark.data
def test_measure_counts_its_pairs_and_tables_every_scorer(vqa_rad_root):
    from rewards.validity import SCORERS, describe, measure, table

    result = measure(vqa_rad_root, 20, negatives=1)
    assert result["answers"] == 20
    assert result["other_pairs"]["positive"] > 20 and result["other_pairs"]["negative"] >= 19
    assert set(result["other"]) >= set(SCORERS) and set(result["near"]) >= set(SCORERS)
    rows = table(result).splitlines()[2:]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == list(SCORERS.values())
    assert f"{result['answers']} distinct OPEN answers" in describe(result, "cmd")
