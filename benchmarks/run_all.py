"""Run the benchmarks, rebuild ``BENCHMARKS.md`` and regenerate every figure the docs quote.

Each ``bench_<topic>.py`` measures something side by side with a baseline in the same run and
keeps its section and named figures in ``benchmarks/results/<topic>.{md,json}``
(:mod:`benchmarks.figures`). This script runs the chosen benchmarks (all by default, one after
another), then assembles ``--out`` (``BENCHMARKS.md``) from *every* results file (a goal table
first, then each section with the date it was measured); with ``--write-docs`` it also rewrites the
``<!-- fig ... -->`` markers in README.md, RELIABILITY.md and docs/ (only then: the repository's
docs change only when asked). A benchmark that fails is reported as failed in ``--out``; its
previous results stay.

    python benchmarks/run_all.py [--only env,tools] [--timeout 1800]   # measure, then rebuild BENCHMARKS.md
    python benchmarks/run_all.py --only env --write-docs               # ... and the docs' figures
    python benchmarks/run_all.py --docs-only                           # measure nothing: BENCHMARKS.md + docs
    python benchmarks/run_all.py --quick                               # smoke run: nothing is written
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(ROOT))  # the project (medvqa_env.cli) when run as a script

from figures import RESULTS, format_figure, load_figures, machine, update_docs  # noqa: E402

# Every bench_<topic>.py is a topic (discover()); e.g. vqarad_baselines (docs/evaluation.md's VQA-RAD tables) and
# learning / learning_early (docs/training.md's figures, derived from benchmarks/runs/).
ORDER = ["env", "tools", "rewards", "eval", "train", "load"]  # the data flow; others follow alphabetically
NOT_RUN_HERE = {"soak": "python benchmarks/soak.py --minutes 5 --fault-every 20"}

# The goals of issue 13, each read from the results: (what, figure, format, unit, baseline, goal, met?)
GOALS = [
    ("remote overhead over in-process, worst tool (image on the server)", "tools.overhead_max_ms", "+.2f", " ms",
     "in-process call, same run", "< 3 ms", lambda v: v < 3),
    ("remote `segment` overhead", "tools.segment.overhead_ms", "+.2f", " ms", "in-process call, same run", "< 3 ms",
     lambda v: v < 3),
    ("remote `ground` overhead", "tools.ground.overhead_ms", "+.2f", " ms", "in-process call, same run", "< 3 ms",
     lambda v: v < 3),
    ("open-answer rewards vs the same libraries in batches (all distinct)", "rewards.distinct.vs_batched_libraries",
     ".2f", "×", "bert-score + sentence-transformers + rouge-score/nltk, batched, same run", "≥ 3×", lambda v: v >= 3),
    ("open-answer rewards vs the same libraries in batches, per CPU-second (all distinct)",
     "rewards.distinct.vs_batched_libraries_cpu", ".2f", "×", "the same, CPU seconds", "≥ 3×", lambda v: v >= 3),
    ("open-answer rewards, all distinct, 1 torch thread (wall)", "rewards.distinct.rate", ".0f", "/s",
     "—", "≥ 600/s", lambda v: v >= 600),
    ("open-answer rewards, all distinct, 1 torch thread (per CPU-second)", "rewards.distinct.armed.cpu_rate", ".0f",
     "/s", "physical limit in the rewards section", "≥ 600/s", lambda v: v >= 600),
    ("eval harness, zero-cost agent, 2 env workers vs serial (min of 3)", "eval.zero_cost.workers_2.ratio_min", ".2f",
     "×", "serial harness, same run", "≥ 1.8×", lambda v: v >= 1.8),
    ("eval harness, same, median of 3", "eval.zero_cost.workers_2.ratio", ".2f", "×", "serial harness, same run",
     "≥ 1.8×", lambda v: v >= 1.8),
    ("eval harness, zero-cost agent, 2 env workers with `--gather any` vs serial (min of 3)",
     "eval.zero_cost.workers_2_any.ratio_min", ".2f", "×", "serial harness, same run", "≥ 1.8×", lambda v: v >= 1.8),
    ("eval harness, same, median of 3", "eval.zero_cost.workers_2_any.ratio", ".2f", "×", "serial harness, same run",
     "≥ 1.8×", lambda v: v >= 1.8),
    ("eval harness, `--gather any`: the most its CPU per episode allows on this box's cores",
     "eval.zero_cost.workers_2_any.cpu_bound", ".2f", "×", "serial wall time per episode, same run",
     "≥ 1.8× possible", lambda v: v >= 1.8),
    ("training step, SmolLM2, 16 rollouts with tool calls", "train.step_speedup", ".2f", "×",
     "the unoptimised step, same run", "≥ 3×", lambda v: v >= 3),
]


# Issue 31 (fast where users wait): start-up, a remote GRPO group, trained tools loaded once, rewards vs the ceiling
GOALS_31 = [
    ("`import medvqa_env` over a bare `import gymnasium` (wall)", "startup.import_extra_s", "+.3f", " s",
     "`import gymnasium`, fresh interpreters, same run", "< 0.3 s", lambda v: v < 0.3),
    ("cold `gym.make('MedVQA-v0')` + `reset` over a bare `import gymnasium` (wall)", "startup.make_extra_s", "+.3f",
     " s", "`import gymnasium`, fresh interpreters, same run", "< 1 s", lambda v: v < 1),
    ("the same, CPU seconds", "startup.make_extra_cpu_s", "+.3f", " s", "the same, CPU", "< 1 s", lambda v: v < 1),
    ("slowest trained tool's load (model libraries imported)", "startup.engine.load_max_s", ".3f", " s",
     "8 env copies each loading it, same run", "< 2 s", lambda v: v < 2),
    ("trained tools loaded once per process, shared by every env copy", "startup.engine.all_shared", "", "",
     "—", "yes", lambda v: v is True),
    ("remote GRPO group of 8, same call, trained SAM (server)", "group.server_sam.group_ratio", ".2f", "×",
     "one remote client, same run", "≤ 1.5×", lambda v: v <= 1.5),
    ("the same through the router", "group.router_sam.group_ratio", ".2f", "×", "one remote client via the router",
     "≤ 1.5×", lambda v: v <= 1.5),
    ("remote GRPO group of 8, same call, classical `segment` (server)", "group.server_classical.group_ratio", ".2f",
     "×", "one remote client, same run", "≤ 1.5×", lambda v: v <= 1.5),
    ("the same through the router", "group.router_classical.group_ratio", ".2f", "×",
     "one remote client via the router", "≤ 1.5×", lambda v: v <= 1.5),
    ("tool runs for a remote group of 8 identical calls (server's count)", "group.server_sam.group_calls", ".0f", "",
     "8 different calls: 8", "1", lambda v: v == 1),
    ("open-answer rewards, share of the one-thread fp32 ceiling (CPU)", "rewards_profile.share_of_ceiling", ".0%",
     "", "the ceiling, same run; else the account in its section", "≥ 90 %",
     lambda v: v >= 0.9),
]


def discover() -> list[str]:
    topics = sorted(p.stem[len("bench_"):] for p in BENCH_DIR.glob("bench_*.py"))
    return sorted(topics, key=lambda t: (ORDER.index(t) if t in ORDER else len(ORDER), t))


def run_one(topic: str, quick: bool, timeout: int) -> str | None:
    """Run one benchmark; ``None`` when it succeeded, else a note on how it failed."""
    cmd = [sys.executable, str(BENCH_DIR / f"bench_{topic}.py")] + (["--quick"] if quick else [])
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"did not finish within {timeout} s"
    if quick:
        print(proc.stdout)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        return f"exit {proc.returncode}:\n\n```\n{tail}\n```"
    return None


def goal_table(figures: dict, goals: list = GOALS, title: str = "Goals (issue 13)") -> list[str]:
    lines = [f"## {title}", "",
             "Each figure is read from `benchmarks/results/`; its baseline ran in the same benchmark run. Wall-clock "
             "goals are only meaningful from a run on an idle machine (each section records its load average).", "",
             "| goal row | measured | baseline | goal | met |", "|---|---:|---|---|---|"]
    for what, key, fmt, unit, baseline, goal, ok in goals:
        value = figures.get(key)
        shown = "not measured" if value is None else format_figure(value, fmt) + unit
        met = "—" if value is None else ("yes" if ok(value) else "**no**")
        lines.append(f"| {what} | {shown} | {baseline} | {goal} | {met} |")
    return lines + [""]


def assemble(failures: dict[str, str], out: Path) -> None:
    """Write ``out`` from every ``results/<topic>.md``, newest measurement date per section."""
    figures = load_figures()
    topics = discover()
    extra = sorted(p.stem for p in RESULTS.glob("*.md") if p.stem not in topics)
    header = ["# Benchmarks", "",
              "Assembled by `python benchmarks/run_all.py` from `benchmarks/results/` (each section says when and "
              "with which command it was measured; rerun one with `python benchmarks/run_all.py --only <topic>`).",
              f"Machine: {machine()}.", "",
              "Every figure is measured side by side with its baseline in the same run; ratios compare the two. "
              "Wall-clock figures on this shared 2-core machine move with its load (recorded per section).", ""]
    body = goal_table(figures) + goal_table(figures, GOALS_31, "Goals (issue 31)")
    for topic in topics + extra:
        md = RESULTS / f"{topic}.md"
        meta_file = RESULTS / f"{topic}.json"
        section = md.read_text().rstrip("\n") if md.is_file() else f"## {topic}\n\nNo results recorded yet."
        if meta_file.is_file():
            meta = json.loads(meta_file.read_text())["meta"]
            when = (f"*Measured {meta['date'].replace('T', ' ')}, load average {meta['load_average']} "
                    f"at the end, on {meta['machine']}.*")
            first, _, rest = section.partition("\n")
            section = f"{first}\n\n{when}\n{rest}"
        elif topic in NOT_RUN_HERE:
            section += f"\n\n*Not run by run_all.py: `{NOT_RUN_HERE[topic]}`.*"
        if topic in failures:
            section += f"\n\n**The last run of this benchmark failed** ({failures[topic]}); the figures above are older."
        body += [section, ""]
    out.write_text("\n".join(header + body).rstrip("\n") + "\n")


@dataclass
class Args:
    """Run the benchmarks and rebuild BENCHMARKS.md (and, when asked, the docs' figures)."""

    only: str = ""
    """comma-separated topics (default: all)"""
    quick: bool = False
    """short smoke runs; print them, write nothing"""
    docs_only: bool = False
    """measure nothing: rebuild --out and the docs' figures from the results"""
    write_docs: bool = False
    """also rewrite the figure markers in README.md, RELIABILITY.md and docs/"""
    timeout: int = 1800
    """seconds per benchmark"""
    out: str = str(ROOT / "BENCHMARKS.md")
    """the assembled benchmark page"""


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every chosen benchmark ran (and the docs, if written, had no problem), 1 when
    one failed, 2 for a user error (``python benchmarks/run_all.py: error: ...``)."""
    from medvqa_env.cli import parse_dataclass, run_cli
    from medvqa_env.errors import ConfigError, unknown_name_message

    prog = "python benchmarks/run_all.py"
    args = parse_dataclass(Args, argv, prog=prog, description=__doc__.split("\n\n")[0])

    def run() -> int:
        topics = discover()
        if args.only:
            wanted = [t.strip() for t in args.only.split(",") if t.strip()]
            for name in wanted:
                if name not in topics:
                    raise ConfigError(unknown_name_message("benchmark", name, topics))
            topics = [t for t in topics if t in wanted]
        if args.quick and (args.docs_only or args.write_docs):
            raise ConfigError("expected --quick (writes nothing) or --docs-only/--write-docs, got both")
        failures: dict[str, str] = {}
        if not args.docs_only:
            for topic in topics:
                print(f"[run_all] {topic} ...", file=sys.stderr, flush=True)
                problem = run_one(topic, args.quick, args.timeout)
                if problem:
                    failures[topic] = problem
                    print(f"[run_all] {topic} failed: {problem}", file=sys.stderr)
        if args.quick:
            return 1 if failures else 0
        assemble(failures, Path(args.out))
        problems = update_docs() if (args.write_docs or args.docs_only) else None
        print(f"[run_all] wrote {args.out}" + ("; docs regenerated" if problems is not None else
                                              "; docs left as they are (--write-docs rewrites their figures)")
              + (f"; problems: {problems}" if problems else ""), file=sys.stderr)
        return 1 if failures or problems else 0

    return run_cli(prog, run)


if __name__ == "__main__":
    sys.exit(main())
