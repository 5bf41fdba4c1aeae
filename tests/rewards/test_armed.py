"""ARMed open-answer reward: the formula, equality with bert-score / sentence-transformers, state."""

from __future__ import annotations

import math
import pickle

import pytest

from medvqa_env.records import AnswerType
from rewards.adaptive import squash
from rewards.armed import ARMedConfig, ARMedReward
from rewards.base import RewardInput

CANDS = ["left lower lobe", "pneumonia", "Right kidney!", "the the the", "A large mass in the liver with necrosis"]
REFS = ["the left lower lobe", "consolidation", "kidney", "x", "hepatic mass"]


def _open(answer, truth, format_ok=True):
    return RewardInput(rf"\boxed{{{answer}}}", answer, truth, AnswerType.OPEN, format_ok=format_ok)


def test_constructor_is_cheap_and_pickles_without_models(minilm):
    r = ARMedReward()
    assert r._token_encoder is None                       # nothing loaded yet
    shared = ARMedReward(token_encoder=minilm)
    shared([_open("liver", "liver")])
    clone = pickle.loads(pickle.dumps(shared))
    assert clone._token_encoder is None and minilm.loaded  # the copy dropped the model, not the original
    assert clone.state_dict() == shared.state_dict()


def test_bertscore_and_cosine_equal_the_libraries(armed):
    from bert_score import BERTScorer
    from sentence_transformers import SentenceTransformer

    from rewards.encoders import default_model_path

    assert armed.shares_encoder_pass                     # MiniLM: one pass for both metrics
    from rewards.normalize import semantic_text

    bert, cos = armed.semantic_scores(CANDS, REFS)
    path = default_model_path()
    # the encoders read the normalised texts ("Right kidney!" -> "right kidney"): so do the libraries here
    cands, refs = [semantic_text(c) for c in CANDS], [semantic_text(r) for r in REFS]
    assert cands[2] == "right kidney"
    f1 = BERTScorer(model_type=path, num_layers=6).score(cands, refs)[2].tolist()
    st = SentenceTransformer(path)
    a, b = st.encode(cands, normalize_embeddings=True), st.encode(refs, normalize_embeddings=True)
    assert bert == pytest.approx(f1, abs=1e-5)
    assert cos == pytest.approx([float(x @ y) for x, y in zip(a, b)], abs=1e-5)


def test_total_follows_the_seed_formula(armed):
    outs = armed([_open(c, r) for c, r in zip(CANDS, REFS)] + [_open("liver", "liver", format_ok=False)])
    for o in outs:
        c = o.components
        t_b, t_c = c["threshold_bertscore"], c["threshold_cosine"]
        assert c["bertscore_adapt"] == pytest.approx(squash(c["bertscore"], t_b, 5.0, 5.0))
        assert c["cosine_adapt"] == pytest.approx(squash(c["cosine"], t_c, 5.0, 5.0))
        r_c = 0.5 * c["bleu1"] + 0.5 * c["rouge1"]
        r_as = 0.2 * c["bertscore_adapt"] + 0.8 * c["cosine_adapt"]
        r_total = (0.4 * r_c + 0.4 * r_as + 0.2 * c["format"]) / 1.0
        assert (c["r_c"], c["r_as"], c["r_total"]) == pytest.approx((r_c, r_as, r_total))
        assert o.total == pytest.approx(2 * r_total - 1)
    assert outs[-1].components["format"] == 0.0


def test_hand_computed_exact_answer(armed):
    # identical text: BLEU-1 = ROUGE-1 = 1, BERTScore = cos = 1; first batch thresholds are 0.5
    out = armed([_open("pleural effusion", "pleural effusion")])[0]
    c = out.components
    adapt = 0.5 + 0.5 * (1 - math.exp(-5.0 * 0.5))
    assert c["bertscore_adapt"] == pytest.approx(adapt, abs=1e-5)
    expected = 2 * (0.4 * 1.0 + 0.4 * adapt + 0.2 * 1.0) - 1
    assert out.total == pytest.approx(expected, abs=1e-5)


