"""Training metrics: what one rollout batch says (rewards by component, accuracy, tools, group
variance) and where it goes (JSONL always, TensorBoard when installed).

>>> summarise_rewards([{"accuracy": 1.0, "format": 1.0}, {"accuracy": 0.0}])
{'reward/accuracy': 0.5, 'reward/format': 1.0}
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from train.algorithms import group_stats

log = logging.getLogger("train")


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
    out.update(mode_metrics(trajectories))
    _, std = group_stats(rewards, groups)
    per_group = {int(g): float(s) for g, s in zip(groups.tolist(), std.tolist())}
    out.update(open_answer_metrics(trajectories))
    out["groups/reward_var_mean"] = sum(s * s for s in per_group.values()) / len(per_group)
    out["groups/zero_variance_share"] = sum(s <= 1e-8 for s in per_group.values()) / len(per_group)
    return out


def mode_metrics(trajectories: Sequence[Any]) -> dict[str, float]:
    """Which mode the episodes are in (issue 42): ``rollout/call_rate`` (share of episodes with a
    tool call), the accuracy of those that called and of those that answered directly (what GRPO
    compares when it pushes calls up or down; NaN when there are none), and
    ``rollout/invalid_turn_rate`` (turns that neither called a tool nor answered, over all turns).

    >>> from types import SimpleNamespace as T
    >>> mode_metrics([T(tool_calls=["ground"], correct=True, invalid_turns=0, turn_texts=["c", "a"]),
    ...               T(tool_calls=[], correct=False, invalid_turns=1, turn_texts=["x", "a"])])
    {'rollout/call_rate': 0.5, 'rollout/accuracy_calling': 1.0, 'rollout/accuracy_direct': 0.0, 'rollout/invalid_turn_rate': 0.25}
    """
    n = len(trajectories)
    calling = [t for t in trajectories if t.tool_calls]
    direct = [t for t in trajectories if not t.tool_calls]

    def acc(ts):
        return sum(bool(t.correct) for t in ts) / len(ts) if ts else float("nan")
    turns = sum(len(t.turn_texts) for t in trajectories)
    return {"rollout/call_rate": len(calling) / max(1, n), "rollout/accuracy_calling": acc(calling),
            "rollout/accuracy_direct": acc(direct),
            "rollout/invalid_turn_rate": sum(getattr(t, "invalid_turns", 0) for t in trajectories) / max(1, turns)}


OPEN_METRICS = ("bleu1", "rouge1", "bertscore", "cosine")


def open_answer_metrics(trajectories: Sequence[Any]) -> dict[str, float]:
    """On OPEN episodes scored by ARMed: ``open/armed_avg`` (the mean of raw BLEU-1, ROUGE-1,
    BERTScore and cosine, seed 000 §6.2, as ``eval.scoring`` computes it), each metric, and
    ``open/exact_match`` (normalised). Empty when there are no such episodes.

    >>> from types import SimpleNamespace as T
    >>> open_answer_metrics([T(answer_type="OPEN", components={"bleu1": 1, "rouge1": 1, "bertscore": .6,
    ...                                                         "cosine": .4, "accuracy": 1.0}),
    ...                      T(answer_type="CLOSED", components={"accuracy": 0.0})])
    {'open/armed_avg': 0.75, 'open/bleu1': 1.0, 'open/rouge1': 1.0, 'open/bertscore': 0.6, 'open/cosine': 0.4, 'open/exact_match': 1.0, 'open/episodes': 1.0}
    """
    rows = [t.components for t in trajectories
            if str(getattr(t, "answer_type", "")).upper().endswith("OPEN") and all(m in t.components for m in OPEN_METRICS)]
    if not rows:
        return {}
    out = {"open/armed_avg": sum(sum(float(c[m]) for m in OPEN_METRICS) / len(OPEN_METRICS) for c in rows) / len(rows)}
    for m in OPEN_METRICS:
        out[f"open/{m}"] = sum(float(c[m]) for c in rows) / len(rows)
    out["open/exact_match"] = sum(float(c.get("accuracy", 0.0)) for c in rows) / len(rows)
    out["open/episodes"] = float(len(rows))
    return out


def reward_thresholds(state: Any, prefix: str = "reward/threshold_") -> dict[str, float]:
    """The adaptive thresholds in a reward's ``state_dict`` (any nesting), as ``reward/threshold_<metric>``.

    >>> reward_thresholds({"reward": {"CLOSED": {}, "OPEN": {"thresholds": {"thresholds": {"bertscore": 0.52},
    ...                                                                  "buffers": {"bertscore": [0.7]}}}}})
    {'reward/threshold_bertscore': 0.52}
    """
    found: dict[str, float] = {}
    if isinstance(state, Mapping):
        inner = state.get("thresholds")
        if isinstance(inner, Mapping) and inner and all(isinstance(v, (int, float)) for v in inner.values()):
            return {f"{prefix}{k}": float(v) for k, v in inner.items()}
        for v in state.values():
            for k, t in reward_thresholds(v, prefix).items():
                found.setdefault(k, t)
    return found


class MetricsLogger:
    """Appends one JSON object per step to ``<out>/metrics.jsonl``, mirrors scalars to TensorBoard
    (``<out>/tb``, with the run's hyper-parameters) and, with ``report_to="wandb"``, to Weights &
    Biases. Safe to reopen after a resume: ``purge_step`` (the first step the resumed run logs
    again) drops the rows and TensorBoard events a killed run wrote past its checkpoint, so no step
    appears twice; a W&B run resumes by its saved id. At :meth:`close` a finished run logs its
    hyper-parameters with its final metrics. Warns when every GRPO group of a step had zero reward
    variance (no learning signal)."""

    def __init__(self, out_dir: str | os.PathLike, tensorboard: bool = True, report_to: str = "none",
                 hparams: Mapping[str, Any] | None = None, project: str = "medvqa-gym",
                 purge_step: int | None = None) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / "metrics.jsonl"
        self.writer = None
        self.wandb = None
        self.latest: dict[str, float] = {}  # the newest value of every scalar, for the hparams table
        self.last_step = 0
        if purge_step is not None:  # a resume (or a restart): what came after the checkpoint is redone
            purge_rows(self.path, purge_step)
        targets = {t.strip().lower() for t in str(report_to or "none").split(",") if t.strip()} - {"none"}
        unknown = targets - {"wandb", "tensorboard"}
        if unknown:
            from medvqa_env.errors import ConfigError

            raise ConfigError(f"expected --report-to wandb, tensorboard or none, got {sorted(unknown)}")
        flat = flatten_hparams(hparams or {})
        if tensorboard or "tensorboard" in targets:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step: TensorBoard drops the events a killed run wrote past its checkpoint
                self.writer = SummaryWriter(str(self.out / "tb"), purge_step=purge_step)
            except ImportError:
                self.writer = None
            if self.writer is not None and flat:
                self.writer.add_text("hparams", "\n".join(f"    {k} = {v}" for k, v in flat.items()), 0)
        self.hparams = flat
        if "wandb" in targets:
            self.wandb = _start_wandb(self.out, project, hparams or {})

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if row.get("groups/zero_variance_share") == 1.0:
            log.warning("step %d: every group had zero reward variance (all rollouts of a question scored the "
                        "same), so the advantages and the policy gradient are zero; raise --group-size or "
                        "--temperature, or check that the reward can tell answers apart", step)
        scalars = {k: v for k, v in row.items()
                   if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
        self.latest.update(scalars)
        self.last_step = max(self.last_step, int(step))
        if self.writer is not None:
            for k, v in scalars.items():
                self.writer.add_scalar(k, v, step)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=int(step))

    def final_metrics(self) -> dict[str, float]:
        """The newest value of each held-out, rollout and loss scalar, as ``final/<name>``: what the
        HPARAMS tab compares runs by."""
        return {f"final/{k}": float(v) for k, v in sorted(self.latest.items())
                if k.startswith(FINAL_METRIC_PREFIXES) and not isinstance(v, bool)}

    def close(self, finished: bool = True) -> None:
        """Close the writers; a ``finished`` run writes its hyper-parameters with
        :meth:`final_metrics` (TensorBoard's HPARAMS tab; W&B's run summary)."""
        final = self.final_metrics() if finished else {}
        if self.writer is not None:
            if finished and self.hparams:
                self.writer.add_hparams(self.hparams, final, run_name=".", global_step=self.last_step)
            self.writer.close()
        if self.wandb is not None and final:
            self.wandb.summary.update(final)
        if self.wandb is not None:
            self.wandb.finish()


FINAL_METRIC_PREFIXES = ("eval/", "rollout/", "losses/")


def purge_rows(path: Path, first_purged: int) -> int:
    """Drop the rows of ``metrics.jsonl`` at or past step ``first_purged`` (what a resumed run
    writes again), atomically; returns how many went."""
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line).get("step", 0) < first_purged]
    if len(kept) != len(lines):
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return len(lines) - len(kept)


def flatten_hparams(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> ``{"args/lr": 2e-05, ...}`` with TensorBoard-safe values.

    >>> flatten_hparams({"args": {"lr": 0.1, "tools": None, "opt": ["a=1"]}})
    {'args/lr': 0.1, 'args/tools': 'None', 'args/opt': '["a=1"]'}
    """
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_hparams(v, key + "/"))
        elif isinstance(v, (bool, int, float, str)):
            out[key] = v
        else:
            out[key] = json.dumps(v, default=str) if v is not None else "None"
    return out


def _start_wandb(out: Path, project: str, config: Mapping[str, Any]):
    import uuid

    from medvqa_env.errors import ConfigError

    try:
        import wandb
    except ImportError:
        raise ConfigError("--report-to wandb needs the wandb package: pip install 'medvqa-gym[wandb]' "
                          "(or drop --report-to)") from None
    id_file = out / "wandb_id.txt"
    run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id)
    return wandb.init(project=project, id=run_id, resume="allow", dir=str(out), name=out.name,
                      config=dict(config))


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
