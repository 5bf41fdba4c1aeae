"""Evaluation harness: run any agent through the env, write resumable results and reports.

>>> from eval import EvalConfig, evaluate  # doctest: +SKIP
>>> summary = evaluate(agent, dataset, EvalConfig(k=4), out_dir="runs/x")  # doctest: +SKIP
"""

from eval.runner import EvalConfig, evaluate
from eval.summary import EvalSummary, GroupSummary, MetricValue

__all__ = ["EvalConfig", "evaluate", "EvalSummary", "GroupSummary", "MetricValue"]
