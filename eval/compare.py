"""``python -m eval.compare runs/a runs/b ...``: runs side by side, as seed 000 §6.5's
checkpoint-selection table (CLOSED accuracy, OPEN ARMed Avg, Selected?) plus the other headline
metrics. The selected run is the best by ``--select`` (default: the mean of CLOSED accuracy and
OPEN ARMed Avg over those a run has).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from eval.report import fmt
from eval.summary import EvalSummary, MetricValue

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


def main(argv: Sequence[str] | None = None) -> int:
    from eval.report import load_summary

    p = argparse.ArgumentParser(prog="python -m eval.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders (each with summary.json)")
    p.add_argument("--select", default="closed+open", choices=sorted(SELECT))
    p.add_argument("--ci", action="store_true", help="show 95%% bootstrap intervals")
    p.add_argument("--names", default=None, help="comma-separated display names (default: folder names)")
    p.add_argument("--detail", action="store_true", help="also print OPEN metrics, tool-use rates, pass@K figures")
    args = p.parse_args(argv)
    try:
        summaries = [load_summary(r) for r in args.runs]
    except FileNotFoundError as e:
        print(f"eval.compare: error: {e}", file=sys.stderr)
        return 2
    names = args.names.split(",") if args.names else [Path(r).name for r in args.runs]
    if len(names) != len(summaries):
        print(f"eval.compare: error: expected {len(summaries)} names, got {len(names)}", file=sys.stderr)
        return 2
    runs = list(zip(names, summaries))
    print(comparison_table(runs, args.select, args.ci))
    if args.detail:
        print()
        print(detail_table(runs, args.ci))
    return 0


if __name__ == "__main__":
    sys.exit(main())
