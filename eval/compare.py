"""``python -m eval.compare runs/a runs/b ...``: runs side by side, as seed 000 §6.5's
checkpoint-selection table (CLOSED accuracy, OPEN ARMed Avg, Selected?) plus the other headline
metrics. The selected run is the best by ``--select`` (default: the mean of CLOSED accuracy and
OPEN ARMed Avg over those a run has). ``--rank`` sorts them best first -- evaluate every checkpoint
of a training run (``eval.run --agent vlm --agent-opt model=runs/grpo/checkpoints/step_N``) and
rank them. A warning says when the runs differ in dataset, split, selection or size (the figures
are not comparable), in failed episodes (:mod:`eval.failures`), or in tools, reward, env or agent
settings (the table compares those too). Every figure is shown with its 95% interval; a run is
flagged when its answers are one constant or its tool calls died ("did not take off"). Runs that
tie for the best score are marked ``tie``, and runs whose selection interval overlaps the best's
``tie within noise``: then none is selected, and a line under the table says why. ``compare.md``
and ``compare.html`` (both tables, a plot of the compared figures with their intervals, the
warnings, the runs' folders) are written beside the runs (their common parent folder, or ``--out``).
Arguments that are files (the compare.md/html of an earlier call) are left out.
"""

from __future__ import annotations

import html
import io
import json
import os
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


def selection_interval(summary: EvalSummary, select: str = "closed+open") -> tuple[float | None, float | None]:
    """The ``select`` score's 95% interval: the metric's own, or for a mean of two metrics the mean
    of their bounds (wider than the mean's own interval, so overlaps are called ties conservatively);
    ``(None, None)`` when a metric has no interval (``--bootstrap 0``)."""
    metrics = [getattr(summary.overall, n) for n in SELECT[select]]
    metrics = [m for m in metrics if m.value is not None]
    if not metrics or any(m.ci_low is None or m.ci_high is None for m in metrics):
        return None, None
    return sum(m.ci_low for m in metrics) / len(metrics), sum(m.ci_high for m in metrics) / len(metrics)


def best_runs(runs: Sequence[tuple[str, EvalSummary]], select: str = "closed+open") -> list[str]:
    """The names of the runs with the best ``select`` score: one, or several when they tie (equal
    to 1e-9), or none when no run has the metrics.

    >>> from eval.summary import GroupSummary
    >>> a = EvalSummary(overall=GroupSummary(closed_accuracy=MetricValue(0.5)))
    >>> b = EvalSummary(overall=GroupSummary(closed_accuracy=MetricValue(0.5)))
    >>> best_runs([("a", a), ("b", b)], "closed")
    ['a', 'b']
    """
    scores = [(name, selection_score(s, select)) for name, s in runs]
    best = max((sc for _, sc in scores if sc is not None), default=None)
    return [] if best is None else [name for name, sc in scores if sc is not None and abs(sc - best) <= 1e-9]


@dataclass
class Selection:
    """What the table marks: ``selected`` (one run, or ``None``), ``tied`` (runs that share the best
    score exactly, or whose intervals overlap the best's: a tie within noise) and ``notes`` (lines
    under the table that say why)."""

    selected: str | None = None
    tied: list[str] = field(default_factory=list)
    within_noise: bool = False
    notes: list[str] = field(default_factory=list)


def _fmt_score(summary: EvalSummary, select: str) -> str:
    score = selection_score(summary, select)
    lo, hi = selection_interval(summary, select)
    return "–" if score is None else f"{score:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None else "")


def choose(runs: Sequence[tuple[str, EvalSummary]], select: str = "closed+open") -> Selection:
    """The best run by ``select``, never over a runner-up whose interval overlaps its own without
    saying so: then every run whose interval overlaps the best's is ``tie within noise`` and none
    is selected. Runs with different failure counts are ranked with a note that says so.

    >>> from eval.summary import GroupSummary
    >>> a = EvalSummary(overall=GroupSummary(closed_accuracy=MetricValue(0.60, 0.50, 0.70, 40)))
    >>> b = EvalSummary(overall=GroupSummary(closed_accuracy=MetricValue(0.55, 0.45, 0.65, 40)))
    >>> sel = choose([("a", a), ("b", b)], "closed")
    >>> sel.selected, sel.tied, sel.within_noise
    (None, ['a', 'b'], True)
    """
    out = _choose(runs, select)
    failed = {n: s.n_failed for n, s in runs}
    if len(set(failed.values())) > 1:
        out.notes.append("Failures differ: " + ", ".join(f"{n} {k}" for n, k in failed.items()) +
                         " failed episodes; a run whose tools or images failed under it is not measured like the "
                         "others, so this ranking is not like for like.")
    return out


