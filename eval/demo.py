"""The main job on the embedded default: probe the tools in one episode, then evaluate baselines.

``bash scripts/demo.sh`` (or ``python -m eval.demo``) does, with nothing downloaded:

1. one episode on the embedded synthetic set with a tool-using agent, printed turn by turn and
   rendered to ``outputs/demo/episode.png`` (image, tool regions and masks, transcript);
2. an evaluation of baselines -- random, answer prior, a tool-then-answer heuristic with classical
   tools and with oracle tools (how much better tools help), and the oracle agent (annotations: an
   upper bound) -- over the embedded test split through the same env and reward, with reports
   under ``outputs/demo/<run>/`` and a side-by-side table on stdout; ``--trained-tools`` adds a
   row with ``ground`` and ``classify`` trained on the embedded train split (built on first use).

The figures are baselines on synthetic phantoms, not medical claims.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from PIL import Image

from agents.registry import build_agent
from eval.compare import comparison_table
from eval.runner import EvalConfig, evaluate
from medvqa_env.chat import Conversation
from medvqa_env.datasets import load_dataset
from medvqa_env.env import MedVQAEnv

CLASSICAL_TOOLS = {"image_zoom_in": "local", "segment": {"engine": "classical"}, "ground": {"engine": "classical"}}
ORACLE_TOOLS = {"image_zoom_in": "local", "segment": {"engine": "oracle"}, "ground": {"engine": "oracle"},
                "classify": {"engine": "oracle"}}
# (run name, agent name, tool config): the same heuristic agent with classical and with oracle
# tools shows how much better tools help; the oracle agent reads the annotations (upper bound).
RUNS = (
    ("random", "random", CLASSICAL_TOOLS),
    ("prior", "prior", CLASSICAL_TOOLS),
    ("tools(classical)", "zoom-then-answer", CLASSICAL_TOOLS),
    ("tools(oracle)", "zoom-then-answer", ORACLE_TOOLS),
    ("oracle agent", "oracle", CLASSICAL_TOOLS),
)
TRAINED_RUN = "tools(trained)"
"""The row ``--trained-tools`` adds: the same heuristic agent with ``ground`` and ``classify`` trained
on the embedded train split (the ``trained`` engines: built on first use, a few CPU minutes, then
cached), between the classical and the oracle tools."""


def trained_tools(options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The tool config of the trained row; ``options`` go to both trained engines (the tests train
    them for a few steps on a few images)."""
    extra = dict(options or {})
    return {"image_zoom_in": "local", "segment": {"engine": "classical"},
            "ground": {"engine": "trained", **extra}, "classify": {"engine": "trained", **extra}}


def demo_runs(trained: Mapping[str, Any] | None = None) -> tuple:
    """:data:`RUNS`, with the trained-tools row after ``tools(oracle)`` when ``trained`` is given
    (the trained engines' options; ``{}`` for their defaults)."""
    if trained is None:
        return RUNS
    row = (TRAINED_RUN, "zoom-then-answer", trained_tools(trained))
    return RUNS[:4] + (row,) + RUNS[4:]


def probe_episode(out_dir: Path, index: int) -> None:
    """One episode, printed and rendered: what a person probing tools in a notebook sees."""
    env = MedVQAEnv(dataset="embedded", split="test", tools=CLASSICAL_TOOLS, render_mode="rgb_array")
    agent = build_agent("zoom-then-answer", fit_on={"name": "embedded", "split": "train"})
    obs, info = env.reset(seed=0, options={"index": index})
    conv = Conversation.start(obs, info)
    print(f"Question ({info['answer_type']}, {info['modality']}): {info['question']}")
    terminated = truncated = False
    reward = 0.0
    while not (terminated or truncated):
        action = agent.act(conv)
        obs, reward, terminated, truncated, step_info = env.step(action)
        print(f"\n-- turn {step_info['turn']}: agent\n{action.strip()}")
        if obs["text"]:
            print(f"-- env\n{obs['text']}")
        conv.add_turn(action, obs)
    print(f"\nAnswer {step_info['answer']!r}, ground truth {step_info['ground_truth']!r}, reward {reward:+.1f}")
    path = out_dir / "episode.png"
    Image.fromarray(env.render()).save(path)
    print(f"Rendered episode: {path}")
    env.close()


def evaluate_baselines(out: Path, limit: int | None = None, workers: int = 2,
                       trained: Mapping[str, Any] | None = None) -> list[tuple[str, object]]:
    """Each baseline of :func:`demo_runs` evaluated on the embedded test split: ``[(run name, EvalSummary)]``."""
    test = load_dataset("embedded", split="test")
    train = load_dataset("embedded", split="train")
    runs = []
    for run_name, agent_name, tools in demo_runs(trained):
        options = {"dataset": test} if agent_name == "oracle" else {"fit_on": train} if agent_name != "random" else {}
        agent = build_agent(agent_name, **options)
        config = EvalConfig(limit=limit, workers=workers, tools=tools)
        run_dir = out / run_name.replace("(", "_").replace(")", "").replace(" ", "_")
        start = time.perf_counter()
        summary = evaluate(agent, test, config, out_dir=run_dir, overwrite=True)
        print(f"{run_name}: {summary.n_episodes} episodes in {time.perf_counter() - start:.1f} s -> {run_dir}/report.md",
              file=sys.stderr)
        runs.append((run_name, summary))
    return runs


@dataclass
class Args:
    """The demo: one probe episode with tools, then the baselines evaluated."""

    out: str = "outputs/demo"
    """folder for the picture and the reports"""
    limit: int | None = None
    """questions per baseline (default: the whole test split)"""
    workers: int = 2
    """env worker processes for the evaluation"""
    index: int = 0
    """which test question the probe episode uses"""
    trained_tools: bool = False
    """add a row with ground and classify trained on the embedded train split (built on first use:
    a few CPU minutes, then cached)"""


def main(argv: list[str] | None = None) -> int:
    """``medvqa-demo`` / ``python -m eval.demo``; user errors are ``medvqa-demo: error: ...`` (exit 2)."""
    from medvqa_env.cli import parse_dataclass, run_cli

    prog = "medvqa-demo"
    args = parse_dataclass(Args, argv, prog=prog, description=__doc__)
    return run_cli(prog, lambda: _demo(args))


def _demo(args: Args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    print("== 1. Probe: one episode with tools on the embedded default ==\n")
    probe_episode(out, args.index)

    print("\n== 2. Evaluate baselines on the embedded test split ==")
    if args.trained_tools:
        print("(--trained-tools: the trained ground and classify are built on first use -- a few CPU minutes, "
              "then cached)", file=sys.stderr)
    runs = evaluate_baselines(out, args.limit, args.workers, {} if args.trained_tools else None)
    print("\n" + comparison_table(runs))
    if not args.trained_tools:
        print(f"\n(Add --trained-tools for a {TRAINED_RUN} row: the same agent with ground and classify trained "
              "on the embedded train split; building them takes a few CPU minutes on first use.)")
    print("\n(Baselines on synthetic phantoms: a check that the env, tools and rewards work, not a medical claim.)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
