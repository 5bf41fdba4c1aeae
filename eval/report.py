"""Reports of a run: ``summary.json`` (the :class:`EvalSummary`), ``report.md`` and ``report.html``
(the same tables plus plots, drawn with matplotlib and embedded as PNG)."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from eval.summary import EvalSummary, GroupSummary, MetricValue
from eval.usage import usage_lines

RUN_TOOL_KINDS = ("tool_unavailable", "tool_crash")
MAX_LISTED = 50
FIGURE_MAX_PX = 1200  # report.html's page width: no figure is wider  # failed episodes listed in report.md / report.html

# (field, column title, is a percentage)
HEADLINE = (
    ("closed_accuracy", "CLOSED acc", True), ("mcq_accuracy", "MCQ acc", True),
    ("armed_open_avg", "OPEN ARMed Avg", True), ("open_exact_match", "OPEN EM", True),
    ("exact_match", "EM (all)", True), ("judge_accuracy", "Judge", True),
    ("pass_at_1", "pass@1", True), ("pass_at_k", "pass@K", True),
)
OPEN_TABLE = (("bleu1", "BLEU-1"), ("rouge1", "ROUGE-1"), ("bertscore", "BERTScore"), ("cossim", "CosSim"),
              ("armed_open_avg", "ARMed Avg"))
SAMPLING = (("pass_at_1", "pass@1"), ("pass_at_k", "pass@K"), ("format_failure_at_k", "format failure@K"),
            ("unique_answers_at_k", "unique answers@K"), ("format_error_rate", "format errors / episode"),
            ("no_answer_rate", "no answer"), ("error_rate", "episode errors"), ("mean_reward", "mean reward"))
TOOLS = (("turns_per_episode", "turns / ep"), ("tool_calls_per_episode", "tool calls / ep"),
         ("invalid_call_rate", "invalid-call rate"), ("tool_error_rate", "tool error rate"))


def fmt(m: MetricValue, ci: bool = True, digits: int = 3) -> str:
    """``0.612 [0.571, 0.650]`` or ``–`` when the metric does not apply.

    >>> fmt(MetricValue(0.5, 0.4, 0.6, 10))
    '0.500 [0.400, 0.600]'
    >>> fmt(MetricValue())
    '–'
    """
    if m.value is None:
        return "–"
    s = f"{m.value:.{digits}f}"
    if ci and m.ci_low is not None:
        s += f" [{m.ci_low:.{digits}f}, {m.ci_high:.{digits}f}]"
    return s


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows]
    return out


def _groups(summary: EvalSummary) -> list[tuple[str, Mapping[str, GroupSummary]]]:
    return [("Dataset", summary.by_dataset), ("Answer type", summary.by_answer_type),
            ("Modality", summary.by_modality), ("Organ", summary.by_organ)]


def tables(summary: EvalSummary) -> list[tuple[str, list[str], list[list[str]]]]:
    """Every table of the report as ``(title, header, rows)`` (shared by Markdown and HTML)."""
    out = []
    overall = {"all": summary.overall}
    counts = ["episodes", "scored", "errors"]
    out.append(("Headline (95% bootstrap CI over questions)", ["Slice", *counts, *[t for _, t, _ in HEADLINE]],
                [[name, *_counts(g), *[fmt(getattr(g, f)) for f, _, _ in HEADLINE]]
                 for name, g in {**overall, **summary.by_answer_type}.items()]))
    for title, groups in _groups(summary):
        out.append((f"By {title.lower()}", [title, *counts, *[t for _, t, _ in HEADLINE[:6]]],
                    [[name, *_counts(g), *[fmt(getattr(g, f), ci=False) for f, _, _ in HEADLINE[:6]]]
                     for name, g in groups.items()]))
    open_groups = {"all": summary.overall, **summary.by_dataset}
    out.append(("OPEN answers: ARMed metrics (seed 000 §6.2)", ["Slice", *[t for _, t in OPEN_TABLE]],
                [[name, *[fmt(getattr(g, f)) for f, _ in OPEN_TABLE]] for name, g in open_groups.items()]))
    out.append((f"Sampling (K = {summary.k}; seed 004)", ["Slice", *[t for _, t in SAMPLING]],
                [[name, *[fmt(getattr(g, f), ci=False) for f, _ in SAMPLING]] for name, g in open_groups.items()]))
    tools = sorted(summary.overall.tool_calls_by_tool)
    out.append(("Tool use", ["Slice", *[t for _, t in TOOLS], *[f"{t} / ep" for t in tools]],
                [[name, *[fmt(getattr(g, f), ci=False) for f, _ in TOOLS],
                  *[fmt(g.tool_calls_by_tool.get(t, MetricValue(0.0)), ci=False) for t in tools]]
                 for name, g in {**overall, **summary.by_answer_type}.items()]))
    if summary.answer_diversity:
        out.append(("Answers given (a constant answer shows here)", ["Slice", "answers", "distinct", "entropy (bits)",
                                                                     "most common", "its share"],
                    [[name, str(d["answers"]), str(d["distinct"]), f"{d['entropy_bits']:.3f}", str(d["top_answer"]),
                      f"{d['top_share']:.3f}"] for name, d in summary.answer_diversity.items()]))
    for mode, drop in summary.image_ablation.items():
        out.append((f"Image ablation: {mode} (the same run with the images {'blanked' if mode == 'blank' else 'swapped'}; "
                    f"ablation_{mode}/)", ["Metric", "normal", "ablated", "drop"],
                    [[name, *("–" if v[key] is None else f"{v[key]:.3f}" for key in ("normal", "ablated", "drop"))]
                     for name, v in drop.items() if isinstance(v, dict) and v["normal"] is not None]))
    if summary.failures:
        total, shown = len(summary.failures) + summary.failures_omitted, summary.failures[:MAX_LISTED]
        rest = f"; the first {len(shown)} listed, all in episodes.jsonl" if total > len(shown) else ""
        out.append((f"Failed episodes ({total}{rest})", ["Record", "sample", "error", "scored", "message"],
                    [[f["record_id"], str(f["sample"]), f["kind"], "as wrong" if f["scored"] else "no", f["message"]]
                     for f in shown]))
    return out


def _counts(g: GroupSummary) -> list[str]:
    return [str(g.n_episodes), str(g.n_scored), str(g.n_errors)]


def _run_lines(summary: EvalSummary) -> list[str]:
    run = summary.run
    agent = run.get("agent", {})
    t = summary.timing
    lines = [f"- agent: `{json.dumps(agent, sort_keys=True)}`",
             f"- dataset: `{run.get('dataset')}` split `{run.get('split')}`, {summary.n_questions} questions, "
             f"K = {summary.k}, {summary.n_episodes} episodes ({summary.overall.n_scored} scored), "
             f"seed {run.get('seed')}",
             f"- tools: `{json.dumps(run.get('tools'))}`, max turns {run.get('max_turns')}, "
             f"answer protocol `{run.get('answer_protocol')}`",
             f"- errors: {json.dumps(summary.errors_by_kind) if summary.errors_by_kind else 'none'}; "
             f"failed episodes: {summary.n_failed}"
             + (f" {json.dumps(summary.failed_by_kind)}" if summary.failed_by_kind else ""),
             f"- metrics available: {json.dumps(summary.metrics_available)}"]
    lines += usage_lines(run, summary.usage)
    if t.get("episodes_per_s"):
        lines.append(f"- throughput (last invocation): {t['episodes_per_s']:.2f} episodes/s over {t.get('wall_s', 0):.1f} s")
    return lines


def errors_line(summary: EvalSummary) -> str:
    """The report's first line: what was not measured (errors by kind, skipped dataset rows).

    >>> errors_line(EvalSummary(n_episodes=5, n_scored=3, n_errors=2, errors_by_kind={"dataset_error": 2},
    ...                         n_skipped_records=1, skipped_by_reason={"empty answer": 1}))
    'Errors: 2 of 5 episodes (dataset_error 2); 3 scored. Dataset rows skipped by the loader: 1 (empty answer 1).'
    >>> errors_line(EvalSummary(n_episodes=4, n_scored=4))
    'Errors: none; 4 of 4 episodes scored.'
    >>> errors_line(EvalSummary(n_episodes=4, n_scored=4, run={"dataset_provenance": {"n_skipped": 0}}))
    'Errors: none; 4 of 4 episodes scored. Dataset rows skipped by the loader: 0.'
    """
    kinds = ", ".join(f"{k} {n}" for k, n in summary.errors_by_kind.items())
    tool_kinds = {k: n for k, n in summary.failed_by_kind.items() if k in RUN_TOOL_KINDS}
    prefix = ""
    if tool_kinds:  # tools that died under scored episodes: said first, never "Errors: none" alone
        listed = ", ".join(f"{k} {n}" for k, n in sorted({**summary.errors_by_kind, **tool_kinds}.items())
                           if k != "judge_error")
        prefix = f"Failures: {summary.n_failed} of {summary.n_episodes} episodes ({listed}). "
    if summary.n_errors:
        line = f"Errors: {summary.n_errors} of {summary.n_episodes} episodes ({kinds}); {summary.n_scored} scored."
    else:
        line = (f"Errors: none{' (' + kinds + ')' if kinds else ''}; {summary.n_scored} of {summary.n_episodes} "
                f"episodes scored.")
    if summary.n_skipped_records:
        reasons = ", ".join(f"{k} {n}" for k, n in summary.skipped_by_reason.items())
        line += f" Dataset rows skipped by the loader: {summary.n_skipped_records} ({reasons})."
    elif summary.run.get("dataset_provenance") is not None:  # a loader's dataset: its count, even 0
        line += " Dataset rows skipped by the loader: 0."
    return prefix + line


def failure_list(summary: EvalSummary) -> list[str]:
    """The report's second block: every failure source named (tool, server, file, reason), or nothing."""
    from eval.failures import describe_source

    lines = [describe_source(src) for src in summary.failure_sources]
    if summary.failure_sources_omitted:
        lines.append(f"... and {summary.failure_sources_omitted} more (summary.json, episodes.jsonl)")
    return lines