def test_right_beats_wrong_and_missing_answer(armed):
    right, wrong, missing = armed([_open("left lung", "left lung"), _open("spleen", "left lung"),
                                   RewardInput("", None, "left lung", AnswerType.OPEN, format_ok=False)])
    assert right.total > wrong.total > missing.total >= -1.0
    assert missing.components["bertscore"] == 0.0 and missing.components["format"] == 0.0
    assert right.components["accuracy"] == 1.0 and wrong.components["accuracy"] == 0.0


def test_thresholds_adapt_and_round_trip(armed, minilm):
    before = armed.thresholds.current()
    for _ in range(3):
        first = armed([_open("left lung", "left lung")] * 8)   # high similarities ...
        again = armed([_open("left lung", "left lung")] * 8)
        assert [o.total for o in again] == [o.total for o in first]  # scoring alone moves nothing
        armed.end_batch()                                   # ... pull thresholds up at each batch end
    after = armed.thresholds.current()
    assert after["cosine"] == pytest.approx(before["cosine"] + 3 * 0.01)
    clone = ARMedReward(token_encoder=minilm)
    clone.load_state_dict(armed.state_dict())
    assert clone.thresholds.current() == after
    batch = [_open("liver", "hepatic"), _open("kidney", "renal")]
    assert [o.total for o in clone(batch)] == pytest.approx([o.total for o in armed(batch)])
    with pytest.raises(ValueError, match="thresholds"):
        clone.load_state_dict({})


def test_scores_do_not_depend_on_order_within_a_batch(minilm):
    batch = [_open(c, r) for c, r in zip(CANDS, REFS)]
    a = ARMedReward(token_encoder=minilm)(batch)
    b = ARMedReward(token_encoder=minilm)(batch[::-1])[::-1]
    assert [o.total for o in a] == pytest.approx([o.total for o in b])


def test_config_checks_and_paper_preset():
    with pytest.raises(ValueError, match="lambda1"):
        ARMedConfig(lambda1=1.5)
    with pytest.raises(ValueError, match="gammas"):
        ARMedConfig(gammas=(0, 0, 0))
    with pytest.raises(ValueError, match="threshold_store"):
        ARMedConfig(threshold_store="redis")
    with pytest.raises(ValueError, match="either a config"):
        ARMedReward(ARMedConfig(), lambda1=0.3)
    cfg = ARMedConfig.paper("/models/pubmedbert", "/models/biobert-sts")
    assert (cfg.bertscore_layers, cfg.cosine_model) == (8, "/models/biobert-sts")
    assert ARMedConfig(adaptive={"delta_max": 0.1}).adaptive.delta_max == 0.1


def test_separate_cosine_model_goes_through_sentence_transformers(minilm):
    from rewards.encoders import SentenceEncoder

    # BERTScore on MiniLM's layer 3 cannot share its pass with the sentence embedding
    r = ARMedReward(bertscore_layers=3)
    assert not r.shares_encoder_pass and isinstance(r._sentence_encoder, SentenceEncoder)
    bert3, cos = r.semantic_scores(CANDS[:2], REFS[:2])
    bert6, cos6 = ARMedReward(token_encoder=minilm).semantic_scores(CANDS[:2], REFS[:2])
    assert cos == pytest.approx(cos6, abs=1e-5) and bert3 != pytest.approx(bert6)


def test_encoder_cache_smaller_than_a_batch(minilm):
    from rewards.encoders import SentenceEncoder, TokenEncoder

    tiny = TokenEncoder(cache_size=2)
    tiny._model, tiny._tokenizer = minilm._model, minilm._tokenizer   # reuse the loaded weights
    tiny._packed, tiny._special = minilm._packed, minilm._special
    tiny._max_length, tiny._pooled_is_sentence = minilm._max_length, minilm._pooled_is_sentence
    texts = ["liver", "spleen", "kidney", "liver", "aorta"]
    out = tiny.encode(texts)
    ref = minilm.encode(texts)
    assert len(tiny._cache) == 2
    assert all(abs(a.sentence - b.sentence).max() < 1e-5 for a, b in zip(out, ref))  # padding-level noise
    sent = SentenceEncoder(cache_size=1)
    assert len(sent.encode(texts)) == 5 and len(sent._cache) == 1
