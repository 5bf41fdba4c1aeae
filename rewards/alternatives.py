r"""Several accepted answers, scored the way the official VQA-Med evaluations do: the best over them.

VQA-Med's reference answers name alternatives (2019 test: ``a#b`` and an optional ``(part)``;
2021 test: one answer per column); the loader keeps the first as ``answer`` and every accepted form
in ``metadata["answer_alternatives"]`` (:mod:`medvqa_env.datasets.vqamed`; any dataset may carry
that key). The organisers' evaluators count an answer correct when it matches *any* reference and
take the *best* BLEU over the references (``VQA-Med-2021--VQA--Evaluator.py``: ``min(1, matches)``
and ``max(bleu_scores_of_all_possibilities)``; the 2019 test README: "retrieving one of the answers
is considered correct").

The built-in rewards credit alternatives themselves (:mod:`rewards.matching`: rule and exact
match take any alternative, ARMed the best-scoring one). :class:`BestOfAlternatives` does it for
any other reward (MediX's judge, GRASP's BERTScore, a custom one): a sample is scored against each
accepted answer and keeps the best total (``build_reward("alternatives")`` wraps the default reward,
``build_reward("alternatives:reward=armed")`` another). The evaluation's metrics do the same
(:mod:`eval.scoring`).

>>> from medvqa_env.records import AnswerType
>>> from rewards.rule import ExactMatchReward
>>> reward = BestOfAlternatives(ExactMatchReward())
>>> meta = {"answer_alternatives": ["septic cerebral emboli", "mass"]}
>>> out = reward([RewardInput(r"\boxed{mass}", "mass", "septic cerebral emboli", AnswerType.OPEN, metadata=meta)])
>>> out[0].total, out[0].components["alternative"]
(1.0, 1.0)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from rewards.base import RewardFunction, RewardInput, RewardOutput

ALTERNATIVES_KEY = "answer_alternatives"


def accepted_answers(ground_truth: str, metadata: Mapping[str, Any] | None = None) -> list[str]:
    """The ground truth and every accepted alternative in ``metadata["answer_alternatives"]``,
    ground truth first, no repeats, no alternative that normalises to nothing ("", ".").

    >>> accepted_answers("a", {"answer_alternatives": ["a", "b", "", "b", "."]})
    ['a', 'b']
    >>> accepted_answers("yes")
    ['yes']
    """
    from rewards.normalize import normalize_text

    alternatives = (metadata or {}).get(ALTERNATIVES_KEY) or ()
    if isinstance(alternatives, str):
        alternatives = (alternatives,)
    others = [a for a in (str(a).strip() for a in alternatives) if normalize_text(a)]
    return [a for a in dict.fromkeys([ground_truth, *others]) if a]


class BestOfAlternatives(RewardFunction):
    """``reward`` scored against each accepted answer of a sample; the best total wins.

    Components: the winning alternative's, plus ``alternative`` (its index: 0 is the record's
    ``answer``) and ``n_alternatives``. A sample without alternatives is scored once, as by
    ``reward``. All alternatives go through ``reward`` in one batch; a stateful reward (ARMed's
    adaptive thresholds) therefore sees each alternative's scores. ``end_batch``, ``state_dict`` and
    ``load_state_dict`` go to ``reward``.
    """

    def __init__(self, reward: RewardFunction) -> None:
        self.reward = reward
        self.name = f"{reward.name}+alternatives"

    def __call__(self, batch: Sequence[RewardInput]) -> list[RewardOutput]:
        expanded, owner = [], []
        for i, sample in enumerate(batch):
            for ref in accepted_answers(sample.ground_truth, sample.metadata):
                expanded.append(replace(sample, ground_truth=ref,
                                        metadata={**sample.metadata, ALTERNATIVES_KEY: []}))
                owner.append(i)
        outs = self.reward(expanded) if expanded else []
        best: dict[int, tuple[int, RewardOutput]] = {}
        counts: dict[int, int] = {}
        for i, out in zip(owner, outs):
            k = counts.get(i, 0)
            counts[i] = k + 1
            held = best.get(i)
            if held is None or (out.total is not None and (held[1].total is None or out.total > held[1].total)):
                best[i] = (k, out)
        result = []
        for i in range(len(batch)):
            k, out = best[i]
            result.append(RewardOutput(out.total, {**out.components, "alternative": float(k),
                                                   "n_alternatives": float(counts[i])}))
        return result

    def end_batch(self, batch_id: Any = None) -> dict[str, Any]:
        return self.reward.end_batch(batch_id)

    def state_dict(self) -> dict[str, Any]:
        return self.reward.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.reward.load_state_dict(state)

    def close(self) -> None:
        close = getattr(self.reward, "close", None)
        if callable(close):
            close()
