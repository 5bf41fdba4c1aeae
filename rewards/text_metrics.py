"""Lexical metrics for open answers: BLEU-1 (nltk) and ROUGE-1 F (rouge-score).

Both use one tokenisation, rouge-score's default tokenizer: lowercase, every run of characters
outside ``[a-z0-9]`` is a separator (so "Left-lower lobe," -> ``left lower lobe``), no stemming
unless asked. BLEU-1 is nltk's ``sentence_bleu`` with ``weights=(1.0,)`` and a single reference:
clipped unigram precision times the brevity penalty, **no smoothing** (zero overlap -> 0.0, and an
empty candidate or reference -> 0.0). ROUGE-1 is the unigram F-measure.

>>> round(bleu1("left lower lobe", "the left lower lobe"), 4)  # BP = exp(1 - 4/3)
0.7165
>>> round(rouge1("left lower lobe", "the left lower lobe"), 4)
0.8571
>>> bleu1("", "liver"), rouge1("kidney", "liver")
(0.0, 0.0)
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Sequence

from nltk.translate.bleu_score import sentence_bleu
from rouge_score import rouge_scorer

_SCORERS: dict[bool, rouge_scorer.RougeScorer] = {}


def _scorer(stem: bool) -> rouge_scorer.RougeScorer:
    if stem not in _SCORERS:
        _SCORERS[stem] = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=stem)
    return _SCORERS[stem]


@lru_cache(maxsize=65536)
def tokenize(text: str, stem: bool = False) -> tuple[str, ...]:
    """rouge-score's tokenisation (lowercase, alphanumeric runs), optionally Porter-stemmed."""
    return tuple(_scorer(stem)._tokenizer.tokenize(text or ""))


def bleu1(candidate: str, reference: str, stem: bool = False) -> float:
    """Sentence BLEU-1 of ``candidate`` against one ``reference`` (see the module docstring)."""
    c, r = tokenize(candidate, stem), tokenize(reference, stem)
    if not c or not r:
        return 0.0
    with warnings.catch_warnings():  # nltk warns on zero overlap; we define that as 0.0
        warnings.simplefilter("ignore")
        return float(sentence_bleu([list(r)], list(c), weights=(1.0,)))


def rouge1(candidate: str, reference: str, stem: bool = False) -> float:
    """ROUGE-1 F-measure of ``candidate`` against ``reference`` (rouge-score)."""
    return float(_scorer(stem).score(reference or "", candidate or "")["rouge1"].fmeasure)


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
