"""Scores that are right in every script the supported datasets use (issue 27): Unicode-aware
normalisation, BLEU-1/ROUGE-1 on characters for Chinese and on accented words for Spanish, golds
that normalise to nothing refused, and no BERTScore/cosine from an encoder that reads the answer
as ``[UNK]``. Real MiniLM, real metric libraries."""

from __future__ import annotations

import logging

import pytest

from medvqa_env.errors import ConfigError, DatasetError
from medvqa_env.records import AnswerType, VQARecord
from rewards.base import RewardInput
from rewards.matching import matches
from rewards.normalize import exact_match, normalize_text, normalize_yes_no
from rewards.rule import RuleReward
from rewards.text_metrics import bleu1, rouge1, tokenize


@pytest.mark.parametrize("text, normalised", [
    ("肺。", "肺"), ("（左肺）", "左肺"), ("左 肺！", "左肺"), ("是的，", "是的"), ("肝：", "肝"),
    ("ＭＲＩ？", "mri"), ("¿Pulmón izquierdo?", "pulmón izquierdo"), ("«hígado»", "hígado"),
    ("Left-lower lobe, the", "leftlower lobe"),  # ASCII: as before
])
def test_every_unicode_punctuation_class_is_stripped_after_nfkc(text, normalised):
    assert normalize_text(text) == normalised


def test_a_right_chinese_answer_with_full_width_punctuation_matches():
    assert exact_match("肺。", "肺") and exact_match("是的！", "是")
    assert not exact_match("右肺", "左肺") and not exact_match("肝", "肺")
    rule = RuleReward()
    for answer, total in (("是。", 1.0), ("否！", -1.0), ("有", 1.0)):
        assert rule.score(RewardInput(f"\\boxed{{{answer}}}", answer, "是", AnswerType.CLOSED)).total == total
    assert normalize_yes_no("没有") == "no" and normalize_yes_no("Sí.") == "yes"


@pytest.mark.parametrize("answer", ["", "the", ".", "。"])
@pytest.mark.parametrize("kind", [AnswerType.CLOSED, AnswerType.OPEN])
def test_an_answer_that_normalises_to_nothing_matches_nothing(answer, kind):
    assert not matches(answer, ".", kind)
    assert RuleReward().score(RewardInput(f"\\boxed{{{answer}}}", answer, ".", kind)).total == -1.0


@pytest.mark.parametrize("gold", [".", "。", "?!", "（）"])
def test_a_gold_that_normalises_to_nothing_is_invalid_data(gold):
    with pytest.raises(DatasetError, match="empty answer once normalised"):
        VQARecord("q1", ("x.png",), "Q?", gold, "OPEN", "d")
    assert VQARecord("q2", ("x.png",), "Blood group?", "A", "OPEN", "d").answer == "A"  # an article alone stays


def test_lexical_metrics_count_chinese_characters_and_accented_words():
    assert tokenize("左肺。") == ("左", "肺") and tokenize("pulmón izquierdo") == ("pulmón", "izquierdo")
    assert (bleu1("肺", "肺"), rouge1("肺", "肺")) == (1.0, 1.0)  # was 0: the tokeniser kept [a-z0-9] only
    assert (bleu1("右肺", "左肺"), rouge1("右肺", "左肺")) == (0.5, 0.5)
    assert (bleu1("肝", "肺"), rouge1("肝", "肺")) == (0.0, 0.0)
    assert rouge1("pulmón derecho", "pulmón izquierdo") == 0.5
    assert rouge1("pulmón", "pulmones") == 0.0  # "pulm n" shared "pulm" before


def test_english_tokens_stay_rouge_scores():
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1"])
    for text in ("Left-lower lobe,", "T2-weighted MRI (axial)", "no", "3.5 cm"):
        assert tokenize(text) == tuple(scorer._tokenizer.tokenize(text))


@pytest.fixture(scope="module")
def armed():
    from rewards.armed import ARMedReward

    return ARMedReward()


def _score(reward, answer, gold):
    return reward([RewardInput(f"\\boxed{{{answer}}}", answer, gold, AnswerType.OPEN)])[0]


