"""The reward encoder's fast paths give the plain transformers results: batch tokenisation equals
one-text-at-a-time encoding, and the packed BERT forward equals the padded one."""

from __future__ import annotations

import numpy as np
import pytest

TEXTS = ["liver", "left lower lobe", "", "   ", "mass in the pancreas with a cyst", "t2", "Left-lower lobe,",
         "no", "right kidney", "ct", "the left lower lobe of the lung shows a 3 cm mass " * 40]


def test_batch_tokenisation_equals_one_text_at_a_time(minilm):
    tok = minilm._tokenizer
    expected = [tok("", add_special_tokens=True)["input_ids"] if not t.strip() else
                tok.encode(t.strip(), add_special_tokens=True, max_length=minilm._max_length, truncation=True)
                for t in TEXTS]
    got = minilm.tokenize(TEXTS)
    assert got == expected
    assert len(got[-1]) == minilm._max_length and got[2] == [tok.cls_token_id, tok.sep_token_id]


def test_packed_forward_equals_the_padded_model(minilm):
    import torch

    ids = minilm.tokenize(TEXTS)
    x, starts, lengths = minilm._packed(ids)
    assert lengths == [len(i) for i in ids]
    for i, row in enumerate(ids):
        with torch.inference_mode():
            alone = minilm._model(input_ids=torch.tensor([row]))[0][0]
        assert torch.allclose(x[starts[i]:starts[i] + lengths[i]], alone, atol=2e-5), TEXTS[i][:30]


def test_packed_and_padded_encodings_agree(minilm):
    from rewards.encoders import TokenEncoder

    padded = TokenEncoder()
    padded._model, padded._tokenizer, padded._special = minilm._model, minilm._tokenizer, minilm._special
    padded._max_length, padded._pooled_is_sentence = minilm._max_length, minilm._pooled_is_sentence
    padded._packed = None  # what a non-BERT model gets
    a, b = minilm._forward(TEXTS), padded._forward(TEXTS)
    for x, y in zip(a, b):
        assert x.tokens.shape == y.tokens.shape and np.abs(x.tokens - y.tokens).max() < 2e-5
        assert np.array_equal(x.weights, y.weights) and np.abs(x.sentence - y.sentence).max() < 2e-5
    assert a[0].weights.tolist() == [0.0, 1.0, 0.0]  # [CLS] liver [SEP]


def test_packing_needs_a_bert_in_eval_mode(minilm):
    from rewards.packed_bert import PackedBert, supports

    assert supports(minilm._model)
    minilm._model.train()
    try:
        with pytest.raises(ValueError, match="eval mode"):
            PackedBert(minilm._model)
    finally:
        minilm._model.eval()