def _choose(runs: Sequence[tuple[str, EvalSummary]], select: str) -> Selection:
    out = Selection()
    best = best_runs(runs, select)
    summaries = dict(runs)
    if not best:
        return out
    if len(best) > 1:
        score = selection_score(summaries[best[0]], select)
        out.tied = best
        out.notes.append(f"Tie: {', '.join(best)} share the best {select} score ({score:.3f}); no run is selected "
                         "(more questions, K > 1 or another --select may separate them).")
        return out
    lead = best[0]
    lo, hi = selection_interval(summaries[lead], select)
    scored = [(n, selection_score(s, select)) for n, s in runs if n != lead and selection_score(s, select) is not None]
    if lo is None:
        out.selected = lead
        out.notes.append(f"{lead} is selected on its {select} score alone: no interval (--bootstrap 0), so whether "
                         "the runner-up is within noise cannot be told.")
    else:
        overlapping = []
        for n, score in scored:
            olo, ohi = selection_interval(summaries[n], select)
            # a run without an interval of its own (too few questions of a type) is within noise
            # only if its score lies within the best's interval: its point cannot overlap otherwise
            if (olo is None and score >= lo) or (olo is not None and olo <= hi and lo <= ohi):
                overlapping.append(n)
        if overlapping:
            out.tied, out.within_noise = [lead, *overlapping], True
            runner_up = max(overlapping, key=lambda n: selection_score(summaries[n], select))
            out.notes.append(f"Tie within noise: the best {select} score, {lead} {_fmt_score(summaries[lead], select)}, "
                             f"overlaps {', '.join(f'{n} {_fmt_score(summaries[n], select)}' for n in overlapping)}; "
                             f"no run is selected (runner-up {runner_up}; more questions may separate them).")
        else:
            out.selected = lead
    return out


def trained_with_tools(summary: EvalSummary) -> bool | None:
    """Whether the evaluated checkpoint was trained with tools (its ``medvqa_run.json``), or
    ``None`` when the run does not say (not a checkpoint)."""
    from agents.models import read_run_file
    from eval.trained_settings import trained_env

    model = (summary.run.get("agent") or {}).get("model")
    if not isinstance(model, str) or not Path(model).is_dir():
        return None
    try:
        env = trained_env(read_run_file(model))
    except (ValueError, OSError):
        return None
    if not env:
        return None
    return bool(env.get("tools")) and (env.get("max_turns") or 0) > 0


def run_flags(summary: EvalSummary) -> list[str]:
    """What a person must know before reading a run's figures: its held-out answers are one constant,
    its tool calls died ("did not take off": a checkpoint trained with tools that calls none), it
    called no tool though tools were offered, episodes failed under it.

    >>> from eval.summary import GroupSummary
    >>> s = EvalSummary(n_episodes=8, answer_diversity={"all": {"answers": 8, "distinct": 1, "top_answer": "no"}},
    ...                 overall=GroupSummary(tool_calls_per_episode=MetricValue(0.0)), run={"tools": ["ground"]})
    >>> run_flags(s)
    ["one constant answer ('no')", 'no tool calls (tools offered)']
    """
    flags = []
    every = summary.answer_diversity.get("all") or {}
    if every.get("distinct") == 1 and (every.get("answers") or 0) > 1:
        flags.append(f"one constant answer ({every.get('top_answer')!r})")
    calls = summary.overall.tool_calls_per_episode.value
    if calls is not None and calls < 0.01:
        trained = trained_with_tools(summary)
        if trained:
            flags.append(f"did not take off: {calls:.2f} tool calls/ep, trained with tools")
        elif trained is None and summary.run.get("tools") and (summary.run.get("max_turns") or 1) > 0:
            flags.append("no tool calls (tools offered)")
    if summary.n_failed:
        flags.append(f"{summary.n_failed} failed episodes")
    return flags