@pytest.mark.parametrize("gold, right, near, wrong", [("肺", "肺。", "肺门", "肝"), ("左肺", "左肺", "右肺", "肝"),
                                                      ("pulmón izquierdo", "Pulmón izquierdo.", "pulmón derecho", "hígado")])
def test_armed_ranks_gold_over_near_miss_over_wrong(armed, gold, right, near, wrong):
    scores = [_score(armed, a, gold).total for a in (right, near, wrong)]
    assert scores[0] > scores[1] > scores[2], scores


def test_an_encoder_that_cannot_read_the_reference_gives_no_semantic_score(armed, caplog):
    """MiniLM reads 肺 and 肝 both as [UNK] (cosine 1.0 between them): the reward leaves BERTScore
    and cosine out and says so, or refuses with uncovered='error'."""
    from rewards.armed import ARMedReward

    assert armed.covered(["肺", "left lung", "pulmón"]) == [False, True, True]
    bert, cos = armed.semantic_scores(["肝", "liver"], ["肺", "left lung"])
    assert bert[0] is None and cos[0] is None and 0 <= bert[1] < 1
    out = _score(armed, "肝", "肺")
    c = out.components
    assert c["semantic"] == 0.0 and "bertscore" not in c and "cosine" not in c
    # R_c (0 here) stands in for both raw similarities, squashed around the thresholds in force
    from rewards.adaptive import squash

    b_ad, c_ad = squash(0.0, c["threshold_bertscore"], 5.0, 5.0), squash(0.0, c["threshold_cosine"], 5.0, 5.0)
    assert (c["bertscore_adapt"], c["cosine_adapt"]) == pytest.approx((b_ad, c_ad))
    assert out.total == pytest.approx(2 * (0.4 * 0.0 + 0.4 * (0.2 * b_ad + 0.8 * c_ad) + 0.2) - 1)
    strict = ARMedReward(uncovered="error", token_encoder=armed._encoders()[0])
    with pytest.raises(ConfigError, match="has no vocabulary for 1 answer\\(s\\) or reference\\(s\\).*'肺'"):
        _score(strict, "肝", "肺")


def test_uncovered_references_stay_out_of_the_adaptive_buffers(armed):
    from rewards.armed import ARMedReward

    reward = ARMedReward(token_encoder=armed._encoders()[0])
    reward([RewardInput("\\boxed{肝}", "肝", "肺", AnswerType.OPEN)] * 3
           + [RewardInput("\\boxed{liver}", "liver", "liver", AnswerType.OPEN)])
    reward.end_batch(0)  # what was scored enters the buffers at the batch boundary
    buffers = reward.thresholds.state_dict()["buffers"]
    assert [len(buffers["bertscore"]), len(buffers["cosine"])] == [1, 1]


def test_eval_open_metrics_leave_uncovered_semantic_metrics_out():
    from eval.scoring import OpenMetrics

    zh, es = OpenMetrics()(["右肺", "pulmón derecho"], ["左肺", "pulmón izquierdo"])
    assert set(zh) == {"bleu1", "rouge1", "armed_avg"} and zh["armed_avg"] == 0.5
    assert {"bertscore", "cossim"} <= set(es) and es["bleu1"] == 0.5


def test_a_loader_skips_and_counts_an_empty_gold(tmp_path, caplog):
    import json

    import numpy as np
    from PIL import Image

    from medvqa_env.datasets import load_dataset

    Image.fromarray(np.zeros((8, 8, 3), "uint8")).save(tmp_path / "i.png")
    rows = [{"id": "ok", "image": "i.png", "question": "Q?", "answer": "肺"},
            {"id": "dot", "image": "i.png", "question": "Q?", "answer": "."}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=r"m\.jsonl: line 2: record 'dot' has an empty answer once normalised"):
        load_dataset(str(tmp_path / "m.jsonl"))
    with caplog.at_level(logging.WARNING):
        ds = load_dataset(str(tmp_path / "m.jsonl"), on_invalid="skip")
    assert [r.id for r in ds] == ["ok"] and ds.provenance.skipped_by_reason() == {"empty answer once normalised": 1}