def to_markdown(summary: EvalSummary, title: str | None = None) -> str:
    lines = [f"# {title or 'Evaluation: ' + str(summary.run.get('agent', {}).get('name', 'agent'))}", "",
             f"**{errors_line(summary)}**", ""]
    failed = failure_list(summary)
    if failed:
        lines += ["What failed:", "", *[f"- {line}" for line in failed], ""]
    lines += [*_run_lines(summary), ""]
    for name, header, rows in tables(summary):
        lines += [f"## {name}", "", *_md_table(header, rows), ""]
    return "\n".join(lines)


# ---- plots --------------------------------------------------------------------------------------
def _has_values(values: Sequence[MetricValue]) -> bool:
    return any(v.value is not None for v in values)


def _bar(ax, labels: Sequence[str], values: Sequence[MetricValue], title: str) -> None:
    import numpy as np

    kept = [(label, v) for label, v in zip(labels, values) if v.value is not None]  # n/a: no bar
    labels, values = [label for label, _ in kept], [v for _, v in kept]
    ys = [v.value for v in values]
    lo = [max(0.0, y - v.ci_low) if v.ci_low is not None else 0.0 for y, v in zip(ys, values)]
    hi = [max(0.0, v.ci_high - y) if v.ci_high is not None else 0.0 for y, v in zip(ys, values)]
    x = np.arange(len(labels))
    ax.bar(x, ys, yerr=[lo, hi], capsize=3, color="#4C72B0")
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def plots(summary: EvalSummary) -> dict[str, bytes]:
    """PNG bytes by name: headline metrics, accuracy by slice, ARMed metrics, tool calls by tool.
    A plot (or a panel of the by-slice plot) with nothing to show is not drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, bytes] = {}

    def save(fig, name):
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        out[name] = buf.getvalue()

    def bar_plot(name, labels, values, title, size=(6, 3.5)):
        if _has_values(values):
            fig, ax = plt.subplots(figsize=size)
            _bar(ax, labels, values, title)
            save(fig, name)

    g = summary.overall
    bar_plot("headline", [t for _, t, _ in HEADLINE], [getattr(g, f) for f, _, _ in HEADLINE],
             "Headline metrics (95% CI)", (7, 3.5))
    panels = [(title, list(groups), [groups[n].armed_score for n in groups]) for title, groups in _groups(summary)]
    panels = [p for p in panels if _has_values(p[2]) and not (len(p[1]) == 1 and p[1][0] == "unknown")]
    if panels:  # at most two panels a row: the figure fits the page (FIGURE_MAX_PX wide)
        cols = min(2, len(panels))
        rows = -(-len(panels) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.5 * cols, 3.5 * rows), squeeze=False)
        for ax, (title, names, values) in zip(axes.flat, panels):
            _bar(ax, names, values, f"ARMed score by {title.lower()}")
            ax.set_ylim(0, 1.05)  # one scale for every panel
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        save(fig, "by_slice")
    bar_plot("open_metrics", [t for _, t in OPEN_TABLE], [getattr(g, f) for f, _ in OPEN_TABLE],
             "OPEN answers: ARMed metrics")
    tools = sorted(g.tool_calls_by_tool)
    if tools:  # rates of no calls at all say nothing
        bar_plot("tools", tools + ["invalid rate", "error rate"],
                 [g.tool_calls_by_tool[t] for t in tools] + [g.invalid_call_rate, g.tool_error_rate],
                 "Tool use (calls / episode, rates)")
    return out


def to_html(summary: EvalSummary, images: Mapping[str, bytes], title: str | None = None) -> str:
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<title>{esc(title or 'MedVQA-Gym evaluation')}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
             "img{max-width:100%;height:auto}"
             "table{border-collapse:collapse;margin-bottom:1.5em;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}</style></head><body>",
             f"<h1>{esc(title or 'Evaluation: ' + str(summary.run.get('agent', {}).get('name', 'agent')))}</h1>",
             f"<p><strong>{esc(errors_line(summary))}</strong></p>"]
    failed = failure_list(summary)
    if failed:
        parts += ["<p>What failed:</p><ul>", *[f"<li>{esc(line)}</li>" for line in failed], "</ul>"]
    parts.append("<ul>")
    parts += [f"<li>{esc(line[2:]).replace('`', '')}</li>" for line in _run_lines(summary)]
    parts.append("</ul>")
    for name, png in images.items():
        parts.append(f"<img alt='{esc(name)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
    for name, header, rows in tables(summary):
        parts.append(f"<h2>{esc(name)}</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows]
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_reports(out_dir: str | Path, summary: EvalSummary, with_plots: bool = True) -> dict[str, Path]:
    """Write ``summary.json``, ``report.md``, ``report.html`` (and ``plots/*.png``) into ``out_dir``."""
    from eval.results import sanitize

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"summary": out / "summary.json", "markdown": out / "report.md", "html": out / "report.html"}
    paths["summary"].write_text(json.dumps(sanitize(summary.to_dict()), indent=2, ensure_ascii=False) + "\n")
    paths["markdown"].write_text(to_markdown(summary) + "\n")
    images: dict[str, bytes] = {}
    if with_plots:
        images = plots(summary)
        (out / "plots").mkdir(exist_ok=True)
        for name, png in images.items():
            (out / "plots" / f"{name}.png").write_bytes(png)
    paths["html"].write_text(to_html(summary, images))
    return paths


def load_summary(run_dir: str | Path) -> EvalSummary:
    path = Path(run_dir)
    if path.is_dir():
        path = path / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"expected a run folder with summary.json, got {str(run_dir)!r}")
    return EvalSummary.from_dict(json.loads(path.read_text()))
