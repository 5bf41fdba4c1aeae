"""The demo's baseline table (``bash scripts/demo.sh``), recorded so the README quotes it from a run.

Runs :func:`eval.demo.evaluate_baselines` -- the same five baselines on the embedded default's test
split, through the same env, tools and reward -- and keeps each run's overall metrics as named
figures (``benchmarks/results/demo.json``: ``<run>.<metric>``).

    python benchmarks/bench_demo.py [--limit N] [--quick] [--trained-tools]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.compare import COLUMNS, comparison_table  # noqa: E402
from eval.demo import RUNS, TRAINED_RUN, evaluate_baselines  # noqa: E402
from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

RUN_KEYS = {name: key for (name, _, _), key in zip(RUNS, ("random", "prior", "tools_classical", "tools_oracle",
                                                           "oracle_agent"))}
RUN_KEYS[TRAINED_RUN] = "tools_trained"


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="questions per baseline (default: the whole test split)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="20 questions, nothing recorded")
    ap.add_argument("--trained-tools", action="store_true",
                    help="add the row with ground and classify trained on the embedded train split (built on first "
                         "use: a few CPU minutes)")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = ap.parse_args(argv)
    limit = 20 if args.quick else args.limit
    with tempfile.TemporaryDirectory() as tmp:
        runs = evaluate_baselines(Path(tmp), limit, args.workers, {} if args.trained_tools else None)
    figures = {}
    for name, summary in runs:
        key = RUN_KEYS[name]
        figures[f"{key}.episodes"] = summary.n_episodes
        for field, _ in COLUMNS:
            value = getattr(summary.overall, field, None)
            figures[f"{key}.{field}"] = getattr(value, "value", None)
    section = "\n".join(["## The demo's baselines (embedded default, test split)", "",
                         "`bash scripts/demo.sh` prints this table; the README quotes it from here.", "",
                         comparison_table(runs), ""])
    record("demo", section, figures, command_line("bench_demo.py", argv), results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
