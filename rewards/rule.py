"""Rule rewards for CLOSED (yes/no) and MCQ questions (seed 000 §4.1): ``+1`` if the format is
right and the answer matches (any accepted alternative, :mod:`rewards.matching`), else ``-1``.

>>> from medvqa_env.records import AnswerType
>>> r = RuleReward()
>>> r.score(RewardInput(r"\\boxed{Yes.}", "Yes.", "yes", AnswerType.CLOSED)).total
1.0
>>> r.score(RewardInput(r"\\boxed{B}", "B", "B", AnswerType.MCQ, options={"A": "CT", "B": "MRI"},
...                     format_ok=False)).total
-1.0
"""

from __future__ import annotations

from typing import Sequence

from rewards.base import RewardFunction, RewardInput, RewardOutput
from rewards.matching import answer_matches, exact_match_any, references

__all__ = ["ExactMatchReward", "RuleReward", "answer_matches"]


class RuleReward(RewardFunction):
    """``+correct`` when format and answer are right, else ``incorrect`` (defaults ±1)."""

    name = "rule"

    def __init__(self, correct: float = 1.0, incorrect: float = -1.0) -> None:
        self.correct, self.incorrect = float(correct), float(incorrect)

    def __call__(self, batch: Sequence[RewardInput]) -> list[RewardOutput]:
        out = []
        for s in batch:
            match = answer_matches(s)
            ok = match and s.format_ok
            out.append(RewardOutput(self.correct if ok else self.incorrect,
                                    {"accuracy": float(match), "format": float(s.format_ok)}))
        return out


class ExactMatchReward(RewardFunction):
    """Normalised exact match, ±1 with format: the open-answer fallback when ARMed's libraries are absent."""

    name = "exact_match"

    def __call__(self, batch: Sequence[RewardInput]) -> list[RewardOutput]:
        out = []
        for s in batch:
            match = exact_match_any(s.answer, references(s.ground_truth, s.metadata))
            out.append(RewardOutput(1.0 if match and s.format_ok else -1.0,
                                    {"accuracy": float(match), "format": float(s.format_ok)}))
        return out
