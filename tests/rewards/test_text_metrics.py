"""BLEU-1 and ROUGE-1 against hand-computed values."""

from __future__ import annotations

import math

import pytest

from rewards.text_metrics import bleu1, lexical_scores, rouge1, tokenize


def test_tokenisation_is_lowercase_alphanumeric():
    assert tokenize("The Left-lower lobe, 3cm!") == ("the", "left", "lower", "lobe", "3cm")


def test_bleu1_hand_values():
    # candidate "mass in liver" vs reference "a mass in the liver": 3/3 unigrams match,
    # brevity penalty exp(1 - 5/3)
    assert bleu1("mass in liver", "a mass in the liver") == pytest.approx(math.exp(1 - 5 / 3))
    # longer candidate: no brevity penalty; clipped precision 2/4 ("liver" counted once)
    assert bleu1("liver liver left lobe", "left liver") == pytest.approx(2 / 4)
    assert bleu1("kidney", "liver") == 0.0
    assert bleu1("", "liver") == 0.0 and bleu1("liver", "") == 0.0


def test_rouge1_hand_values():
    # P = 2/3, R = 2/2 -> F = 0.8
    assert rouge1("left lung base", "left lung") == pytest.approx(0.8)
    assert rouge1("Left, LUNG", "left lung") == pytest.approx(1.0)
    assert rouge1("", "liver") == 0.0


def test_batch_matches_single_calls():
    cands, refs = ["a b", "left lung", "a b"], ["a b c", "lung", "a b c"]
    b, r = lexical_scores(cands, refs)
    assert b == [bleu1(c, x) for c, x in zip(cands, refs)]
    assert r == [rouge1(c, x) for c, x in zip(cands, refs)]
    with pytest.raises(ValueError, match="as many candidates"):
        lexical_scores(["a"], [])


def _answer_pairs(n: int = 400):
    """Pairs of real open answers (VQA-RAD when present) plus edge cases: repeats, punctuation, empty."""
    import random
    from pathlib import Path

    from rewards.validity import load_open_answers

    root = Path(__file__).resolve().parents[3] / "shared" / "data" / "vqa_rad"
    answers = [a for _, a in load_open_answers(root, None)] if (root / "qa.jsonl").is_file() else []
    answers += ["left lower lobe", "the left lower lobe", "liver liver", "Left-lower lobe,", "3cm mass", "t2",
                "", " ", "!!", "no", "right kidney", "mass in the pancreas", "pancreas mass mass"]
    rng = random.Random(0)
    pairs = [(rng.choice(answers), rng.choice(answers)) for _ in range(n)]
    pairs += [(" ".join(rng.sample(answers, 3)), rng.choice(answers)) for _ in range(n // 4)]
    return pairs + [(a, a) for a in answers[:50]]


@pytest.mark.parametrize("stem", [False, True])
def test_equal_to_nltk_and_rouge_score_bit_for_bit(stem):
    import warnings

    from nltk.translate.bleu_score import sentence_bleu
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=stem)
    for cand, ref in _answer_pairs():
        c, r = list(tokenize(cand, stem)), list(tokenize(ref, stem))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected_bleu = float(sentence_bleu([r], c, weights=(1.0,))) if c and r else 0.0
        assert bleu1(cand, ref, stem) == expected_bleu, (cand, ref)
        assert rouge1(cand, ref, stem) == scorer.score(ref, cand)["rouge1"].fmeasure, (cand, ref)
