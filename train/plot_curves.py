"""Learning curves from ``metrics.jsonl`` files: held-out accuracy, held-out reward, training reward.

    python -m train.plot_curves --runs "GRPO=runs/grpo_s*" "GRASP=runs/grasp_s*"     # -> runs/curves.png

Each ``LABEL=GLOB`` is one method; every folder the glob matches is one seed (thin line), and
the mean over seeds is the thick line. ``--panels`` picks the logged keys to draw (default: held-out
accuracy, held-out reward, training reward), e.g. the OPEN/ARMed proof::

    python -m train.plot_curves --runs "oracle=runs/open/oracle_s*" --out docs/img/open_curves.png \
        --panels eval/open/armed_avg eval/open/exact_match reward/threshold_bertscore reward/threshold_cosine

Without ``--out`` the figure goes beside the runs it draws: ``<run>/curves.png`` for one run folder,
else ``curves.png`` in the folder that holds them all (never over a committed figure by default).
A Markdown table of each panel's start and end values (mean ± std over seeds, and each seed's
end value) is printed. A ``LABEL=GLOB`` that matches no run folder (one with ``metrics.jsonl``), or a
panel no run logged, is an error (exit 2): an empty figure is never written.
"""

from __future__ import annotations

import glob
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from medvqa_env.errors import ConfigError
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
    """``{label: {folder: metrics rows}}`` for ``["LABEL=GLOB", ...]``; a spec without ``=`` or
    that matches no folder holding a ``metrics.jsonl`` is a :class:`ConfigError`."""
    runs = {}
    for spec in specs:
        label, sep, pattern = spec.partition("=")
        if not sep or not label or not pattern:
            raise ConfigError(f"expected --runs LABEL=GLOB, got {spec!r}")
        folders = sorted(glob.glob(pattern))
        runs[label] = {f: read_metrics(Path(f) / "metrics.jsonl") for f in folders if (Path(f) / "metrics.jsonl").is_file()}
        if not runs[label]:
            raise ConfigError(f"--runs {spec!r}: no folder with a metrics.jsonl matches {pattern!r} "
                              f"({len(folders)} path(s) matched)")
    return runs


DEFAULT_PANELS = ("eval/accuracy", "eval/reward_mean", "rollout/reward_mean")
TITLES = {"eval/accuracy": "held-out accuracy", "eval/reward_mean": "held-out mean reward",
          "rollout/reward_mean": "training rollout reward (5-step mean)",
          "eval/open/armed_avg": "held-out OPEN ARMed Avg", "eval/open/exact_match": "held-out OPEN exact match",
          "reward/threshold_bertscore": "ARMed threshold, BERTScore", "reward/threshold_cosine": "ARMed threshold, cosine",
          "tools/calls_per_episode": "tool calls per training episode (5-step mean)",
          "eval/calls_per_episode": "held-out tool calls per episode",
          "rollout/call_rate": "share of rollouts calling a tool (5-step mean)",
          "rollout/accuracy_calling": "rollout accuracy when calling a tool (5-step mean)",
          "rollout/accuracy_direct": "rollout accuracy when answering directly (5-step mean)",
          "rollout/entropy": "policy entropy, nats/token (5-step mean)",
          "rollout/invalid_turn_rate": "invalid turns (no call, no answer; 5-step mean)",
          "losses/sft": "SFT loss", "losses/kl": "KL to the reference"}
UNIT_RANGE = ("eval/accuracy", "eval/open/", "rollout/call_rate", "rollout/accuracy", "rollout/invalid_turn_rate",
              "eval/format_ok")
"""Panels of shares and accuracies: drawn on [0, 1], so a flat line at chance reads as one."""
SMOOTHED = ("rollout/", "tools/", "reward/reward", "open/")


