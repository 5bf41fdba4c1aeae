"""What a trainer says about its run at the end (issues 41 and 42): whether the policy took off,
the curves picture in the run folder, one line per held-out evaluation, and what to type after
Ctrl-C.

A run "did not take off" when its last held-out answers are one constant, or when its sampled
tool calls died (the run started with some and ended with almost none): both looked like learning
in the summary before (``distinct answers 1``), and both are what a warm start that cannot read its
tool does under GRPO.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

CALLS_DIED_BELOW = 0.05
"""Sampled tool calls per episode over the last steps below which a run's tool use "died"."""
LAST_STEPS = 5
"""How many of the last training steps the tool-call rate is averaged over."""


def constant_answer(answers_path: Path, step: int | None) -> str | None:
    """The one answer every held-out episode of ``step`` gave (untagged rows), else ``None``."""
    if step is None or not answers_path.is_file():
        return None
    answers = set()
    for line in answers_path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("step") == step and row.get("tag") is None and row.get("answer") is not None:
                answers.add(str(row.get("answer")).strip().lower())
    return next(iter(answers)) if len(answers) == 1 else None


def takeoff_flags(rows: Sequence[Mapping[str, Any]], answers_path: Path | None = None) -> list[str]:
    """The reasons a run did not take off (empty: none seen): held-out answers that are one
    constant at the last evaluation, sampled tool calls that died.

    >>> rows = [{"step": 1, "tools/calls_per_episode": 0.2}] + [{"step": s, "tools/calls_per_episode": 0.0}
    ...                                                        for s in range(2, 8)] + [{"step": 7, "eval/distinct_answers": 1.0}]
    >>> [f.split(":")[0] for f in takeoff_flags(rows)]
    ['held-out answers are one constant', 'sampled tool calls died']
    >>> takeoff_flags([{"step": 1, "tools/calls_per_episode": 0.1}, {"step": 2, "tools/calls_per_episode": 0.6,
    ...                 "eval/distinct_answers": 2.0}])
    []
    """
    flags = []
    final = next((r for r in reversed(rows) if "eval/distinct_answers" in r), None)
    if final is not None and final["eval/distinct_answers"] == 0:
        flags.append(f"no held-out question got an answer at step {final['step']}")
    elif final is not None and final["eval/distinct_answers"] == 1:
        answer = constant_answer(answers_path, final.get("step")) if answers_path is not None else None
        flags.append("held-out answers are one constant: every held-out question got "
                     + (f"'{answer}'" if answer is not None else "the same answer") + f" at step {final['step']}")
    calls = [(r["step"], r["tools/calls_per_episode"]) for r in rows
             if r.get("step", 0) > 0 and isinstance(r.get("tools/calls_per_episode"), (int, float))]
    if len(calls) > LAST_STEPS and max(c for _, c in calls) > 0:
        last = [c for _, c in calls[-LAST_STEPS:]]
        if sum(last) / len(last) < CALLS_DIED_BELOW:
            flags.append(f"sampled tool calls died: {calls[0][1]:.2f} per episode at step {calls[0][0]}, "
                         f"{sum(last) / len(last):.3f} over the last {len(last)} steps")
    return flags


def curve_panels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys a run folder's ``curves.png`` shows: what the run logged of held-out score, training
    reward, tool use and entropy (SFT: its loss)."""
    wanted = ("eval/accuracy", "eval/open/armed_avg", "rollout/reward_mean", "rollout/call_rate",
              "rollout/accuracy_calling", "rollout/accuracy_direct", "rollout/entropy", "losses/sft")
    logged = {k for r in rows for k, v in r.items() if isinstance(v, (int, float))}
    if "eval/open/armed_avg" in logged:
        logged.discard("eval/accuracy")
    if "losses/sft" in logged:  # an SFT run: its rollouts are the scripted gold ones
        logged -= {"rollout/reward_mean"}
    return [k for k in wanted if k in logged]


def write_curves(out: Path, label: str) -> Path | None:
    """``out/curves.png`` from ``out/metrics.jsonl`` (every panel :func:`curve_panels` finds);
    ``None`` when nothing was logged or matplotlib is missing."""
    from train.metrics_log import read_metrics

    path = out / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = read_metrics(path)
    panels = curve_panels(rows)
    if not panels:
        return None
    try:
        from train.plot_curves import plot
    except ImportError:
        return None
    target = out / "curves.png"
    plot({label: {str(out): rows}}, str(target), title=f"{label}: {out.name}", keys=panels)
    return target


def eval_line(step: int, metrics: Mapping[str, Any]) -> str:
    """One line per held-out evaluation.

    >>> eval_line(5, {"eval/accuracy": 0.5, "eval/reward_mean": 0.0, "eval/calls_per_episode": 0.0,
    ...               "eval/distinct_answers": 1.0})
    'held-out at step 5: accuracy 0.500, mean reward +0.000, tool calls/ep 0.00, distinct answers 1'
    """
    from train.common import HELDOUT_FIGURES

    shown = [f"{title} {metrics[f'eval/{key}']:{spec}}" for key, title, spec in HELDOUT_FIGURES
             if isinstance(metrics.get(f"eval/{key}"), (int, float))]
    return f"held-out at step {step}: " + ", ".join(shown)


def interrupted_message(prog: str, out: Path, step: int, argv: Sequence[str] | None = None) -> str:
    """What Ctrl-C prints: where the run stopped, the checkpoint it resumes from, the command."""
    from train.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(out)
    argv = list(sys.argv[1:] if argv is None else argv)
    command = f"{prog} " + " ".join(shlex.quote(a) for a in argv)
    if ckpt is None:
        return (f"{prog}: interrupted at step {step}; no checkpoint was saved yet in {out}, so a rerun starts "
                f"over: {command}")
    return (f"{prog}: interrupted at step {step}; the last checkpoint is {ckpt.resolve()} "
            f"(step {int(ckpt.name.rsplit('_', 1)[1])}); resume with the same command: {command}")
