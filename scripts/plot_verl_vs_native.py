"""Held-out curves of verl's trainer (on CPU) beside the native trainer's, on the same task.

    python scripts/plot_verl_vs_native.py --verl RUN_DIR [--verl ...] --native RUN_DIR [--native ...] \
        --out docs/img/verl_vs_native.png --table benchmarks/runs/verl_cpu/summary.md

verl side: the validation episodes of ``<run>/episodes/*.jsonl`` (``medvqa.episode_log_dir``; what
the env computed, greedy, on the held-out parquet), per ``global_steps``: accuracy (the env's
``correct``) and mean reward. Native side: ``eval/accuracy`` and ``eval/reward_mean`` of
``<run>/metrics.jsonl`` (``train/grpo.py``). Both evaluate after the step's update; step 0 is before
training.
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
from collections import defaultdict
from pathlib import Path


def verl_curve(run: Path) -> dict[int, tuple[float, float, int]]:
    """step -> (accuracy, mean reward, episodes) over the run's validation episodes."""
    rows = defaultdict(list)
    for path in sorted((run / "episodes").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e.get("validate"):
                rows[int(e["global_steps"])].append(e)
    return {s: (sum(bool(e["correct"]) for e in es) / len(es), sum(e["env_reward"] for e in es) / len(es), len(es))
            for s, es in sorted(rows.items())}


def native_curve(run: Path) -> dict[int, tuple[float, float, int]]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "eval/accuracy" in m:
            out[int(m["step"])] = (float(m["eval/accuracy"]), float(m["eval/reward_mean"]), 0)
    return out


def main(argv=None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verl", action="append", default=[], help="a verl run folder (repeatable)")
    p.add_argument("--native", action="append", default=[], help="a native run folder (repeatable)")
    p.add_argument("--out", required=True, help="figure path (.png)")
    p.add_argument("--table", default=None, help="also write a markdown table here")
    p.add_argument("--title", default="Same task, same SFT start: verl's trainer on CPU vs the native trainer")
    args = p.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def name(run: str) -> str:
        return "/".join(Path(run).resolve().parts[-2:])

    curves = [(f"verl (CPU) {name(r)}", verl_curve(Path(r)), "tab:red") for r in args.verl]
    curves += [(f"native {name(r)}", native_curve(Path(r)), "tab:blue") for r in args.native]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, curve, color in curves:
        steps = sorted(curve)
        for ax, i in zip(axes, (0, 1)):
            ax.plot(steps, [curve[s][i] for s in steps], marker="o", label=label, color=color,
                    alpha=0.9 if "verl" in label else 0.6)
    for ax, name in zip(axes, ("held-out accuracy", "held-out reward")):
        ax.set_xlabel("GRPO step")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(args.title, fontsize=10)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    if args.table:
        lines = ["| run | step | held-out accuracy | held-out reward |", "|---|---:|---:|---:|"]
        for label, curve, _ in curves:
            lines += [f"| {label} | {s} | {a:.3f} | {r:.3f} |" for s, (a, r, _) in sorted(curve.items())]
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
