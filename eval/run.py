"""``medvqa-eval`` / ``python -m eval.run``: benchmark an agent on a dataset through the env.

Example::

    python -m eval.run --agent prior --dataset vqa_rad --dataset-opt root=../shared/data/vqa_rad \\
        --split test --out runs/prior --k 4 --workers 2

Writes ``runs/prior/episodes.jsonl`` (resumable: rerun the same command to continue), ``run.json``,
``summary.json``, ``report.md`` and ``report.html``. ``--agent`` takes a name from
``agents.registry``, ``scripted`` (the harness's zero-cost test agent) or ``package.module:Class``.
A trainer's checkpoint is evaluated as it was trained: ``--agent vlm --agent-opt model=runs/grpo/checkpoints/step_000010``
takes the checkpoint's tool turns, tools, answer protocol, prompt, chat rendering and image size
unless a flag sets them (a differing flag is warned about; see :mod:`eval.trained_settings`);
``--device cuda --dtype bfloat16`` on a GPU. Every flag is shown with its
default by ``--help``; user errors print ``medvqa-eval: error: ...`` and exit 2. Every failure (a
tool unavailable or crashed, an image not decoded, a worker crash) is named on stderr as it first
happens and again at the end, by tool, server, file and reason. A run that scored nothing, or whose
share of failed episodes is over ``--max-failure-rate`` (default 0.05), says so in one line on stderr
and exits 1 (its results and reports are written all the same).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from eval.trained_settings import given_fields
from medvqa_env.config import parse_options as _parse_options
from medvqa_env.errors import ConfigError

log = logging.getLogger("eval.run")
PROG = "medvqa-eval"


def parse_options(pairs: Sequence[str] | None, what: str = "option") -> dict[str, Any]:
    """``["k=4", "name=x", "flag=true"]`` -> ``{"k": 4, "name": "x", "flag": True}`` (JSON values
    where they parse, strings otherwise; see :mod:`medvqa_env.config`).

    >>> parse_options(["temperature=0.7", "model=Qwen/Qwen2.5-VL", "tools=[\\"a\\"]"])
    {'temperature': 0.7, 'model': 'Qwen/Qwen2.5-VL', 'tools': ['a']}
    """
    return _parse_options(list(pairs or ()), what)


def parse_tools(value: str | None) -> Any:
    """``None`` (default tools), or any spelling of :func:`tool_backends.config.load_tool_config`
    (``"a,b=engine,c=http://..."``, JSON, a file, ``none``), resolved now so a typo fails early."""
    from tool_backends.config import load_tool_config

    return None if value is None else load_tool_config(value)


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
        from medvqa_env.config import check_options

        check_options(factory, options, f"agent {name!r}")
        return factory(**options)
    try:
        from agents.registry import build_agent as registry_build
    except ImportError:
        raise ConfigError(f"unknown agent {name!r}: agents.registry is not available; use 'scripted' "
                          f"or 'package.module:Class'") from None
    return registry_build(name, **options)


@dataclass
class RunArgs:
    """What to evaluate and where (the rest of the flags are :class:`eval.runner.EvalConfig`'s)."""

    agent: str
    """agent name (agents.registry: prior, vlm, text-llm, openai, ...), ``scripted`` or ``module:Class``"""
    dataset: str
    """dataset name (vqa_rad, slake, ...) or a .jsonl manifest"""
    out: str
    """run folder (episodes.jsonl, run.json, summary.json, reports)"""
    agent_opt: list[str] = field(default_factory=list)
    """agent option ``key=value`` (repeatable), e.g. ``model=runs/grpo/checkpoints/step_000010``, ``dtype=bfloat16``"""
    dataset_opt: list[str] = field(default_factory=list)
    """loader option ``key=value`` (repeatable), e.g. ``root=/data/vqa_rad``"""
    split: str = "test"
    """split to evaluate"""
    tool_opt: list[str] = field(default_factory=list)
    """tool option ``tool.key=value`` (repeatable), e.g. ``segment.model=/models/medsam``"""
    judge_url: str | None = None
    """OpenAI-compatible base URL of an LLM judge (optional)"""
    judge_model: str = "gpt-5"
    """the judge's model name"""
    judge_api_key_env: str = "OPENAI_API_KEY"
    """environment variable holding the judge's API key"""
    judge_timeout: float = 60.0
    """seconds per judge request"""
    judge_retries: int = 2
    """retries per judge request"""
    judge_max_tokens: int = 200
    """tokens the judge may write"""
    max_failure_rate: float = field(default=0.05, metadata={"cli": {"alias": ["--max-error-rate"]}})
    """exit 1 when more than this share of the episodes failed -- a tool unavailable or crashed, an
    image not decoded, a worker crash, an env or agent error (``eval.failures``) -- or none was
    scored (1 never fails on failures, only on nothing scored; ``--max-error-rate`` is its old name)"""
    overwrite: bool = False
    """discard earlier results in --out"""
    allow_changed: str = ""
    """``tools``: evaluate a trained checkpoint although a trained tool's content hash differs from
    the one it was trained with (otherwise that stops, naming what changed)"""
    device: str | None = None
    """where a model agent runs: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` (default: the agent's, ``auto``)"""
    dtype: str | None = None
    """a model agent's weights: ``float32``, ``bfloat16``, ``float16`` (default: the agent's)"""


def make_parser():
    """The parser: :class:`RunArgs` plus every :class:`EvalConfig` field as a flag (derived, so a
    field added there is a flag here)."""
    import simple_parsing as sp

    from eval.runner import EvalConfig
    from medvqa_env.cli import add_dataclass, field_help, make_parser as project_parser

    p = project_parser(PROG, __doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    add_dataclass(p, RunArgs, "run")
    add_dataclass(p, EvalConfig, "config", overrides={
        "metrics_options": (list[str], sp.field(default_factory=list, action="append", metavar="K=V",
                                                alias=["--metrics-opt"],
                                                help=field_help(EvalConfig, "metrics_options") + " (repeatable)")),
    })
    return p


def parse(argv: Sequence[str] | None = None):
    """``(RunArgs, EvalConfig)`` from the command line."""
    from eval.runner import EvalConfig
    from medvqa_env.cli import to_instance

    ns = make_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    run = to_instance(RunArgs, ns.run)
    config = to_instance(EvalConfig, ns.config)
    config.metrics_options = parse_options(_flatten(config.metrics_options), "--metrics-opt")
    return run, config


def _flatten(items: Any) -> list[str]:
    return [x for item in items or () for x in (item if isinstance(item, list) else [item])]


def main(argv: Sequence[str] | None = None) -> int:
    from medvqa_env.cli import run_cli

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    run, config = parse(argv)
    return run_cli(PROG, lambda: _evaluate(run, config, given_fields(argv)))


def decoding_notes(agent: Any, k: int) -> list[str]:
    """What a model agent's decoding is and where it came from (printed; ``run.json``'s agent
    block records it), and a warning when pass@K cannot sample."""
    settings = getattr(agent, "request_settings", None)
    if callable(settings):  # an endpoint agent: the fields each request will carry, as sent
        sent = settings()
        shown = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in sent.items())
        lines = [f"generation settings, as each request to {getattr(agent, 'base_url', 'the endpoint')} will send "
                 f"them: {shown or 'none (the server defaults)'}"]
        if k > 1 and sent.get("temperature") is not None and sent["temperature"] <= 0:
            lines.append(f"warning: --k {k} with temperature 0 asks the same answer {k} times (pass@K = accuracy)")
        return lines
    sampling, source = getattr(agent, "sampling", None), getattr(agent, "generation_source", None)
    if not isinstance(sampling, dict) or "temperature" not in sampling:
        return []
    greedy = sampling["temperature"] <= 0
    how = "greedy" if greedy else f"sampled at temperature={sampling['temperature']}, top_p={sampling.get('top_p')}"
    where = {"checkpoint": "the checkpoint's held-out decoding, as its trainer evaluated it",
             "given": "as given", "default": "the agent's default"}.get(source)
    limit = next((f"{name}={sampling[name]}" for name in ("max_new_tokens", "max_tokens") if sampling.get(name)
                  is not None), None)
    lines = [f"decoding: {how}" + (f", {limit}" if limit else "") + (f" ({where})" if where else "")]
    if greedy and k > 1:
        lines.append(f"warning: --k {k} with greedy decoding asks the same answer {k} times (pass@K = accuracy); "
                     "sample with --agent-opt temperature=0.7")
    return lines


def _agent_options(run: RunArgs) -> dict[str, Any]:
    """``--agent-opt`` pairs, with ``--device`` / ``--dtype`` (which must agree with them)."""
    options = parse_options(run.agent_opt, "--agent-opt")
    for name in ("device", "dtype"):
        value = getattr(run, name)
        if value is None:
            continue
        if name in options and str(options[name]) != value:
            raise ConfigError(f"expected one {name}, got --{name} {value} and --agent-opt {name}={options[name]}")
        options[name] = value
    return options


def with_env_dataset(run: RunArgs, options: dict[str, Any], dataset: Any, dataset_options: dict[str, Any]) -> dict[str, Any]:
    """Agent options with the dataset as the env has it: the oracle reads the evaluated dataset
    itself (so it inherits ``--dataset-opt``, e.g. ``on_invalid=skip``; a second ``dataset=`` is
    refused), and a baseline's ``fit_on`` naming the evaluated dataset (``fit_on=vqa_rad:train``)
    is loaded with the same ``--dataset-opt``.

    >>> r = RunArgs(agent="oracle", dataset="embedded", out="x")
    >>> with_env_dataset(r, {}, "DATA", {})["dataset"]
    'DATA'
    >>> with_env_dataset(RunArgs(agent="prior", dataset="vqa_rad", out="x"), {"fit_on": "vqa_rad:train"}, None,
    ...                  {"root": "/d", "on_invalid": "skip"})["fit_on"]
    {'name': 'vqa_rad', 'split': 'train', 'root': '/d', 'on_invalid': 'skip'}
    """
    out = dict(options)
    if run.agent in ("oracle",):
        if "dataset" in out:
            raise ConfigError("the oracle reads the evaluated dataset (--dataset, --dataset-opt); drop --agent-opt "
                              f"dataset={out['dataset']!r} (one dataset config, no second copy of its options)")
        out["dataset"] = dataset
    fit_on = out.get("fit_on")
    if isinstance(fit_on, str) and fit_on.partition(":")[0] == run.dataset:
        out["fit_on"] = {"name": run.dataset, "split": fit_on.partition(":")[2] or "train", **dataset_options}
    return out


def _evaluate(run: RunArgs, config, given: set[str] | None = None) -> int:
    from eval.report import to_markdown
    from eval.runner import evaluate
    from eval.trained_settings import adopt_trained_settings, check_trained_tools, checkpoint_run_file, trained_differences
    from medvqa_env.datasets import load_dataset
    from tool_backends.config import with_tool_options

    agent = judge = None
    try:
        agent_options = _agent_options(run)
        # a trainer's checkpoint: its turns, tools, protocol unless a flag says otherwise (warned)
        trained = checkpoint_run_file(run.agent, agent_options)
        adopt_trained_settings(trained, config, given or set())
        if config.tools is not None or run.tool_opt:
            config.tools = with_tool_options(parse_tools(config.tools), run.tool_opt)
        for note in trained_differences(trained, config):
            log.warning(note)
        if "tools" not in {a.strip() for a in run.allow_changed.split(",")}:
            check_trained_tools(trained, config.tools, dataset=run.dataset)
        dataset_options = parse_options(run.dataset_opt, "--dataset-opt")
        dataset = load_dataset(run.dataset, split=run.split, **dataset_options)
        agent = build_agent(run.agent, **with_env_dataset(run, agent_options, dataset, dataset_options))
        for line in decoding_notes(agent, config.k):
            print(line, file=sys.stderr)
        if run.judge_url:
            from eval.judge import build_judge

            judge = build_judge(run.judge_url, model=run.judge_model, timeout_s=run.judge_timeout,
                                api_key_env=run.judge_api_key_env or None, max_retries=run.judge_retries,
                                max_tokens=run.judge_max_tokens)
        summary = evaluate(agent, dataset, config, out_dir=run.out, judge=judge, split=run.split,
                           overwrite=run.overwrite)
    except ValueError as e:  # a bad value the libraries report as ValueError: still a user error
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
    finally:
        if agent is not None:
            agent.close()
        if judge is not None:
            judge.close()
    print(to_markdown(summary).split("## By dataset")[0].rstrip())
    for mode, drop in summary.image_ablation.items():
        shown = {k: v for k, v in drop.items() if isinstance(v, dict) and v["normal"] is not None}
        print(f"\nimage ablation '{mode}': " + "; ".join(f"{k} {v['normal']:.3f} -> {v['ablated']:.3f}" for k, v in shown.items()))
    print(f"\nWrote {Path(run.out) / 'report.md'}, report.html, summary.json, episodes.jsonl")
    print(compare_hint(run.out))
    for line in failure_lines(summary):
        print(f"{PROG}: {line}", file=sys.stderr)
    problem = summary.scoring_problem(run.max_failure_rate)
    if problem:  # a sweep must not read an unscored run as a result
        print(f"{PROG}: {problem}; see the failures in {Path(run.out) / 'report.md'}", file=sys.stderr)
        return 1
    return 0


def failure_lines(summary) -> list[str]:
    """What failed in the run, one line per source (tool at server, file, reason), for stderr."""
    from eval.failures import describe_source

    lines = [describe_source(src) for src in summary.failure_sources]
    if summary.failure_sources_omitted:
        lines.append(f"... and {summary.failure_sources_omitted} more failure sources (summary.json, episodes.jsonl)")
    return lines


def compare_hint(out: str | Path) -> str:
    """The ``eval.compare`` command that puts this run beside the other runs in its folder (the
    same folder's runs with a ``summary.json``; a placeholder when there are none)."""
    out = Path(out)
    others = sorted(str(p.parent) for p in out.resolve().parent.glob("*/summary.json")
                    if p.parent.resolve() != out.resolve())
    runs = " ".join([str(out), *(str(out.parent / Path(o).name) for o in others)] if others else [str(out), "OTHER_RUN..."])
    return (f"Compare it with other runs: python -m eval.compare {runs} "
            f"(writes compare.md and compare.html beside them)")


if __name__ == "__main__":
    sys.exit(main())
