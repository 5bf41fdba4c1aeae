"""``python -m eval.compare runs/a runs/b ...``: runs side by side, as seed 000 §6.5's
checkpoint-selection table (CLOSED accuracy, OPEN ARMed Avg, Selected?) plus the other headline
metrics. The selected run is the best by ``--select`` (default: the mean of CLOSED accuracy and
OPEN ARMed Avg over those a run has). ``--rank`` sorts them best first -- evaluate every checkpoint
of a training run (``eval.run --agent vlm --agent-opt model=runs/grpo/checkpoints/step_N``) and
rank them; a warning says when the runs differ in dataset, split, selection or size.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from eval.report import fmt
from eval.summary import EvalSummary, MetricValue
from medvqa_env.errors import ConfigError

COLUMNS = (
    ("closed_accuracy", "CLOSED"), ("armed_open_avg", "OPEN Avg (ARMed)"), ("mcq_accuracy", "MCQ"),
    ("open_exact_match", "OPEN EM"), ("judge_accuracy", "Judge"), ("pass_at_k", "pass@K"),
    ("format_error_rate", "format err"), ("tool_calls_per_episode", "tools/ep"),
)
SELECT = {
    "closed+open": ("closed_accuracy", "armed_open_avg"),
    "closed": ("closed_accuracy",),
    "open": ("armed_open_avg",),
    "armed": ("armed_score",),
    "judge": ("judge_accuracy",),
}


def selection_score(summary: EvalSummary, select: str = "closed+open") -> float | None:
    """Mean of the selection metrics the run has (``None`` if it has none)."""
    try:
        names = SELECT[select]
    except KeyError:
        raise ValueError(f"expected --select in {sorted(SELECT)}, got {select!r}") from None
    values = [getattr(summary.overall, n).value for n in names]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def comparison_table(runs: Sequence[tuple[str, EvalSummary]], select: str = "closed+open", ci: bool = False) -> str:
    """The Markdown table; the best run by ``select`` is marked ✅."""
    scores = [selection_score(s, select) for _, s in runs]
    best = max((sc for sc in scores if sc is not None), default=None)
    header = ["Run", "episodes", *[t for _, t in COLUMNS], "Selected?"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for (name, s), sc in zip(runs, scores):
        cells = [fmt(getattr(s.overall, f, MetricValue()), ci=ci) for f, _ in COLUMNS]
        mark = "✅" if sc is not None and sc == best else "no"
        lines.append("| " + " | ".join([name, str(s.n_episodes), *cells, mark]) + " |")
    return "\n".join(lines)


OPEN_DETAIL = (("bleu1", "BLEU-1"), ("rouge1", "ROUGE-1"), ("bertscore", "BERTScore"), ("cossim", "CosSim"),
               ("armed_open_avg", "ARMed Avg"), ("invalid_call_rate", "invalid calls"),
               ("tool_error_rate", "tool errors"), ("format_failure_at_k", "format fail@K"),
               ("unique_answers_at_k", "unique@K"))


def detail_table(runs: Sequence[tuple[str, EvalSummary]], ci: bool = False) -> str:
    """The four ARMed metrics of OPEN answers, tool-use rates and seed 004's sampling figures."""
    header = ["Run", "K", *[t for _, t in OPEN_DETAIL]]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, s in runs:
        cells = [fmt(getattr(s.overall, f), ci=ci) for f, _ in OPEN_DETAIL]
        lines.append("| " + " | ".join([name, str(s.k), *cells]) + " |")
    return "\n".join(lines)


def setup_differences(runs: Sequence[tuple[str, EvalSummary]]) -> list[str]:
    """Warnings when the runs were not measured on the same questions: a different dataset, split,
    selection (limit/shuffle/stratify), K or number of questions makes the table unfair.

    >>> a, b = EvalSummary(run={"dataset": "vqa_rad", "split": "test"}), EvalSummary(run={"dataset": "slake", "split": "test"})
    >>> setup_differences([("a", a), ("b", b)])
    ["runs differ in dataset: a='vqa_rad', b='slake'"]
    """
    out = []
    fields = {"dataset": lambda s: s.run.get("dataset"), "split": lambda s: s.run.get("split"),
              "limit": lambda s: s.run.get("limit"), "shuffle": lambda s: s.run.get("shuffle"),
              "stratify": lambda s: s.run.get("stratify"), "k": lambda s: s.k,
              "questions": lambda s: s.n_questions}
    for name, get in fields.items():
        values = [(run_name, get(s)) for run_name, s in runs]
        if len({repr(v) for _, v in values}) > 1:
            out.append(f"runs differ in {name}: " + ", ".join(f"{n}={v!r}" for n, v in values))
    return out


def checkpoint_step(summary: EvalSummary) -> int | None:
    """The training step of the checkpoint a run evaluated (its ``medvqa_run.json``), if any."""
    from agents.models import read_run_file

    model = (summary.run.get("agent") or {}).get("model")
    if not isinstance(model, str) or not Path(model).is_dir():
        return None
    try:
        step = read_run_file(model).get("step")
    except ValueError:
        return None
    return int(step) if isinstance(step, (int, float)) else None


@dataclass
class CompareArgs:
    """Runs side by side (seed 000 §6.5's checkpoint-selection table)."""

    runs: list[str] = field(default_factory=list, metadata={"cli": {"positional": True, "nargs": "+", "metavar": "RUN"}})
    """run folders (each with summary.json), e.g. one eval.run per checkpoint of a training run"""
    select: str = "closed+open"
    """selection metric: closed+open (mean of CLOSED accuracy and OPEN ARMed Avg), closed, open, armed, judge"""
    rank: bool = False
    """sort the runs best first by --select; otherwise they stay in the order given"""
    ci: bool = False
    """show 95% bootstrap intervals"""
    names: str | None = None
    """comma-separated display names; otherwise the folder names, with the checkpoint step when known"""
    detail: bool = False
    """also print OPEN metrics, tool-use rates, pass@K figures"""


def main(argv: Sequence[str] | None = None) -> int:
    from eval.report import load_summary
    from medvqa_env.cli import parse_dataclass, run_cli

    prog = "python -m eval.compare"
    args = parse_dataclass(CompareArgs, argv, prog=prog, description=__doc__.split("\n\n")[0])

    def compare() -> int:
        if args.select not in SELECT:
            raise ConfigError(f"expected --select in {sorted(SELECT)}, got {args.select!r}")
        summaries = [load_summary(r) for r in args.runs]
        names = args.names.split(",") if args.names else [_display_name(r, s) for r, s in zip(args.runs, summaries)]
        if len(names) != len(summaries):
            raise ConfigError(f"expected {len(summaries)} names, got {len(names)}")
        runs = list(zip(names, summaries))
        for warning in setup_differences(runs):
            print(f"warning: {warning}; the figures are not comparable", file=sys.stderr)
        if args.rank:
            runs.sort(key=lambda r: -(selection_score(r[1], args.select) if selection_score(r[1], args.select)
                                      is not None else float("-inf")))
        print(comparison_table(runs, args.select, args.ci))
        if args.detail:
            print()
            print(detail_table(runs, args.ci))
        return 0

    return run_cli(prog, compare)


def _display_name(run_dir: str, summary: EvalSummary) -> str:
    step = checkpoint_step(summary)
    return Path(run_dir).name + (f" (step {step})" if step is not None else "")


if __name__ == "__main__":
    sys.exit(main())
