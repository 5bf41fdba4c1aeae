"""Aggregation: episode rows -> :class:`~eval.summary.EvalSummary`, with pass@K (seed 004) and
bootstrap confidence intervals.

Every metric is a ratio ``sum(numerator) / sum(denominator)`` over *questions* (a question
contributes its K samples), so one cluster bootstrap over questions gives every interval: a mean
over episodes, a per-question rate (pass@K) and a rate of calls (invalid calls / attempted calls)
are all handled the same way.

>>> pass_at_k(4, 1, 1)
0.25
>>> pass_at_k(4, 1, 4)
1.0
>>> pass_at_k(4, 0, 2)
0.0
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from eval.answers import diversity_by_answer_type
from eval.failures import run_failures
from eval.scoring import OPEN_METRICS
from eval.summary import MAX_FAILURES, EvalSummary, GroupSummary, MetricValue
from eval.usage import token_usage

SKIPPED_ERRORS = ("dataset_error",)  # no question could be asked: counted, but not scored


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"expected 0 <= c <= n and 1 <= k <= n, got n={n!r}, c={c!r}, k={k!r}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ratio_with_ci(num: Sequence[float], den: Sequence[float], resamples: int = 1000,
                  seed: int = 0, level: float = 0.95) -> MetricValue:
    """``sum(num) / sum(den)`` over clusters, with a percentile bootstrap interval.

    >>> m = ratio_with_ci([1, 0, 1, 1], [1, 1, 1, 1], resamples=200)
    >>> m.value, m.n, m.ci_low <= 0.75 <= m.ci_high
    (0.75, 4, True)
    >>> ratio_with_ci([], []).value is None
    True
    """
    num_a, den_a = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    keep = den_a > 0
    num_a, den_a = num_a[keep], den_a[keep]
    if not len(den_a):
        return MetricValue(None, None, None, 0)
    value = float(num_a.sum() / den_a.sum())
    n = int(den_a.sum()) if np.all(den_a == np.round(den_a)) else len(den_a)
    if resamples <= 0 or len(den_a) < 2:
        return MetricValue(value, None, None, n)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(den_a), size=(resamples, len(den_a)))
    d = den_a[idx].sum(axis=1)
    stats = num_a[idx].sum(axis=1) / np.where(d > 0, d, np.nan)
    alpha = (1 - level) / 2
    low, high = np.nanquantile(stats, [alpha, 1 - alpha])
    return MetricValue(value, float(low), float(high), n)


def _normalized(answer: str | None) -> str | None:
    from rewards.normalize import normalize_text

    return None if answer is None else normalize_text(answer)


# Each episode metric: (applies to row?, value of row). Rows reaching here are scored (not skipped).
def _episode_metrics() -> dict[str, tuple[Callable[[Mapping], bool], Callable[[Mapping], float]]]:
    kind = lambda *ts: (lambda r: r["answer_type"] in ts)  # noqa: E731
    has_metric = lambda name: (lambda r: r["answer_type"] == "OPEN" and name in (r.get("metrics") or {}))  # noqa: E731
    metric = lambda name: (lambda r: float(r["metrics"][name]))  # noqa: E731
    everyone = lambda r: True  # noqa: E731
    out = {
        "accuracy": (kind("CLOSED", "MCQ"), lambda r: float(r["correct"])),
        "closed_accuracy": (kind("CLOSED"), lambda r: float(r["correct"])),
        "mcq_accuracy": (kind("MCQ"), lambda r: float(r["correct"])),
        "open_exact_match": (kind("OPEN"), lambda r: float(r["correct"])),
        "exact_match": (everyone, lambda r: float(r["exact_match"])),
        "armed_open_avg": (has_metric("armed_avg"), metric("armed_avg")),
        "armed_score": (lambda r: r["answer_type"] != "OPEN" or "armed_avg" in (r.get("metrics") or {}),
                        lambda r: float(r["correct"]) if r["answer_type"] != "OPEN" else float(r["metrics"]["armed_avg"])),
        "judge_accuracy": (lambda r: r.get("judge") is not None, lambda r: float(r["judge"]["correct"])),
        "mean_reward": (lambda r: r.get("reward") is not None, lambda r: float(r["reward"])),
        "format_error_rate": (everyone, lambda r: float(not r["format_ok"])),
        "no_answer_rate": (everyone, lambda r: float(r.get("prediction") is None)),
        "error_rate": (everyone, lambda r: float(r.get("error") is not None)),
        "turns_per_episode": (everyone, lambda r: float(r.get("turns", 0))),
        "tool_calls_per_episode": (everyone, lambda r: float(r["tool_stats"]["calls"])),
    }
    for name in OPEN_METRICS:
        out[name] = (has_metric(name), metric(name))
    return out


EPISODE_METRICS = _episode_metrics()


def summarize_group(rows: Sequence[Mapping[str, Any]], k: int, resamples: int = 1000, seed: int = 0) -> GroupSummary:
    """All metrics of :class:`GroupSummary` for ``rows`` (one slice of a run)."""
    errors = [r for r in rows if r.get("error")]
    scored = [r for r in rows if not (r.get("error") and r["error"].get("kind") in SKIPPED_ERRORS)]
    by_q: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in scored:
        by_q[r["record_id"]].append(r)
    questions = list(by_q.values())
    g = GroupSummary(n_episodes=len(rows), n_questions=len({r["record_id"] for r in rows}), n_errors=len(errors),
                     n_scored=len(scored))

    def ci(num, den):
        return ratio_with_ci(num, den, resamples, seed)

    for name, (applies, value) in EPISODE_METRICS.items():
        num, den = [], []
        for q in questions:
            sel = [r for r in q if applies(r)]
            num.append(sum(value(r) for r in sel))
            den.append(len(sel))
        setattr(g, name, ci(num, den))

    # -- seed 004: K samples per question --
    p1, pk, fail, uniq = [], [], [], []
    for q in questions:
        n, c = len(q), sum(bool(r["correct"]) for r in q)
        p1.append(pass_at_k(n, c, 1))
        pk.append(pass_at_k(n, c, min(k, n)))
        answers = [_normalized(r.get("prediction")) for r in q]
        fail.append(float(all(a is None for a in answers)))
        uniq.append(float(len({a for a in answers if a is not None})))
    ones = [1.0] * len(questions)
    g.pass_at_1, g.pass_at_k = ci(p1, ones), ci(pk, ones)
    g.format_failure_at_k, g.unique_answers_at_k = ci(fail, ones), ci(uniq, ones)

    # -- tool use: rates over calls, not episodes --
    stats = [[r["tool_stats"] for r in q] for q in questions]
    attempted = [sum(s["calls"] + s["malformed"] for s in q) for q in stats]
    valid = [sum(s["calls"] - (s["invalid"] - s["malformed"]) for s in q) for q in stats]
    g.invalid_call_rate = ci([sum(s["invalid"] for s in q) for q in stats], attempted)
    g.tool_error_rate = ci([sum(s["errors"] for s in q) for q in stats], valid)
    tools = sorted({t for q in stats for s in q for t in s["by_tool"]})
    episodes = [len(q) for q in stats]
    g.tool_calls_by_tool = {t: ci([sum(s["by_tool"].get(t, 0) for s in q) for q in stats], episodes) for t in tools}
    return g


def _group_by(rows: Iterable[Mapping[str, Any]], key: str) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        out[str(r.get(key) or "unknown")].append(r)
    return dict(sorted(out.items()))


def failed_episodes(rows: Sequence[Mapping[str, Any]], message_chars: int = 300) -> list[dict[str, Any]]:
    """One entry per episode that recorded an error, in record order (what the report lists).

    >>> failed_episodes([{"record_id": "q1", "sample": 0, "error": {"kind": "dataset_error", "message": "gone"}},
    ...                  {"record_id": "q2", "sample": 0, "error": None}])
    [{'record_id': 'q1', 'sample': 0, 'kind': 'dataset_error', 'message': 'gone', 'scored': False}]
    """
    out = []
    for r in rows:
        err = r.get("error")
        if err:
            kind = str(err.get("kind", "unknown"))
            out.append({"record_id": r["record_id"], "sample": r.get("sample", 0), "kind": kind,
                        "message": str(err.get("message", ""))[:message_chars], "scored": kind not in SKIPPED_ERRORS})
    return out


def summarize(rows: Sequence[Mapping[str, Any]], k: int = 1, run: Mapping[str, Any] | None = None,
              timing: Mapping[str, float | None] | None = None, resamples: int = 1000, seed: int = 0) -> EvalSummary:
    """The whole :class:`EvalSummary` of a run's rows (order does not matter)."""
    rows = sorted(rows, key=lambda r: (r["record_id"], r["sample"]))
    errors: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.get("error"):
            errors[r["error"].get("kind", "unknown")] += 1
        if r.get("judge_error"):
            errors["judge_error"] += 1
    timing = dict(timing or {})
    if rows:
        timing.setdefault("mean_episode_s", float(np.mean([r["timing"]["total_s"] for r in rows])))
        timing.setdefault("mean_agent_s", float(np.mean([r["timing"]["agent_s"] for r in rows])))
        timing.setdefault("mean_env_s", float(np.mean([r["timing"]["env_s"] for r in rows])))
    failures = failed_episodes(rows)
    s = EvalSummary(
        run=dict(run or {}), k=k, n_episodes=len(rows), n_questions=len({r["record_id"] for r in rows}),
        errors_by_kind=dict(sorted(errors.items())),
        failures=failures[:MAX_FAILURES], failures_omitted=max(0, len(failures) - MAX_FAILURES),
        metrics_available={"open_metrics": any("armed_avg" in (r.get("metrics") or {}) for r in rows),
                           "judge": any(r.get("judge") is not None for r in rows)},
        timing=timing,
        overall=summarize_group(rows, k, resamples, seed),
        answer_diversity=diversity_by_answer_type(r for r in rows if not r.get("error")),
        usage=token_usage(rows),
    )
    for attr, key in (("by_dataset", "dataset"), ("by_answer_type", "answer_type"),
                      ("by_modality", "modality"), ("by_organ", "organ")):
        setattr(s, attr, {name: summarize_group(group, k, resamples, seed)
                          for name, group in _group_by(rows, key).items()})
    # what was not measured leads the summary: errors (above) and the rows the loader skipped
    s.n_scored, s.n_errors = s.overall.n_scored, s.overall.n_errors
    for name, value in run_failures(rows).items():  # what failed, named (eval.failures)
        setattr(s, name, value)
    loaded = s.run.get("dataset_provenance") or {}
    s.n_skipped_records = int(loaded.get("n_skipped", 0))
    s.skipped_by_reason = dict(loaded.get("skipped_by_reason") or {})
    return s
