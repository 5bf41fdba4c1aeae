"""Learning curves from ``metrics.jsonl`` files: held-out accuracy, held-out reward, training reward.

    python -m train.plot_curves --runs "GRPO=runs/grpo_s*" "GRASP=runs/grasp_s*" --out docs/img/learning_curves.png

Each ``LABEL=GLOB`` is one method; every folder the glob matches is one seed (thin line), and
the mean over seeds is the thick line. ``--summary`` prints a Markdown table of start/end values.
"""

from __future__ import annotations

import argparse
import glob
import math
from pathlib import Path

from train.metrics_log import read_metrics


def series(rows, key):
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
    return [p[0] for p in pts], [p[1] for p in pts]


def smooth(values, k: int = 5):
    out = []
    for i in range(len(values)):
        w = values[max(0, i - k + 1):i + 1]
        out.append(sum(w) / len(w))
    return out


def load_runs(specs):
    runs = {}
    for spec in specs:
        label, _, pattern = spec.partition("=")
        folders = sorted(glob.glob(pattern))
        runs[label] = {f: read_metrics(Path(f) / "metrics.jsonl") for f in folders if (Path(f) / "metrics.jsonl").is_file()}
    return runs


def summary(runs) -> str:
    lines = ["| method | seeds | held-out acc. start | held-out acc. end | held-out reward start | held-out reward end | wall s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, by_seed in runs.items():
        a0, a1, r0, r1, w = [], [], [], [], []
        for rows in by_seed.values():
            _, acc = series(rows, "eval/accuracy")
            _, rew = series(rows, "eval/reward_mean")
            _, wall = series(rows, "time/wall_s")
            if acc:
                a0.append(acc[0]), a1.append(acc[-1]), r0.append(rew[0]), r1.append(rew[-1])
            if wall:
                w.append(wall[-1])
        lines.append(f"| {label} | {len(a1)} | {_ms(a0)} | {_ms(a1)} | {_ms(r0)} | {_ms(r1)} | {_ms(w, 0)} |")
    return "\n".join(lines)


def _ms(xs, digits: int = 3) -> str:
    if not xs:
        return "-"
    m = sum(xs) / len(xs)
    if len(xs) == 1:
        return f"{m:.{digits}f}"
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    return f"{m:.{digits}f} ± {sd:.{digits}f}"


def plot(runs, out: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [("eval/accuracy", "held-out accuracy", False), ("eval/reward_mean", "held-out mean reward", False),
              ("rollout/reward_mean", "training rollout reward (5-step mean)", True)]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, name, sm) in zip(axes, panels):
        for c, (label, by_seed) in zip(colors, runs.items()):
            curves = []
            for rows in by_seed.values():
                x, y = series(rows, key)
                if sm:
                    y = smooth(y)
                ax.plot(x, y, color=c, alpha=0.3, lw=1)
                curves.append(dict(zip(x, y)))
            common = sorted(set.intersection(*(set(cv) for cv in curves))) if curves else []
            if common:
                ax.plot(common, [sum(cv[s] for cv in curves) / len(curves) for s in common], color=c, lw=2.5,
                        label=f"{label} (mean of {len(curves)})")
        ax.set_title(name)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", required=True, help="LABEL=GLOB per method")
    p.add_argument("--out", default="docs/img/learning_curves.png")
    p.add_argument("--title", default="")
    ns = p.parse_args(argv)
    runs = load_runs(ns.runs)
    plot(runs, ns.out, ns.title)
    print(summary(runs))


if __name__ == "__main__":
    main()