def comparison_table(runs: Sequence[tuple[str, EvalSummary]], select: str = "closed+open", ci: bool = True) -> str:
    """The Markdown table: each figure with its 95% interval (``ci``), the selection score, flags
    (:func:`run_flags`) and the choice (:func:`choose`): ✅ for the selected run, ``tie`` or
    ``tie within noise`` for runs none of which is selected, with the lines under the table saying why."""
    sel = choose(runs, select)
    header = ["Run", "episodes", *[t for _, t in COLUMNS], f"score ({select})", "flags", "Selected?"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, s in runs:
        cells = [fmt(getattr(s.overall, f, MetricValue()), ci=ci) for f, _ in COLUMNS]
        if name == sel.selected:
            mark = "✅"
        elif name in sel.tied:
            mark = "tie within noise" if sel.within_noise else "tie"
        else:
            mark = "no"
        lines.append("| " + " | ".join([name, str(s.n_episodes), *cells, _fmt_score(s, select),
                                        "; ".join(run_flags(s)) or "–", mark]) + " |")
    if sel.notes:
        lines.append("")
        lines += sel.notes
    return "\n".join(lines)


OPEN_DETAIL = (("bleu1", "BLEU-1"), ("rouge1", "ROUGE-1"), ("bertscore", "BERTScore"), ("cossim", "CosSim"),
               ("armed_open_avg", "ARMed Avg"), ("invalid_call_rate", "invalid calls"),
               ("tool_error_rate", "tool errors"), ("format_failure_at_k", "format fail@K"),
               ("unique_answers_at_k", "unique@K"))


def detail_table(runs: Sequence[tuple[str, EvalSummary]], ci: bool = True) -> str:
    """The four ARMed metrics of OPEN answers, tool-use rates and seed 004's sampling figures."""
    header = ["Run", "K", *[t for _, t in OPEN_DETAIL]]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, s in runs:
        cells = [fmt(getattr(s.overall, f), ci=ci) for f, _ in OPEN_DETAIL]
        lines.append("| " + " | ".join([name, str(s.k), *cells]) + " |")
    return "\n".join(lines)


DATA_FIELDS = ("dataset", "split", "answer_types", "limit", "shuffle", "stratify", "k", "questions")
"""What makes two runs' figures incomparable: they were not measured on the same questions."""
SETTING_FIELDS = ("tools", "reward", "max_turns", "answer_protocol", "observation_style", "seed", "image_ablation",
                  "agent settings")
"""What makes the table compare more than the runs' agents: env, tools, reward and the settings of
the same agent (its config without the model it loads)."""


def _field(summary: EvalSummary, name: str):
    if name == "k":
        return summary.k
    if name == "questions":
        return summary.n_questions
    if name == "agent settings":
        agent = summary.run.get("agent") or {}
        return {k: v for k, v in agent.items() if k != "model"} if isinstance(agent, dict) else agent
    return summary.run.get(name)


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def setup_differences(runs: Sequence[tuple[str, EvalSummary]]) -> list[str]:
    """Warnings when the runs were not measured on the same questions (:data:`DATA_FIELDS`: a
    different dataset, split, selection, K or number of questions makes the table unfair), or not
    with the same env, tools, reward or agent settings (:data:`SETTING_FIELDS`; agent settings are
    compared between runs of the same agent, leaving out the model it loads: checkpoints differ
    in that by design).

    >>> a, b = EvalSummary(run={"dataset": "vqa_rad", "split": "test"}), EvalSummary(run={"dataset": "slake", "split": "test"})
    >>> setup_differences([("a", a), ("b", b)])
    ["runs differ in dataset: a='vqa_rad', b='slake'; the figures are not comparable"]
    """
    out = []
    failed = [(n, s.n_failed, s.failed_by_kind) for n, s in runs]
    if len({f for _, f, _ in failed}) > 1:
        out.append("runs differ in failed episodes: " + ", ".join(f"{n}={k}" + (f" {dict(kinds)}" if kinds else "")
                                                                   for n, k, kinds in failed)
                   + "; a run whose tools or images failed under it is not measured like the others")
    for name in (*DATA_FIELDS, *SETTING_FIELDS):
        if name == "agent settings":
            by_agent: dict = {}
            for run_name, s in runs:
                by_agent.setdefault(repr((s.run.get("agent") or {}).get("name")), []).append((run_name, s))
            groups = list(by_agent.values())
        else:
            groups = [list(runs)]
        for group in groups:
            values = [(run_name, _field(s, name)) for run_name, s in group]
            if len({json.dumps(v, sort_keys=True, default=str) for _, v in values}) > 1:
                why = ("the figures are not comparable" if name in DATA_FIELDS
                       else "the table compares those settings as well as the runs")
                out.append(f"runs differ in {name}: " + ", ".join(f"{n}={_short(v)}" for n, v in values) + f"; {why}")
    return out


def report_dir(run_dirs: Sequence[str | Path]) -> Path:
    """Where ``compare.md`` / ``compare.html`` go: the folder that holds the runs (their common
    parent; the first run's parent when they share nothing but the filesystem root)."""
    parents = [Path(r).resolve().parent if Path(r).is_dir() else Path(r).resolve().parent.parent for r in run_dirs]
    common = Path(os.path.commonpath([str(p) for p in parents]))
    return common if common != Path(common.anchor) else parents[0]


PLOTTED = ("closed_accuracy", "armed_open_avg", "mcq_accuracy", "open_exact_match", "judge_accuracy", "pass_at_k",
           "format_error_rate")
"""The table's rates drawn in ``compare.png`` (tool calls per episode have their own scale: left out)."""


def compare_plot(runs: Sequence[tuple[str, EvalSummary]], select: str = "closed+open") -> bytes | None:
    """PNG bytes: left, every compared rate a run has, one bar per run with its 95% interval;
    right, each run's selection score with its interval, the selected run filled and the runs tied
    within noise hatched. ``None`` when no run has any of them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    titles = dict(COLUMNS)
    metrics = [m for m in PLOTTED if any(getattr(s.overall, m).value is not None for _, s in runs)]
    if not metrics:
        return None
    sel = choose(runs, select)
    n = len(runs)
    colours = plt.get_cmap("tab10")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(min(11.0, 4.0 + 1.1 * len(metrics) + 0.4 * n), 3.8),
                                 gridspec_kw={"width_ratios": [max(2, len(metrics)), max(1.2, 0.5 * n)]})
    width = 0.8 / n
    for i, (name, s) in enumerate(runs):
        values = [getattr(s.overall, m) for m in metrics]
        ys = [v.value if v.value is not None else np.nan for v in values]
        err = [[max(0.0, v.value - v.ci_low) if v.ci_low is not None and v.value is not None else 0.0 for v in values],
               [max(0.0, v.ci_high - v.value) if v.ci_high is not None and v.value is not None else 0.0 for v in values]]
        ax.bar(np.arange(len(metrics)) + (i - (n - 1) / 2) * width, ys, width, yerr=err, capsize=3, label=name,
               color=colours(i % 10))
    ax.set_xticks(np.arange(len(metrics)), [titles.get(m, m) for m in metrics], rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title("Compared figures (95% intervals)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right", framealpha=0.8)
    for i, (name, s) in enumerate(runs):
        score = selection_score(s, select)
        if score is None:
            continue
        lo, hi = selection_interval(s, select)
        err = [[score - lo], [hi - score]] if lo is not None else None
        bx.bar(i, score, 0.7, yerr=err, capsize=4, color=colours(i % 10),
               alpha=1.0 if name == sel.selected else 0.55, hatch="//" if name in sel.tied else None,
               edgecolor="black" if name == sel.selected else None)
    bx.set_xticks(range(n), [name for name, _ in runs], rotation=20, ha="right", fontsize=8)
    bx.set_ylim(0, 1.05)
    verdict = f"selected: {sel.selected}" if sel.selected else ("tie within noise" if sel.within_noise else
                                                                  ("tie" if sel.tied else "none selected"))
    bx.set_title(f"{select} score ({verdict})", fontsize=10)
    bx.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def write_compare_reports(out_dir: str | Path, runs: Sequence[tuple[str, EvalSummary]], run_dirs: Sequence[str | Path],
                          select: str, ci: bool, warnings: Sequence[str]) -> dict[str, Path]:
    """``compare.md``, ``compare.html`` and ``compare.png`` in ``out_dir``: which runs, the warnings,
    the selection table (with the tie line), the plot of the compared figures with their intervals
    (:func:`compare_plot`, embedded in the page) and the detail table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    selection = comparison_table(runs, select, ci)
    detail = detail_table(runs, ci)
    png = compare_plot(runs, select)
    md = ["# Comparison", "", f"Selection metric: `{select}`.", "", "Runs:", ""]
    md += [f"- {name}: `{path}`" for (name, _), path in zip(runs, run_dirs)]
    if warnings:
        md += ["", "**Warnings:**", ""] + [f"- {w}" for w in warnings]
    md += ["", "## Selection", "", selection, ""]
    if png is not None:
        md += ["![compared figures with their 95% intervals](compare.png)", ""]
    md += ["## Detail", "", detail, ""]
    paths = {"markdown": out / "compare.md", "html": out / "compare.html"}
    if png is not None:
        paths["plot"] = out / "compare.png"
        paths["plot"].write_bytes(png)
    paths["markdown"].write_text("\n".join(md))
    paths["html"].write_text(_html(runs, run_dirs, select, warnings, selection, detail, png))
    return paths


def _html_table(markdown: str) -> list[str]:
    esc = html.escape
    parts, rows = [], [line for line in markdown.splitlines() if line.startswith("|")]
    notes = [line for line in markdown.splitlines() if line.strip() and not line.startswith("|")]
    for i, row in enumerate(rows):
        if i == 1:
            continue  # the |---| line
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        tag = "th" if i == 0 else "td"
        parts.append("<tr>" + "".join(f"<{tag}>{esc(c)}</{tag}>" for c in cells) + "</tr>")
    return ["<table>", *parts, "</table>"] + [f"<p><strong>{esc(n)}</strong></p>" for n in notes]


def _html(runs, run_dirs, select, warnings, selection, detail, png: bytes | None = None) -> str:
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>MedVQA-Gym comparison</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}img{max-width:100%;height:auto}"
             "table{border-collapse:collapse;margin-bottom:1.5em;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}</style></head><body>",
             "<h1>Comparison</h1>", f"<p>Selection metric: <code>{esc(select)}</code>.</p><ul>"]
    parts += [f"<li>{esc(name)}: <code>{esc(str(path))}</code></li>" for (name, _), path in zip(runs, run_dirs)]
    parts.append("</ul>")
    if warnings:
        parts += ["<p><strong>Warnings:</strong></p><ul>"] + [f"<li>{esc(w)}</li>" for w in warnings] + ["</ul>"]
    parts += ["<h2>Selection</h2>", *_html_table(selection)]
    if png is not None:
        import base64

        parts.append(f"<img alt='compared figures with their 95% intervals' "
                     f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
    parts += ["<h2>Detail</h2>", *_html_table(detail), "</body></html>"]
    return "\n".join(parts)


def run_folders(paths: Sequence[str]) -> list[str]:
    """The run folders among ``paths``: a file (``compare.md``/``compare.html`` this command wrote
    beside the runs, a log) is left out with a note, so ``eval.compare runs/X/*`` works every time;
    a ``summary.json`` named directly counts as its folder. None left is an error.

    >>> run_folders(["/nonexistent/a"])
    ['/nonexistent/a']
    """
    kept = []
    for p in paths:
        path = Path(p)
        if path.is_file() and path.name != "summary.json":
            print(f"note: {p} is not a run folder; left out", file=sys.stderr)
            continue
        kept.append(p)
    if not kept:
        raise ConfigError(f"expected run folders (each with summary.json), got only files: {list(paths)}")
    return kept


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
    ci: bool = True
    """show each figure's 95% bootstrap interval (``--no-ci``: values only)"""
    names: str | None = None
    """comma-separated display names; otherwise the folder names, with the checkpoint step when known"""
    detail: bool = False
    """also print OPEN metrics, tool-use rates, pass@K figures"""
    out: str | None = None
    """folder for compare.md / compare.html (default: the folder holding the runs)"""


def main(argv: Sequence[str] | None = None) -> int:
    from eval.report import load_summary
    from medvqa_env.cli import parse_dataclass, run_cli

    prog = "python -m eval.compare"
    args = parse_dataclass(CompareArgs, argv, prog=prog, description=__doc__.split("\n\n")[0])

    def compare() -> int:
        if args.select not in SELECT:
            raise ConfigError(f"expected --select in {sorted(SELECT)}, got {args.select!r}")
        run_dirs = run_folders(args.runs)
        summaries = [load_summary(r) for r in run_dirs]
        names = args.names.split(",") if args.names else [_display_name(r, s) for r, s in zip(run_dirs, summaries)]
        if len(names) != len(summaries):
            raise ConfigError(f"expected {len(summaries)} names, got {len(names)}")
        if len(set(names)) != len(names):
            raise ConfigError(f"expected distinct run names, got {names}; pass --names")
        runs = list(zip(names, summaries))
        folders = dict(zip(names, run_dirs))
        warnings = setup_differences(runs)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if args.rank:
            runs.sort(key=lambda r: -(selection_score(r[1], args.select) if selection_score(r[1], args.select)
                                      is not None else float("-inf")))
        print(comparison_table(runs, args.select, args.ci))
        if args.detail:
            print()
            print(detail_table(runs, args.ci))
        paths = write_compare_reports(args.out or report_dir(run_dirs), runs, [folders[n] for n, _ in runs],
                                      args.select, args.ci, warnings)
        print(f"Wrote {paths['markdown']} and {paths['html']}" + (f" (plot: {paths['plot']})" if "plot" in paths else ""),
              file=sys.stderr)
        return 0

    return run_cli(prog, compare)


def _display_name(run_dir: str, summary: EvalSummary) -> str:
    step = checkpoint_step(summary)
    return Path(run_dir).name + (f" (step {step})" if step is not None else "")


if __name__ == "__main__":
    sys.exit(main())
