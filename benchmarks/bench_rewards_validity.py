"""Does the open-answer reward separate right from wrong answers? ROC AUCs on VQA-RAD's OPEN answers.

Runs :func:`rewards.validity.measure` (every distinct OPEN ground truth against itself and its light
paraphrases, against other questions' answers and against one-word near misses; ARMed fed in
batches of 64 so its thresholds adapt as in training) and keeps the table and each AUC as figures
for ``docs/rewards.md``. Needs ``../shared/data/vqa_rad`` (exits 1 without it, keeping the previous
results); ``--quick`` uses 60 answers and keeps nothing.

    python benchmarks/bench_rewards_validity.py [--quick] [--vqa-rad ../shared/data/vqa_rad]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)
from rewards.validity import SCORERS, describe, measure, table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vqa-rad", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "vqa_rad"))
    ap.add_argument("--negatives", type=int, default=3)
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                    "none with --quick)")
    args = ap.parse_args(argv)
    if not (Path(args.vqa_rad) / "qa.jsonl").is_file():
        print(f"VQA-RAD is not under {args.vqa_rad!r} (no qa.jsonl): nothing measured, no results written. "
              "Put the dataset there (docs/datasets.md) or pass --vqa-rad.", file=sys.stderr)
        return 1
    result = measure(Path(args.vqa_rad), 60 if args.quick else 0, args.negatives)
    cmd = command_line("bench_rewards_validity.py", argv)
    figures: dict = {"answers": result["answers"], "table": table(result)}
    for kind in ("other", "near"):
        figures.update({f"{kind}.{key}": result[kind][key] for key in SCORERS})
        figures.update({f"{kind}_pairs.{sign}": n for sign, n in result[f"{kind}_pairs"].items()})
    section = "\n".join(["## Open-answer reward validity (VQA-RAD)", "", describe(result, cmd), "", table(result), ""])
    record("rewards_validity", section, figures, cmd, results_dir_arg(args.quick, args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
