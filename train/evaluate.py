"""``python -m train.evaluate``: a checkpoint's greedy held-out evaluation, exactly as the trainers do it.

The trainers evaluate on their ``--eval-split`` while they train; this evaluates any saved policy
(an SFT or GRPO checkpoint, ``final/``) on any split the same way -- the same env settings, the
prompt the model was saved with, greedy decoding, :func:`train.common.evaluate_heldout` -- and
stores every answer. The learning protocol (:mod:`train.protocol`) uses it to choose a warm start
on the *val* split and to measure image ablations::

    python -m train.evaluate --policy runs/sft/checkpoints/step_000040 --split val --answer-types CLOSED \\
        --tools ground=trained --max-turns 1 --eval-size 200 --out runs/sft/val_step40.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medvqa_env.cli import NONE_IS_A_VALUE, run_cli


@dataclass
class Args:
    """Greedy held-out evaluation of a saved policy (answers stored)."""

    policy: str
    """the saved policy: an HF folder a trainer wrote (``final/``, ``checkpoints/step_N``)"""
    out: str
    """JSON file for the metrics; the answers go beside it (``<out stem>.answers.jsonl``)"""
    split: str = "test"
    """split to evaluate"""
    answer_types: str = "CLOSED,MCQ"
    """question types (comma list; empty = all)"""
    eval_size: int = 64
    """questions (the first of the split's questions of those types)"""
    dataset: str = "embedded"
    """dataset name"""
    dataset_opt: list[str] = field(default_factory=list)
    """loader option ``key=value`` (repeatable)"""
    tools: str | None = field(default=None, metadata={NONE_IS_A_VALUE: True})
    """tools, as the trainers take them (default: the env's)"""
    tool_opt: list[str] = field(default_factory=list)
    """tool option ``tool.key=value`` (repeatable)"""
    reward: str | None = None
    """the env's reward (default: rule for CLOSED/MCQ, ARMed for OPEN, as in training)"""
    reward_opt: list[str] = field(default_factory=list)
    """reward option ``key=value`` (repeatable)"""
    answer_protocol: str = "boxed"
    """``boxed`` or ``xml``"""
    max_turns: int = 1
    """tool turns per episode (train.grpo's default)"""
    max_new_tokens: int = 40
    """tokens per generated turn"""
    ablations: str = ""
    """also evaluate with the images ``blank`` and/or ``shuffle``d (comma list)"""
    device: str = "cpu"
    """``cpu``, ``cuda`` or ``auto``"""
    probe_samples: int = 0
    """also probe what RL would start from (:mod:`train.probe`): the gold tool call forced, and this many
    episodes per question sampled at ``--temperature`` (0 = no probe); figures under ``probe`` in ``--out``"""
    temperature: float = 0.7
    """the probe's sampling temperature (the GRPO rollouts')"""
    seed: int = 0
    """the probe's sampling seed"""
    format_penalty: float = 0.0
    """the env's reward for a turn that neither calls a tool nor answers (as in the run evaluated)"""
    torch_threads: int = 1
    """torch CPU threads"""


def evaluate_policy(args: Args) -> dict[str, Any]:
    """Load ``args.policy``, evaluate it (and its ablations), write ``args.out`` and the answers."""
    import torch

    from medvqa_env.pool import EnvPool
    from train.common import (build_policy, evaluate_ablations, evaluate_heldout, resolved_config, run_env_kwargs,
                              select_indices)

    torch.set_num_threads(args.torch_threads)
    out = Path(args.out)
    answers = out.with_suffix(".answers.jsonl")
    answers.unlink(missing_ok=True)  # a rerun replaces, never mixes
    args.eval_split = args.split  # what run_env_kwargs and evaluate_ablations read
    indices = select_indices(args.dataset, args.split, args.answer_types, limit=args.eval_size,
                             dataset_options=args.dataset_opt)
    model, encoder, kind, _ = build_policy(args.policy, None, 0, 0, 0, need_reference=False, device=args.device)
    model.eval()
    start = time.perf_counter()
    pool = EnvPool(run_env_kwargs(args, args.split), min(len(indices), 32))
    try:
        metrics = evaluate_heldout(model, encoder, pool, indices, args.max_new_tokens, answers_path=answers, tag=None)
        probed = None
        if args.probe_samples > 0:
            from medvqa_env.datasets import load_dataset
            from medvqa_env.config import parse_options
            from train.probe import probe_model
            from train.protocol import metric_key

            dataset = load_dataset(args.dataset, split=args.split, **parse_options(args.dataset_opt, "--dataset-opt"))
            probed = probe_model(model, encoder, pool, dataset, indices, metric_key(args.answer_types),
                                 args.max_new_tokens, args.temperature, args.probe_samples, args.seed)
    finally:
        pool.close()
    metrics.update(evaluate_ablations(model, encoder, args, indices, answers, None))
    record = resolved_config(args)  # the tools it ran with by content hash (built by now), the commit, versions
    result = {"policy": str(args.policy), "kind": kind, "split": args.split, "questions": len(indices),
              "metrics": metrics, **({"probe": probed} if probed is not None else {}), "answers": answers.name, "wall_s": time.perf_counter() - start,
              "tool_identity": record["resolved"].get("tool_identity"), "provenance": record["provenance"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _f(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def main(argv: list[str] | None = None) -> int:
    from train.common import parse_args

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(Args, argv, prog="python -m train.evaluate")

    def run() -> int:
        result = evaluate_policy(args)
        m = result["metrics"]
        print(f"{args.policy} on {args.split} ({result['questions']} questions): accuracy {m['eval/accuracy']:.3f}, "
              f"reward {m['eval/reward_mean']:.3f}, {m['eval/distinct_answers']:.0f} distinct answers, "
              f"tool calls {m['eval/calls_per_episode']:.2f}/episode -> {args.out}")
        p = result.get("probe")
        if p:
            print(f"probe: forced tool call {p['forced']:.3f}, sampled (T={args.temperature}, {p['samples']}/question) "
                  f"{p['sampled']:.3f}, sampled call rate {p['call_rate']:.2f}, calling {_f(p['calling'])} vs "
                  f"direct {_f(p['direct'])}")
        return 0

    return run_cli("python -m train.evaluate", run)


if __name__ == "__main__":
    sys.exit(main())
