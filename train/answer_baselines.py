"""Baselines that need no training step, scored exactly like a policy's held-out evaluation.

A learning claim is only as strong as the best thing that did not learn. Two of the learning
protocol's baselines (:mod:`train.protocol`) answer without looking:

* **question text only** -- for each question the most common training answer among training
  questions with the same text (:class:`agents.baselines.AnswerPriorAgent` keyed on the whole
  question, falling back to shorter openings and the answer type): what the words alone give.
* **best constant answer** -- the one answer that, given to every held-out question, scores best
  on them (chosen on the held-out questions themselves, so no constant can do better).

Both answer through the env (``\\boxed{answer}``, one turn, no tools called) with the same reward
and :func:`train.common.evaluate_heldout`, so their numbers sit in the same table as a policy's,
and their answers are stored the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

QUESTION_WORDS = 30  # "the whole question": longer than every template question


def _scripted(encoder, answer_of: Callable[[Any], str]):
    from train.rollout import ScriptedGenerator

    return ScriptedGenerator(encoder, lambda conv: f"\\boxed{{{answer_of(conv)}}}")


def question_prior(train_dataset):
    """The question-text-only answerer, fitted on ``train_dataset`` (answers from words alone)."""
    from agents.baselines import AnswerPriorAgent

    return AnswerPriorAgent(max_words=QUESTION_WORDS, min_count=1).fit(train_dataset)


def evaluate_question_prior(encoder, pool, indices: Sequence[int], train_dataset, answers_path: str | Path | None,
                            max_new_tokens: int = 32) -> dict[str, float]:
    """Held-out metrics of :func:`question_prior` (keys ``eval/...``)."""
    from train.common import evaluate_heldout

    prior = question_prior(train_dataset)
    gen = _scripted(encoder, lambda conv: prior.predict(conv.answer_type, conv.question, conv.info.get("options")))
    return evaluate_heldout(None, encoder, pool, indices, max_new_tokens, generator=gen, answers_path=answers_path,
                            tag="question_prior")


def best_constant(encoder, pool, indices: Sequence[int], candidates: Sequence[str], metric: str,
                  answers_path: str | Path | None, max_new_tokens: int = 32) -> tuple[str, dict[str, float], dict[str, float]]:
    """Score every constant in ``candidates`` on the held-out questions; return the best by
    ``metric`` (e.g. ``eval/accuracy``, ``eval/open/armed_avg``), its metrics (its answers stored
    with tag ``constant``) and every candidate's ``metric``."""
    from train.common import evaluate_heldout

    if not candidates:
        raise ValueError("expected at least one candidate answer")
    scores: dict[str, float] = {}
    results: dict[str, dict[str, float]] = {}
    for answer in dict.fromkeys(candidates):
        results[answer] = evaluate_heldout(None, encoder, pool, indices, max_new_tokens,
                                           generator=_scripted(encoder, lambda conv, a=answer: a))
        scores[answer] = results[answer][metric]
    best = max(scores, key=lambda a: (scores[a], -list(scores).index(a)))  # ties: the first candidate
    if answers_path is not None:  # store the winner's answers like any other row's
        evaluate_heldout(None, encoder, pool, indices, max_new_tokens, generator=_scripted(encoder, lambda conv: best),
                         answers_path=answers_path, tag="constant")
    return best, results[best], scores
