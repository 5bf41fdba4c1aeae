"""Lexical metrics for open answers: BLEU-1 (as nltk) and ROUGE-1 F (as rouge-score).

Both use one tokenisation (:func:`tokenize`). ASCII text goes through rouge-score's default
tokenizer: lowercase, every run of characters outside ``[a-z0-9]`` is a separator (so "Left-lower
lobe," -> ``left lower lobe``), no stemming unless asked. Any other text is NFKC-normalised and
lowercased, and then each CJK character (Han, kana) is one token -- Chinese VQA answers are
scored on characters -- and each run of other letters and digits is a word, accents included
("pulmón izquierdo" -> ``pulmón izquierdo``, where rouge-score would cut ``pulm n``); Porter
stemming, when asked, applies to ASCII words only. BLEU-1 is nltk's ``sentence_bleu`` with ``weights=(1.0,)`` and a single reference:
clipped unigram precision times the brevity penalty, **no smoothing** (zero overlap -> 0.0, and an
empty candidate or reference -> 0.0). ROUGE-1 is rouge-score's unigram F-measure.

The counting is done here, with the libraries' own arithmetic step for step (the same divisions,
``exp(fsum(log p))``, the same F formula), because the libraries spend 20-50x longer per pair on
``Fraction`` objects and re-tokenising; ``tests/rewards/test_text_metrics.py`` checks the results
equal ``nltk`` and ``rouge-score`` exactly on every VQA-RAD answer pair it draws.

>>> round(bleu1("left lower lobe", "the left lower lobe"), 4)  # BP = exp(1 - 4/3)
0.7165
>>> round(rouge1("left lower lobe", "the left lower lobe"), 4)
0.8571
>>> bleu1("", "liver"), rouge1("kidney", "liver")
(0.0, 0.0)
>>> tokenize("左肺。"), tokenize("Pulmón izquierdo")
(('左', '肺'), ('pulmón', 'izquierdo'))
>>> round(rouge1("右肺", "左肺"), 4), rouge1("肝", "肺")
(0.5, 0.0)
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from functools import lru_cache
from typing import Any, Sequence

from rewards.normalize import CJK_CHARS

_SCORERS: dict[bool, Any] = {}
# one CJK character, or a run of other letters/digits (``[^\W_]``: \w without the underscore)
_UNICODE_TOKEN = re.compile(f"[{CJK_CHARS}]|(?:(?![{CJK_CHARS}])[^\\W_])+")


def _scorer(stem: bool) -> Any:
    """rouge-score's scorer (imported here, on the first open answer: rouge-score pulls in nltk,
    scipy and scikit-learn, seconds that an env making no open-answer reward should not pay)."""
    if stem not in _SCORERS:
        from rouge_score import rouge_scorer

        _SCORERS[stem] = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=stem)
    return _SCORERS[stem]


@lru_cache(maxsize=65536)
def tokenize(text: str, stem: bool = False) -> tuple[str, ...]:
    """The metrics' tokens (see the module docstring): rouge-score's for ASCII text, characters
    for CJK and accented words for other scripts otherwise; optionally Porter-stemmed."""
    text = text or ""
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    tokenizer = _scorer(stem)._tokenizer
    if text.isascii():
        return tuple(tokenizer.tokenize(text))
    tokens = _UNICODE_TOKEN.findall(text.lower())
    stemmer = getattr(tokenizer, "_stemmer", None) if stem else None
    if stemmer is not None:  # rouge-score stems words of more than 3 characters; Porter is for English
        tokens = [stemmer.stem(t) if len(t) > 3 and t.isascii() else t for t in tokens]
    return tuple(tokens)


@lru_cache(maxsize=65536)
def _counts(text: str, stem: bool) -> Counter:
    return Counter(tokenize(text, stem))


def _overlap(cand: Counter, ref: Counter) -> int:
    """Clipped unigram matches: each candidate word counts at most as often as in the reference."""
    if len(cand) > len(ref):
        cand, ref = ref, cand
    return sum(min(n, ref[w]) for w, n in cand.items() if w in ref)


def bleu1(candidate: str, reference: str, stem: bool = False) -> float:
    """Sentence BLEU-1 of ``candidate`` against one ``reference`` (see the module docstring)."""
    c, r = _counts(candidate or "", stem), _counts(reference or "", stem)
    c_len, r_len = sum(c.values()), sum(r.values())
    if not c_len or not r_len:
        return 0.0
    matched = _overlap(c, r)
    if matched == 0:  # nltk: no unigram match -> 0
        return 0.0
    bp = 1 if c_len > r_len else math.exp(1 - r_len / c_len)  # nltk.brevity_penalty
    return float(bp * math.exp(math.fsum([1.0 * math.log(matched / c_len)])))


def rouge1(candidate: str, reference: str, stem: bool = False) -> float:
    """ROUGE-1 F-measure of ``candidate`` against ``reference`` (rouge-score's ``_score_ngrams``)."""
    c, r = _counts(candidate or "", stem), _counts(reference or "", stem)
    matched = _overlap(c, r)
    precision = matched / max(sum(c.values()), 1)
    recall = matched / max(sum(r.values()), 1)
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def lexical_scores(candidates: Sequence[str], references: Sequence[str],
                   stem: bool = False) -> tuple[list[float], list[float]]:
    """BLEU-1 and ROUGE-1 for aligned lists; identical pairs are computed once."""
    if len(candidates) != len(references):
        raise ValueError(f"expected as many candidates as references, got {len(candidates)} and {len(references)}")
    memo: dict[tuple[str, str], tuple[float, float]] = {}
    b, r = [], []
    for cand, ref in zip(candidates, references):
        key = (cand, ref)
        if key not in memo:
            memo[key] = (bleu1(cand, ref, stem), rouge1(cand, ref, stem))
        b.append(memo[key][0])
        r.append(memo[key][1])
    return b, r
