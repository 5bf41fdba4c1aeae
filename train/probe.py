"""What a warm start gives RL to work with, measured on val (issue 42).

Greedy accuracy cannot see tool use: a warm start trained on half tool-calling, half direct gold
trajectories answers directly when decoded greedily, so every candidate scores the same and the
choice between them rests on one or two questions. RL samples, and what it reinforces is how a
*sampled* tool call scores against a sampled direct answer. So a candidate is probed with:

* ``greedy``: the greedy episode's score (what the trainers log as held-out accuracy);
* ``forced``: the gold tool call (:func:`train.sft.gold_tool_call`) given as the first turn, then
  the policy answers greedily -- can it read the tool? (questions without a gold call: the greedy
  episode);
* ``sampled``: ``samples`` episodes per question at the rollout temperature -- the reward GRPO
  starts from -- with the share of them that call a tool (``call_rate``) and the score of the
  calling and the direct ones (``calling``, ``direct``): GRPO pushes calls up only when
  ``calling`` beats ``direct``.

Each figure comes with its standard error over questions (the per-question means' SD / sqrt(n)).
The score of an episode is its accuracy (CLOSED/MCQ) or its ARMed Avg (OPEN), as the protocol's
metric. The policies are anything with a :class:`train.rollout.Generator`'s ``generate``, so a test
can probe scripted stand-ins through the real env and tools.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from train.rollout import Generator, collect_rollouts

PROBE_FIELDS = ("greedy", "forced", "sampled", "call_rate", "calling", "direct")


class ForcedCallGenerator:
    """The first turn of an episode is ``calls[record_id]`` (a tool call given, not sampled) where
    there is one; every other turn is ``inner``'s."""

    def __init__(self, inner: Generator, encoder, calls: Mapping[str, str | None]) -> None:
        self.inner, self.encoder, self.calls = inner, encoder, calls

    def generate(self, contexts, convs):
        out: list[list[int] | None] = [None] * len(contexts)
        rest = []
        for i, conv in enumerate(convs):
            call = self.calls.get(conv.info.get("record_id")) if conv.turns == 0 else None
            if call:
                out[i] = self.encoder.tokenizer(call, add_special_tokens=False)["input_ids"] + [self.encoder.eos_token_id]
            else:
                rest.append(i)
        if rest:
            for i, ids in zip(rest, self.inner.generate([contexts[i] for i in rest], [convs[i] for i in rest])):
                out[i] = ids
        return out


def episode_score(traj: Any, metric: str) -> float:
    """One episode's score under the protocol's metric: 1/0 accuracy, or its ARMed Avg on OPEN
    (the mean of BLEU-1, ROUGE-1, BERTScore and cosine; 0 when it gave no scored answer).

    >>> from types import SimpleNamespace as T
    >>> episode_score(T(correct=True, components={}), "eval/accuracy")
    1.0
    >>> episode_score(T(correct=None, components={"bleu1": 1, "rouge1": 1, "bertscore": .5, "cosine": .5}), "eval/open/armed_avg")
    0.75
    """
    from train.metrics_log import OPEN_METRICS

    if metric == "eval/accuracy":
        return float(bool(traj.correct))
    comps = traj.components or {}
    return sum(float(comps[m]) for m in OPEN_METRICS) / len(OPEN_METRICS) if all(m in comps for m in OPEN_METRICS) else 0.0


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample SD / sqrt(n); 0 for fewer than 2 values; NaN for none).

    >>> mean_se([1.0, 0.0, 1.0, 0.0])
    (0.5, 0.288675)
    """
    n = len(values)
    if not n:
        return float("nan"), float("nan")
    m = sum(values) / n
    if n < 2:
        return m, 0.0
    return m, round(math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n), 6)


def _episodes(generator: Generator, pool, encoder, indices: Sequence[int], repeats: int = 1, seed: int = 0) -> list:
    requests = [(seed, {"index": int(i)}) for i in indices for _ in range(repeats)]
    trajs = []
    for k in range(0, len(requests), pool.size):
        trajs.extend(collect_rollouts(generator, pool, encoder, requests[k:k + pool.size],
                                      micro_batch=pool.size).trajectories)
    return trajs


def probe(greedy: Generator, sampler: Generator, encoder, pool, indices: Sequence[int], calls: Mapping[str, str | None],
          metric: str = "eval/accuracy", samples: int = 4, seed: int = 0) -> dict[str, Any]:
    """The figures of the module docstring on ``indices`` (one greedy and one forced episode each,
    ``samples`` sampled ones); ``calls``: each record's gold tool call (``None``: answer directly)."""
    def per_question(trajs, key=lambda t: True):
        by: dict[str, list[float]] = {}
        for t in trajs:
            if key(t):
                by.setdefault(t.record_id, []).append(episode_score(t, metric))
        return [sum(v) / len(v) for v in by.values()]

    greedy_t = _episodes(greedy, pool, encoder, indices, seed=seed)
    forced_t = _episodes(ForcedCallGenerator(greedy, encoder, calls), pool, encoder, indices, seed=seed)
    sampled_t = _episodes(sampler, pool, encoder, indices, repeats=max(1, samples), seed=seed)
    out: dict[str, Any] = {"questions": len(indices), "samples": max(1, samples),
                           "forced_questions": sum(1 for t in forced_t if calls.get(t.record_id))}
    for name, trajs, key in (("greedy", greedy_t, None), ("forced", forced_t, None), ("sampled", sampled_t, None),
                             ("calling", sampled_t, lambda t: bool(t.tool_calls)),
                             ("direct", sampled_t, lambda t: not t.tool_calls)):
        out[name], out[f"{name}_se"] = mean_se(per_question(trajs, key) if key else per_question(trajs))
    out["calling_episodes"] = sum(1 for t in sampled_t if t.tool_calls)
    out["call_rate"] = out["calling_episodes"] / max(1, len(sampled_t))
    out["greedy_call_rate"] = sum(1 for t in greedy_t if t.tool_calls) / max(1, len(greedy_t))
    out["invalid_turn_rate"] = sum(t.invalid_turns for t in sampled_t) / max(1, sum(len(t.turn_texts) for t in sampled_t))
    return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else (None if isinstance(v, float) else v))
            for k, v in out.items()}


def gold_calls(dataset, indices: Sequence[int], tools: Sequence[str]) -> dict[str, str | None]:
    """``record_id -> the gold first tool call`` (:func:`train.sft.gold_tool_call`) for ``indices``."""
    from train.sft import gold_tool_call

    return {dataset[i].id: gold_tool_call(dataset[i], list(tools)) for i in indices}


def probe_model(model, encoder, pool, dataset, indices: Sequence[int], metric: str, max_new_tokens: int,
                temperature: float, samples: int, seed: int = 0) -> dict[str, Any]:
    """:func:`probe` of a transformers policy: greedy decoding and sampling at ``temperature`` (as
    the GRPO rollouts sample: top-k and top-p off), seeded."""
    import torch

    from train.rollout import HFGenerator

    torch.manual_seed(seed)
    greedy = HFGenerator(model, encoder, max_new_tokens=max_new_tokens, greedy=True)
    sampler = HFGenerator(model, encoder, max_new_tokens=max_new_tokens, temperature=temperature)
    return probe(greedy, sampler, encoder, pool, indices, gold_calls(dataset, indices, pool.tool_names), metric,
                 samples, seed)

