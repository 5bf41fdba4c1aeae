"""The summary schema: one dataclass, always the same fields (a metric that does not apply to a
group is ``value: null, n: 0``, never missing). ``summary.json`` is :meth:`EvalSummary.to_dict`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

SCHEMA_VERSION = 4  # 2: n_scored per group, failures listed; 3: leads with errors and skipped dataset rows;
# 4: failures named per source (tool, server, file, reason): n_failed, failed_by_kind, failure_sources


@dataclass
class MetricValue:
    """A mean (or rate) with its bootstrap 95% interval over questions and the count it is over."""

    value: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n: int = 0


@dataclass
class GroupSummary:
    """Every metric for one slice of episodes (all, one dataset, one answer type, one modality).

    ``n_episodes`` counts every episode; ``n_scored`` those the metrics are over; ``n_errors``
    those that recorded an error. Episodes whose image could not be loaded (``dataset_error``) are
    errors that are not scored (no question could be asked); every other failure (agent crash,
    worker crash, no answer) is scored as wrong. So ``n_episodes - n_scored`` = unscored errors.
    """

    n_episodes: int = 0
    n_questions: int = 0
    n_errors: int = 0
    n_scored: int = 0
    # -- correctness (seed 000 §6.2) --
    accuracy: MetricValue = field(default_factory=MetricValue)
    """CLOSED + MCQ accuracy (rule match)."""
    closed_accuracy: MetricValue = field(default_factory=MetricValue)
    mcq_accuracy: MetricValue = field(default_factory=MetricValue)
    open_exact_match: MetricValue = field(default_factory=MetricValue)
    exact_match: MetricValue = field(default_factory=MetricValue)
    """Normalised exact match over all answer types."""
    bleu1: MetricValue = field(default_factory=MetricValue)
    rouge1: MetricValue = field(default_factory=MetricValue)
    bertscore: MetricValue = field(default_factory=MetricValue)
    cossim: MetricValue = field(default_factory=MetricValue)
    armed_open_avg: MetricValue = field(default_factory=MetricValue)
    """ARMed Avg for OPEN = mean(BLEU-1, ROUGE-1, BERTScore, CosSim)."""
    armed_score: MetricValue = field(default_factory=MetricValue)
    """Per episode: accuracy for CLOSED/MCQ, ARMed Avg for OPEN; averaged over all."""
    judge_accuracy: MetricValue = field(default_factory=MetricValue)
    """LLM-judge (lenient rubric) 'correct' rate over judged episodes."""
    mean_reward: MetricValue = field(default_factory=MetricValue)
    # -- sampling (seed 004) --
    pass_at_1: MetricValue = field(default_factory=MetricValue)
    pass_at_k: MetricValue = field(default_factory=MetricValue)
    format_failure_at_k: MetricValue = field(default_factory=MetricValue)
    """Questions where none of the K samples gave a parseable final answer."""
    unique_answers_at_k: MetricValue = field(default_factory=MetricValue)
    format_error_rate: MetricValue = field(default_factory=MetricValue)
    """Episodes whose final turn was not exactly one well-formed answer."""
    no_answer_rate: MetricValue = field(default_factory=MetricValue)
    error_rate: MetricValue = field(default_factory=MetricValue)
    # -- tool use --
    turns_per_episode: MetricValue = field(default_factory=MetricValue)
    tool_calls_per_episode: MetricValue = field(default_factory=MetricValue)
    invalid_call_rate: MetricValue = field(default_factory=MetricValue)
    """(malformed blocks + unknown-tool or bad-argument calls) / all attempted calls."""
    tool_error_rate: MetricValue = field(default_factory=MetricValue)
    """Valid calls whose tool failed / valid calls."""
    tool_calls_by_tool: dict[str, MetricValue] = field(default_factory=dict)
    """Calls per episode, by tool name."""


MAX_FAILURES = 500
METRIC_NAMES = tuple(f.name for f in fields(GroupSummary) if f.type in ("MetricValue", MetricValue))


MAX_ERROR_RATE = 0.05
"""``medvqa-eval --max-failure-rate``'s default (``eval.failures.MAX_FAILURE_RATE``): a run whose share
of failed episodes (:attr:`EvalSummary.n_failed` / ``n_episodes``) is above it, or that scored
nothing, exits 1."""


@dataclass
class EvalSummary:
    """What ``evaluate`` returns and ``summary.json`` holds. It leads with what was *not* measured:
    episodes that recorded an error (by kind) and dataset rows the loader skipped (by reason)."""

    schema_version: int = SCHEMA_VERSION
    n_episodes: int = 0
    n_scored: int = 0
    """Episodes the metrics are over (all but the ``dataset_error`` ones)."""
    n_errors: int = 0
    """Episodes that recorded an error (scored as wrong or, ``dataset_error``, not scored)."""
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    n_skipped_records: int = 0
    """Dataset rows the loader left out (``on_invalid="skip"``; listed in ``skipped_records.jsonl``)."""
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    n_failed: int = 0
    """Episodes something outside the agent failed under: a tool unavailable or crashed, an image
    that could not be decoded, a dead worker, an env or agent error (:mod:`eval.failures`; a tool
    that refused the agent's arguments and a judge error do not count)."""
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    """Episodes per failure kind (``tool_unavailable``, ``tool_crash``, ``tool_error``,
    ``dataset_error``, ``worker_crash``, ...): an episode counts once per kind."""
    tool_failed_episodes: int = 0
    """Episodes with at least one failed tool call (any tool kind)."""
    failure_sources: list[dict[str, Any]] = field(default_factory=list)
    """One entry per source: ``kind``, ``tool``, ``server``, ``file``, ``reason``, ``episodes``,
    ``calls``, ``first`` / ``last`` episode key; the ones that fail the run first, most episodes first."""
    failure_sources_omitted: int = 0
    run: dict[str, Any] = field(default_factory=dict)
    """Agent config, dataset, split, k, seed, tools... (``run.json``)."""
    k: int = 1
    n_questions: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    """Episodes that recorded an error, by record: ``record_id``, ``sample``, ``kind``, ``message``
    and ``scored`` (whether the episode still counts, as wrong). At most ``MAX_FAILURES``, then
    ``failures_omitted`` says how many more are in ``episodes.jsonl``."""
    failures_omitted: int = 0
    metrics_available: dict[str, bool] = field(default_factory=dict)
    """``open_metrics``: ARMed metrics were computed; ``judge``: an LLM judge scored episodes."""
    timing: dict[str, float | None] = field(default_factory=dict)
    overall: GroupSummary = field(default_factory=GroupSummary)
    by_dataset: dict[str, GroupSummary] = field(default_factory=dict)
    by_answer_type: dict[str, GroupSummary] = field(default_factory=dict)
    by_modality: dict[str, GroupSummary] = field(default_factory=dict)
    by_organ: dict[str, GroupSummary] = field(default_factory=dict)
    answer_diversity: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per answer type (and ``all``): distinct answers, their entropy, the top answer's share
    (:mod:`eval.answers`): a constant answer shows here whatever its accuracy."""
    image_ablation: dict[str, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    """Token usage over the episodes whose agent reported it (API agents, :mod:`eval.usage`):
    totals and the mean per episode; ``{}`` otherwise."""
    """Per ablation mode run beside this one (``--image-ablation``): each headline metric normal,
    ablated and the drop (:mod:`eval.ablation`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def scoring_problem(self, max_failure_rate: float = MAX_ERROR_RATE) -> str | None:
        """Why this run must not pass as a result (nothing scored, or more than ``max_failure_rate``
        of its episodes failed, :attr:`n_failed`), or ``None``.

        >>> EvalSummary(n_episodes=5, n_errors=5, errors_by_kind={"dataset_error": 5}).scoring_problem()
        'no episode was scored: 5 of 5 episodes recorded an error (dataset_error 5)'
        >>> EvalSummary(n_episodes=10, n_scored=10, n_failed=1, failed_by_kind={"agent_error": 1}).scoring_problem()
        '1 of 10 episodes (10.0%) failed, over --max-failure-rate 0.05 (agent_error 1)'
        >>> EvalSummary(n_episodes=10, n_scored=10).scoring_problem() is None
        True
        """
        from eval.failures import failure_problem

        kinds = ", ".join(f"{k} {n}" for k, n in self.errors_by_kind.items() if k != "judge_error") or "no errors"
        if self.n_episodes == 0 or self.n_scored == 0:
            return (f"no episode was scored: {self.n_errors} of {self.n_episodes} episodes recorded an error "
                    f"({kinds})")
        return failure_problem(self.n_failed, self.n_episodes, self.failed_by_kind, max_failure_rate)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EvalSummary":
        def group(d: Mapping[str, Any]) -> GroupSummary:
            kw = {}
            for f in fields(GroupSummary):
                if f.name not in d:
                    continue
                v = d[f.name]
                if f.name == "tool_calls_by_tool":
                    kw[f.name] = {k: MetricValue(**m) for k, m in v.items()}
                elif f.name in METRIC_NAMES:
                    kw[f.name] = MetricValue(**v)
                else:
                    kw[f.name] = v
            return GroupSummary(**kw)

        kw = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        kw["overall"] = group(data.get("overall", {}))
        for name in ("by_dataset", "by_answer_type", "by_modality", "by_organ"):
            kw[name] = {k: group(v) for k, v in data.get(name, {}).items()}
        return cls(**kw)
