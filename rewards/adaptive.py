"""ARMed's adaptive thresholds (seed 000 §4.2): a running buffer per metric and a bounded drift.

For each semantic metric (``bertscore``, ``cosine``) we keep the last ``buffer_size`` raw scores.
A batch is scored against the thresholds *as they were before the batch*; then its scores enter
the buffer and each threshold moves toward the buffer's ``percentile`` by at most ``delta_max``:

    T_t = clip(T_{t-1} + clip(P_q(buffer) - T_{t-1}, -delta_max, +delta_max), t_min, t_max)

So within a batch the order of samples does not matter, and a threshold needs several batches
to cross the typical range (no jump from one odd batch).

>>> round(squash(0.9, 0.5, alpha_pos=5.0, alpha_neg=5.0), 4)   # above T: 0.5 + 0.5(1 - e^{-5*0.4})
0.9323
>>> round(squash(0.3, 0.5, alpha_pos=5.0, alpha_neg=5.0), 4)   # below T: 0.5 e^{5*(-0.2)}
0.1839
>>> squash(0.5, 0.5, 5.0, 5.0)
0.5
>>> t = AdaptiveThresholds(AdaptiveConfig(delta_max=0.05, init={"cosine": 0.5}), metrics=["cosine"])
>>> t.step({"cosine": [0.9, 0.9, 0.9]})       # returns the thresholds used for this batch
{'cosine': 0.5}
>>> t.thresholds                              # moved toward the median 0.9 by at most 0.05
{'cosine': 0.55}
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np


def squash(x: float, t: float, alpha_pos: float, alpha_neg: float) -> float:
    """Seed 000's R_adapt: ``0.5 + 0.5(1 - e^{-a+(x-T)})`` if ``x >= T`` else ``0.5 e^{a-(x-T)}``."""
    if x >= t:
        return 0.5 + 0.5 * (1.0 - math.exp(-alpha_pos * (x - t)))
    return 0.5 * math.exp(alpha_neg * (x - t))


@dataclass
class AdaptiveConfig:
    """Constants of the adaptive thresholds. Seed 000 fixes ``buffer_size``, ``t_min``, ``t_max``;
    the rest are our choices (see docs/rewards.md)."""

    buffer_size: int = 256
    """How many recent raw scores per metric the buffer holds (seed: 256)."""
    percentile: float = 50.0
    """Which percentile of the buffer the threshold drifts toward (seed: "the running median")."""
    delta_max: float = 0.01
    """Largest move of a threshold per update (per scored batch)."""
    t_min: float = 0.0
    """Lower clip of a threshold (seed: 0.0)."""
    t_max: float = 0.95
    """Upper clip of a threshold (seed: 0.95)."""
    alpha_pos: float = 5.0
    """Steepness of the squashing above the threshold."""
    alpha_neg: float = 5.0
    """Steepness of the squashing below the threshold."""
    init: Mapping[str, float] = field(default_factory=lambda: {"bertscore": 0.5, "cosine": 0.5})
    """Initial threshold per metric (before any data); a metric missing here starts at 0.5."""

    def __post_init__(self) -> None:
        if self.buffer_size < 1:
            raise ValueError(f"expected buffer_size >= 1, got {self.buffer_size!r}")
        if not 0.0 <= self.percentile <= 100.0:
            raise ValueError(f"expected percentile in [0, 100], got {self.percentile!r}")
        if self.delta_max < 0:
            raise ValueError(f"expected delta_max >= 0, got {self.delta_max!r}")
        if not self.t_min <= self.t_max:
            raise ValueError(f"expected t_min <= t_max, got {self.t_min!r} > {self.t_max!r}")
        if self.alpha_pos <= 0 or self.alpha_neg <= 0:
            raise ValueError(f"expected alpha_pos, alpha_neg > 0, got {self.alpha_pos!r}, {self.alpha_neg!r}")


class AdaptiveThresholds:
    """The buffers and thresholds of one ARMed reward (in-process owner).

    ``step(values)`` is the only mutating call: it returns the thresholds to score this batch
    with and then absorbs the batch. A Ray deployment wraps this object in one named actor
    (:mod:`rewards.adaptive_ray`) so that every worker goes through the same ``step``.
    """

    def __init__(self, config: AdaptiveConfig | None = None, metrics: Sequence[str] = ("bertscore", "cosine")) -> None:
        self.config = config or AdaptiveConfig()
        self.metrics = tuple(metrics)
        self.buffers = {m: deque(maxlen=self.config.buffer_size) for m in self.metrics}
        self.thresholds = {m: self._clip(float(self.config.init.get(m, 0.5))) for m in self.metrics}
        self.updates = 0

    def _clip(self, t: float) -> float:
        return min(max(t, self.config.t_min), self.config.t_max)

    def step(self, values: Mapping[str, Sequence[float]]) -> dict[str, float]:
        """Thresholds for this batch (before the update), then add ``values`` and drift."""
        unknown = set(values) - set(self.metrics)
        if unknown:
            raise ValueError(f"expected metrics among {list(self.metrics)}, got {sorted(unknown)!r}")
        used = dict(self.thresholds)
        changed = False
        for m, xs in values.items():
            xs = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
            if not xs:
                continue
            self.buffers[m].extend(xs)
            target = float(np.percentile(np.fromiter(self.buffers[m], float), self.config.percentile))
            t = self.thresholds[m]
            move = min(max(target - t, -self.config.delta_max), self.config.delta_max)
            self.thresholds[m] = self._clip(t + move)
            changed = True
        self.updates += int(changed)
        return used

    def peek(self) -> dict[str, float]:
        return dict(self.thresholds)

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": {**asdict(self.config), "init": dict(self.config.init)},
            "thresholds": dict(self.thresholds),
            "buffers": {m: list(b) for m, b in self.buffers.items()},
            "updates": self.updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore thresholds and buffers (the config stays the one this object was built with)."""
        try:
            thresholds, buffers = state["thresholds"], state["buffers"]
        except (KeyError, TypeError):
            raise ValueError(f"expected a state with 'thresholds' and 'buffers', got {state!r:.200}") from None
        for m in self.metrics:
            if m in thresholds:
                self.thresholds[m] = self._clip(float(thresholds[m]))
            if m in buffers:
                self.buffers[m] = deque((float(x) for x in buffers[m]), maxlen=self.config.buffer_size)
        self.updates = int(state.get("updates", 0))
