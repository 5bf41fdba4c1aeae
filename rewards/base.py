"""The reward contract: a batch of samples in, one :class:`RewardOutput` per sample out.

The env calls a reward at the answer step with a batch of one; trainers and the evaluation call
the same objects with whole batches (GRPO groups), which is where batching pays.

>>> from medvqa_env.records import AnswerType
>>> class Exact(RewardFunction):
...     name = "exact"
...     def __call__(self, batch):
...         return [RewardOutput(float(s.answer == s.ground_truth), {"exact": float(s.answer == s.ground_truth)})
...                 for s in batch]
>>> Exact().score(RewardInput(completion=r"\\boxed{yes}", answer="yes", ground_truth="yes",
...                           answer_type=AnswerType.CLOSED)).total
1.0
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from medvqa_env.errors import ConfigError
from medvqa_env.records import AnswerType


@dataclass(frozen=True)
class RewardInput:
    """One scored sample.

    ``completion`` is the final turn as the model wrote it; ``answer`` is the parsed final answer
    (``None`` if there was none); ``format_ok`` is the parser's verdict (exactly one final answer,
    no format errors). ``metadata`` carries what richer rewards need: ``record_id``, ``modality``,
    ``question``, ``tool_calls`` (list of dicts with ``name``, ``arguments``, ``data``, ``error``),
    ``annotations`` (dict), ``trajectory`` (all turns' text), ``image_paths``.
    """

    completion: str
    answer: str | None
    ground_truth: str
    answer_type: AnswerType
    options: Mapping[str, str] = field(default_factory=dict)
    format_ok: bool = True
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # "CLOSED" given as a plain string is the same answer type (it was silently unscored).
        if not isinstance(self.answer_type, AnswerType):
            object.__setattr__(self, "answer_type", AnswerType.parse(self.answer_type))


@dataclass(frozen=True)
class RewardOutput:
    """A total and its named parts (logged as ``reward/<name>``). ``None`` total = abstain."""

    total: float | None
    components: Mapping[str, float] = field(default_factory=dict)


class RewardFunction(abc.ABC):
    """Batch reward. Subclasses implement ``__call__``.

    Stateful ones (ARMed's adaptive thresholds) never change their state while scoring: a trainer
    calls :meth:`end_batch` once at the end of each batch, and ``state_dict``/``load_state_dict``
    carry the state through checkpoints. Composites forward all three to their parts."""

    name: str = "reward"

    @abc.abstractmethod
    def __call__(self, batch: Sequence[RewardInput]) -> list[RewardOutput]:
        ...

    def score(self, sample: RewardInput) -> RewardOutput:
        return self([sample])[0]

    def end_batch(self, batch_id: Any = None) -> dict[str, Any]:
        """The batch boundary: adaptive state moves once from what was scored since the last one.
        Returns what moved (empty for stateless rewards). ``batch_id`` makes it idempotent."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        """Release what the reward holds outside this object (a Ray actor of adaptive state)."""


class ByAnswerType(RewardFunction):
    """Routes each sample to the reward for its answer type (CLOSED, MCQ, OPEN), batching per type."""

    name = "by_answer_type"

    def __init__(self, closed: RewardFunction, mcq: RewardFunction, open: RewardFunction) -> None:
        self.routes = {AnswerType.CLOSED: closed, AnswerType.MCQ: mcq, AnswerType.OPEN: open}

    def __call__(self, batch: Sequence[RewardInput]) -> list[RewardOutput]:
        out: list[RewardOutput | None] = [None] * len(batch)
        for kind, fn in self.routes.items():
            idx = [i for i, s in enumerate(batch) if s.answer_type is kind]
            if idx:
                for i, r in zip(idx, fn([batch[i] for i in idx])):
                    out[i] = r
        return out  # type: ignore[return-value]

    def end_batch(self, batch_id: Any = None) -> dict[str, Any]:
        moved = {k.value: fn.end_batch(batch_id) for k, fn in _distinct(self.routes.items())}
        return {k: v for k, v in moved.items() if v}

    def state_dict(self) -> dict[str, Any]:
        return {k.value: fn.state_dict() for k, fn in self.routes.items()}

    def close(self) -> None:
        for _, fn in _distinct(self.routes.items()):
            _close(fn)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for k, fn in self.routes.items():
            if k.value in state:
                fn.load_state_dict(state[k.value])


class WeightedSum(RewardFunction):
    """``total = sum(w_i * r_i)`` over rewards that do not abstain (TRL-style weighted nansum).

    Each part's total is also reported as a component under the part's name.
    """

    name = "weighted_sum"

    def __init__(self, parts: Mapping[str, tuple[RewardFunction, float]] | Sequence[tuple[RewardFunction, float]]) -> None:
        items = parts.items() if isinstance(parts, Mapping) else [(fn.name, (fn, w)) for fn, w in parts]
        self.parts = {name: (fn, float(w)) for name, (fn, w) in items}
        if not self.parts:
            raise ConfigError("WeightedSum needs at least one reward")

    def __call__(self, batch: Sequence[RewardInput]) -> list[RewardOutput]:
        results = {name: fn(batch) for name, (fn, _) in self.parts.items()}
        out = []
        for i in range(len(batch)):
            total, any_vote, comps = 0.0, False, {}
            for name, (_, w) in self.parts.items():
                r = results[name][i]
                for k, v in r.components.items():
                    comps[k if k.startswith(name) else f"{name}/{k}"] = v
                if r.total is not None and not math.isnan(r.total):
                    comps[name] = r.total
                    total += w * r.total
                    any_vote = True
            out.append(RewardOutput(total if any_vote else None, comps))
        return out

    def end_batch(self, batch_id: Any = None) -> dict[str, Any]:
        moved = {name: fn.end_batch(batch_id) for name, fn in _distinct((n, f) for n, (f, _) in self.parts.items())}
        return {k: v for k, v in moved.items() if v}

    def state_dict(self) -> dict[str, Any]:
        return {name: fn.state_dict() for name, (fn, _) in self.parts.items()}

    def close(self) -> None:
        for _, fn in _distinct((n, f) for n, (f, _) in self.parts.items()):
            _close(fn)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, (fn, _) in self.parts.items():
            if name in state:
                fn.load_state_dict(state[name])


def _distinct(items):
    """``(key, reward)`` pairs, each reward object once (one object may serve several routes)."""
    seen: set[int] = set()
    for key, fn in items:
        if id(fn) not in seen:
            seen.add(id(fn))
            yield key, fn


def _close(fn: Any) -> None:
    close = getattr(fn, "close", None)  # plain callables have nothing to release
    if callable(close):
        close()


def with_answer(sample: RewardInput, answer: str | None) -> RewardInput:
    return replace(sample, answer=answer)
