r"""Whether an answer is right: the one rule every consumer uses.

The env's rewards (:mod:`rewards.rule`, ARMed's ``accuracy``), the evaluation's ``correct`` and
``exact_match`` (:mod:`eval.scoring`), verl's reward function and the TRL hook (both score through
the env's reward) and the baselines all call :func:`answer_matches` / :func:`exact_match_any`, so
an answer is right or wrong in one place.

* Every accepted answer counts (:func:`references`: the record's ``answer`` and
  ``metadata["answer_alternatives"]``, VQA-Med's ``#``): an answer is right when it matches *any*
  of them, as the official VQA-Med evaluations count (open metrics take the best alternative:
  :mod:`rewards.armed`, :class:`eval.scoring.OpenMetrics`).
* MCQ: the option letter the answer names (``(B)``, ``option b``, or the option's text).
* CLOSED: yes/no synonyms folded (``present`` is yes, ``否`` is no; SLAKE-zh's echoed predicates
  ``包含``/``不包含``, ``可以``/``不可以``, ``存在``/``不存在``, ``正常``/``不正常`` as yes/no:
  :data:`rewards.normalize.CLOSED_YES`), a sentence read by its first clause (``Yes, ...``,
  ``是的，...``), else normalised exact match.
* OPEN: normalised exact match (:func:`rewards.normalize.normalize_text`: NFKC, case, every
  Unicode punctuation character, articles). A side that normalises to nothing never matches.

>>> from medvqa_env.records import AnswerType
>>> matches("mass", "septic emboli", AnswerType.OPEN, alternatives=["septic emboli", "mass"])
True
>>> matches("肺。", "肺", AnswerType.OPEN), matches("右肺", "左肺", AnswerType.OPEN)
(True, False)
>>> matches("", ".", AnswerType.CLOSED), matches("the", ".", AnswerType.OPEN)
(False, False)
>>> matches("是", "包含", AnswerType.CLOSED), matches("否", "不可以", AnswerType.CLOSED), matches("是", "不存在", "CLOSED")
(True, True, False)
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from medvqa_env.records import AnswerType
from rewards.normalize import exact_match, normalize_yes_no, parse_mcq_letter


def references(ground_truth: str, metadata: Mapping[str, Any] | None = None) -> list[str]:
    """Every accepted answer of a sample, ground truth first (:func:`rewards.alternatives.accepted_answers`)."""
    from rewards.alternatives import accepted_answers

    return accepted_answers(ground_truth, metadata)


def matches_one(answer: str | None, truth: str, answer_type: AnswerType | str,
                options: Mapping[str, str] | None = None) -> bool:
    """Whether ``answer`` is right against one accepted answer ``truth``, by the rule for its type."""
    if answer is None:
        return False
    kind = AnswerType.parse(answer_type)
    if kind is AnswerType.MCQ:
        options = options or {}
        chosen = parse_mcq_letter(answer, options)
        letter = parse_mcq_letter(truth, options) or truth.strip().upper()
        return chosen is not None and chosen == letter
    if kind is AnswerType.CLOSED:
        yp, yt = normalize_yes_no(answer, closed=True), normalize_yes_no(truth, closed=True)
        if yt is not None:
            return yp == yt
    return exact_match(answer, truth)


def matches(answer: str | None, ground_truth: str, answer_type: AnswerType | str,
            options: Mapping[str, str] | None = None, alternatives: Iterable[str] = ()) -> bool:
    """Whether ``answer`` matches the ground truth or any accepted alternative (see the module doc)."""
    refs = references(ground_truth, {"answer_alternatives": list(alternatives)})
    return any(matches_one(answer, ref, answer_type, options) for ref in refs)


def answer_matches(sample: Any) -> bool:
    """:func:`matches` for a :class:`rewards.base.RewardInput` (its ``metadata`` holds the alternatives)."""
    return any(matches_one(sample.answer, ref, sample.answer_type, sample.options)
               for ref in references(sample.ground_truth, sample.metadata))


def exact_match_any(answer: str | None, refs: Sequence[str]) -> bool:
    """Normalised exact match against any of ``refs``."""
    return any(exact_match(answer, ref) for ref in refs)
