"""``medvqa-eval`` / ``python -m eval.run``: benchmark an agent on a dataset through the env.

Example::

    python -m eval.run --agent prior --dataset vqa_rad --dataset-opt root=../shared/data/vqa_rad \\
        --split test --out runs/prior --k 4 --workers 2

Writes ``runs/prior/episodes.jsonl`` (resumable: rerun the same command to continue), ``run.json``,
``summary.json``, ``report.md`` and ``report.html``. ``--agent`` takes a name from
``agents.registry``, ``scripted`` (the harness's zero-cost test agent) or ``package.module:Class``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from medvqa_env.errors import ConfigError

log = logging.getLogger("eval.run")


def parse_options(pairs: Sequence[str] | None, what: str = "option") -> dict[str, Any]:
    """``["k=4", "name=x", "flag=true"]`` -> ``{"k": 4, "name": "x", "flag": True}`` (JSON values
    where they parse, strings otherwise).

    >>> parse_options(["temperature=0.7", "model=Qwen/Qwen2.5-VL", "tools=[\\"a\\"]"])
    {'temperature': 0.7, 'model': 'Qwen/Qwen2.5-VL', 'tools': ['a']}
    """
    out: dict[str, Any] = {}
    for pair in pairs or ():
        if "=" not in pair:
            raise ConfigError(f"expected {what} as key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def parse_tools(value: str | None) -> Any:
    """``None`` (default tools), ``"none"`` -> ``[]``, a JSON object/list, a config file path, or
    ``"a,b"`` (local tools by name)."""
    if value is None:
        return None
    v = value.strip()
    if v.lower() in ("none", "no", "[]", ""):
        return []
    if v[0] in "{[":
        try:
            return json.loads(v)
        except json.JSONDecodeError as e:
            raise ConfigError(f"expected --tools to be valid JSON, got {v!r}: {e.msg}") from None
    if Path(v).exists():
        return str(Path(v).resolve())
    return [t.strip() for t in v.split(",") if t.strip()]


def build_agent(name: str, **options: Any):
    """``scripted``, ``package.module:Class``, or a name from ``agents.registry``."""
    if name == "scripted":
        from eval.scripted import ScriptedAgent

        return ScriptedAgent(**options)
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"cannot load agent {name!r}: {e}") from None
        return factory(**options)
    try:
        from agents.registry import build_agent as registry_build
    except ImportError:
        raise ConfigError(f"unknown agent {name!r}: agents.registry is not available; use 'scripted' "
                          f"or 'package.module:Class'") from None
    return registry_build(name, **options)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="medvqa-eval", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", required=True, help="agent name (agents.registry), 'scripted' or module:Class")
    p.add_argument("--agent-opt", action="append", default=[], metavar="K=V", help="agent option (repeatable)")
    p.add_argument("--dataset", required=True, help="dataset name (vqa_rad, slake, ...) or a .jsonl manifest")
    p.add_argument("--dataset-opt", action="append", default=[], metavar="K=V", help="loader option, e.g. root=...")
    p.add_argument("--split", default="test")
    p.add_argument("--out", required=True, help="run folder (episodes.jsonl, summary.json, reports)")
    p.add_argument("--k", type=int, default=1, help="samples per question (pass@K)")
    p.add_argument("--limit", type=int, default=None, help="first N questions only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="env worker processes (0 = in-process)")
    p.add_argument("--batch-size", type=int, default=32, help="live episodes at once")
    p.add_argument("--gather", default="all", choices=["all", "any"],
                   help="call the agent when all env workers answered (batched models) or any (API clients)")
    p.add_argument("--tools", default=None, help="tool config: file, JSON, 'a,b' or 'none' (default: built-in)")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--answer-protocol", default="boxed", choices=["boxed", "xml"])
    p.add_argument("--observation-style", default="observation_tag", choices=["observation_tag", "tool_role"])
    p.add_argument("--reward", default="rule", help="env reward recorded per episode: rule, default or a registry name")
    p.add_argument("--no-open-metrics", action="store_true", help="skip BLEU-1/ROUGE-1/BERTScore/CosSim")
    p.add_argument("--metrics-opt", action="append", default=[], metavar="K=V",
                   help="ARMedConfig field for the open metrics, e.g. bertscore_model=/models/pubmedbert")
    p.add_argument("--judge-url", default=None, help="OpenAI-compatible base URL of an LLM judge (optional)")
    p.add_argument("--judge-model", default="gpt-5")
    p.add_argument("--judge-api-key-env", default="OPENAI_API_KEY", help="env var holding the judge's API key")
    p.add_argument("--judge-timeout", type=float, default=60.0)
    p.add_argument("--judge-retries", type=int, default=2)
    p.add_argument("--judge-max-tokens", type=int, default=200)
    p.add_argument("--judge-workers", type=int, default=8)
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for CIs (0 = none)")
    p.add_argument("--retry-errors", action="store_true", help="rerun episodes that recorded an error")
    p.add_argument("--overwrite", action="store_true", help="discard earlier results in --out")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-fsync", action="store_true", help="do not fsync each row (faster, less safe)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = make_parser().parse_args(argv)
    from eval.report import to_markdown
    from eval.runner import EvalConfig, evaluate
    from medvqa_env.datasets import load_dataset

    agent = judge = None
    try:
        dataset = load_dataset(args.dataset, split=args.split, **parse_options(args.dataset_opt, "--dataset-opt"))
        agent = build_agent(args.agent, **parse_options(args.agent_opt, "--agent-opt"))
        if args.judge_url:
            from eval.judge import build_judge

            judge = build_judge(args.judge_url, model=args.judge_model, timeout_s=args.judge_timeout,
                                api_key_env=args.judge_api_key_env or None, max_retries=args.judge_retries,
                                max_tokens=args.judge_max_tokens)
        config = EvalConfig(
            k=args.k, seed=args.seed, limit=args.limit, workers=args.workers, batch_size=args.batch_size,
            gather=args.gather,
            tools=parse_tools(args.tools), max_turns=args.max_turns, answer_protocol=args.answer_protocol,
            observation_style=args.observation_style, reward=args.reward, open_metrics=not args.no_open_metrics,
            metrics_options=parse_options(args.metrics_opt, "--metrics-opt"),
            retry_errors=args.retry_errors, progress=not args.no_progress, bootstrap=args.bootstrap,
            judge_workers=args.judge_workers, fsync=not args.no_fsync)
        summary = evaluate(agent, dataset, config, out_dir=args.out, judge=judge, split=args.split,
                           overwrite=args.overwrite)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"medvqa-eval: error: {e}", file=sys.stderr)
        return 2
    finally:
        if agent is not None:
            agent.close()
        if judge is not None:
            judge.close()
    print(to_markdown(summary).split("## By dataset")[0].rstrip())
    print(f"\nWrote {Path(args.out) / 'report.md'}, report.html, summary.json, episodes.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
