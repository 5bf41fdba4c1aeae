"""Training metrics: what one rollout batch says (rewards by component, accuracy, tools, group
variance) and where it goes (JSONL always, TensorBoard when installed).

>>> summarise_rewards([{"accuracy": 1.0, "format": 1.0}, {"accuracy": 0.0}])
{'reward/accuracy': 0.5, 'reward/format': 1.0}
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from train.algorithms import group_stats


def summarise_rewards(components: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean of each reward component over the rollouts that report it, as ``reward/<name>``."""
    sums: dict[str, list[float]] = defaultdict(list)
    for comp in components:
        for k, v in comp.items():
            if isinstance(v, (int, float)) and math.isfinite(float(v)):
                sums[k].append(float(v))
    return {f"reward/{k}": sum(v) / len(v) for k, v in sorted(sums.items())}


def rollout_metrics(trajectories: Sequence[Any]) -> dict[str, float]:
    """Reward, accuracy, format, tool use by tool, turns, lengths and group statistics."""
    if not trajectories:
        return {}
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    groups = torch.tensor([t.group for t in trajectories])
    n = len(trajectories)
    out: dict[str, float] = {"rollout/reward_mean": float(rewards.mean()),
                             "rollout/reward_std": float(rewards.std()) if n > 1 else 0.0}
    correct = [t.correct for t in trajectories if t.correct is not None]
    out["rollout/accuracy"] = sum(map(bool, correct)) / len(correct) if correct else float("nan")
    fmt = [t.format_ok for t in trajectories if t.format_ok is not None]
    out["rollout/format_ok"] = sum(map(bool, fmt)) / len(fmt) if fmt else float("nan")
    out.update(summarise_rewards([t.components for t in trajectories]))
    by_tool = Counter(name for t in trajectories for name in t.tool_calls)
    out["tools/calls_per_episode"] = sum(by_tool.values()) / n
    for name, c in sorted(by_tool.items()):
        out[f"tools/{name}_per_episode"] = c / n
    out["tools/error_rate"] = sum(t.tool_errors for t in trajectories) / max(1, sum(by_tool.values()))
    out["tools/latency_s"] = sum(t.tool_latency_s for t in trajectories)
    out["rollout/turns"] = sum(len(t.turn_texts) for t in trajectories) / n
    out["rollout/generated_tokens"] = sum(t.generated_tokens for t in trajectories) / n
    out["rollout/answered"] = sum(t.end_reason == "answer" for t in trajectories) / n
    _, std = group_stats(rewards, groups)
    per_group = {int(g): float(s) for g, s in zip(groups.tolist(), std.tolist())}
    out["groups/reward_var_mean"] = sum(s * s for s in per_group.values()) / len(per_group)
    out["groups/zero_variance_share"] = sum(s <= 1e-8 for s in per_group.values()) / len(per_group)
    return out


class MetricsLogger:
    """Appends one JSON object per step to ``<out>/metrics.jsonl`` and mirrors scalars to
    TensorBoard (``<out>/tb``). Safe to reopen after a resume (it appends)."""

    def __init__(self, out_dir: str | os.PathLike, tensorboard: bool = True) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / "metrics.jsonl"
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(self.out / "tb"))
            except ImportError:
                self.writer = None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.writer.add_scalar(k, v, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl``, the last one per step (a resumed run may repeat steps)."""
    rows: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["step"]] = {**rows.get(row["step"], {}), **row}
    return [rows[k] for k in sorted(rows)]