def summary(runs, keys=("eval/accuracy", "eval/reward_mean")) -> str:
    """Start and end (first and last logged value) of each key: mean ± std over seeds, and each
    seed's end value."""
    lines = ["| method | seeds | metric | start | end | end per seed | wall s |", "|---|---:|---|---:|---:|---|---:|"]
    for label, by_seed in runs.items():
        walls = [series(rows, "time/wall_s")[1][-1] for rows in by_seed.values() if series(rows, "time/wall_s")[1]]
        for key in keys:
            first, last = [], []
            for rows in by_seed.values():
                _, ys = series(rows, key)
                if ys:
                    first.append(ys[0]), last.append(ys[-1])
            per_seed = ", ".join(f"{x:.3f}" for x in last)
            lines.append(f"| {label} | {len(last)} | {key} | {_ms(first)} | {_ms(last)} | {per_seed} | {_ms(walls, 0)} |")
    return "\n".join(lines)


def _ms(xs, digits: int = 3) -> str:
    if not xs:
        return "-"
    m = sum(xs) / len(xs)
    if len(xs) == 1:
        return f"{m:.{digits}f}"
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    return f"{m:.{digits}f} ± {sd:.{digits}f}"


def plot(runs, out: str, title: str = "", keys=DEFAULT_PANELS) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(keys))
    rows_ = -(-len(keys) // cols)
    fig, grid = plt.subplots(rows_, cols, figsize=(5.2 * cols, 3.9 * rows_), squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    panels = [(k, TITLES.get(k, k), k.startswith(SMOOTHED)) for k in keys]
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
            if common:  # sparse series (held-out evaluations every k steps) get a marker on each measured point
                ax.plot(common, [sum(cv[s] for cv in curves) / len(curves) for s in common], color=c, lw=2.5,
                        marker="o" if len(common) <= 12 else None, ms=4, label=f"{label} (mean of {len(curves)})")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        if key.startswith(UNIT_RANGE):
            ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def default_out(runs) -> str:
    """``curves.png`` in the one run folder drawn, else in the deepest folder that holds them all.

    >>> default_out({"a": {"runs/x/grpo_s0": []}}), default_out({"a": {"runs/x/grpo_s0": [], "runs/x/grpo_s1": []}})
    ('runs/x/grpo_s0/curves.png', 'runs/x/curves.png')
    """
    import os

    folders = [str(Path(f)) for by in runs.values() for f in by]
    base = folders[0] if len(set(folders)) == 1 else os.path.commonpath(folders)
    return str(Path(base or ".") / "curves.png")


@dataclass
class Args:
    """Learning curves from metrics.jsonl files."""

    runs: list[str] = field(default_factory=list)
    """``LABEL=GLOB`` per method (required; each folder the glob matches is one seed)"""
    out: str = ""
    """the figure (PNG); default: ``curves.png`` in the run folder (one run) or the folder holding them all"""
    title: str = ""
    """the figure's title"""
    panels: list[str] = field(default_factory=lambda: list(DEFAULT_PANELS))
    """logged keys, one panel each"""


def main(argv: list[str] | None = None) -> int:
    """``python -m train.plot_curves ...``: the figure and the table; exit 2 when nothing is found."""
    from medvqa_env.cli import parse_dataclass, run_cli

    prog = "python -m train.plot_curves"
    args = parse_dataclass(Args, argv, prog=prog, description=__doc__.split("\n\n")[0])

    def run() -> int:
        if not args.runs:
            raise ConfigError("expected --runs LABEL=GLOB [LABEL=GLOB ...]")
        runs = load_runs(args.runs)
        missing = [k for k in args.panels if not any(series(rows, k)[0] for by in runs.values() for rows in by.values())]
        if missing:
            raise ConfigError(f"--panels {missing}: no run logged these keys")
        out = args.out or default_out(runs)
        plot(runs, out, args.title, args.panels)
        print(f"wrote {out}")
        print(summary(runs, [k for k in args.panels if not k.startswith(SMOOTHED)] or args.panels))
        return 0

    return run_cli(prog, run)


if __name__ == "__main__":
    sys.exit(main())
