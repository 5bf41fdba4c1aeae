"""ARMed's adaptive thresholds (seed 000 §4.2): a running buffer per metric and a bounded drift.

For each semantic metric (``bertscore``, ``cosine``) we keep the last ``buffer_size`` raw scores.
Scoring only *reads* the thresholds (:meth:`AdaptiveThresholds.current`) and leaves the batch's raw
scores pending (:meth:`~AdaptiveThresholds.observe`). One explicit call at the end of a training
batch (:meth:`~AdaptiveThresholds.end_batch`) moves the pending scores into the buffers and moves
each threshold toward the buffer's ``percentile`` by at most ``delta_max``:

    T_t = clip(T_{t-1} + clip(P_q(buffer) - T_{t-1}, -delta_max, +delta_max), t_min, t_max)

So every trajectory of a step -- every member of a GRPO group, wherever it was scored -- meets the
same thresholds, the same answer scored twice gets the same reward, and a threshold needs several
batches to cross the typical range (no jump from one odd batch). Nobody calls ``end_batch`` during
an evaluation, so evaluation scores do not depend on episode order.

>>> round(squash(0.9, 0.5, alpha_pos=5.0, alpha_neg=5.0), 4)   # above T: 0.5 + 0.5(1 - e^{-5*0.4})
0.9323
>>> round(squash(0.3, 0.5, alpha_pos=5.0, alpha_neg=5.0), 4)   # below T: 0.5 e^{5*(-0.2)}
0.1839
>>> squash(0.5, 0.5, 5.0, 5.0)
0.5
>>> t = AdaptiveThresholds(AdaptiveConfig(delta_max=0.05, init={"cosine": 0.5}), metrics=["cosine"])
>>> t.observe({"cosine": [0.9, 0.9, 0.9]})    # scoring a batch: thresholds do not move
>>> t.current()
{'cosine': 0.5}
>>> t.end_batch()                             # the batch boundary: toward the median 0.9 by <= 0.05
{'cosine': 0.55}
>>> t.end_batch()                             # nothing pending: nothing moves
{'cosine': 0.55}
>>> t.observe({"cosine": [0.9]}); round(t.end_batch(2)["cosine"], 6)   # step 2 ends
0.6
>>> t.observe({"cosine": [0.9]}); round(t.end_batch(1)["cosine"], 6)   # step 1 again, late: ignored
0.6
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
    """The buffers and thresholds of one ARMed reward (the in-process owner).

    :meth:`current` is what scoring reads; :meth:`observe` queues a scored batch's raw values;
    :meth:`end_batch` is the only call that moves a threshold. :class:`rewards.adaptive_ray.RayThresholds`
    has the same interface with the state in one named Ray actor, for copies spread over processes.
    """

    def __init__(self, config: AdaptiveConfig | None = None, metrics: Sequence[str] = ("bertscore", "cosine")) -> None:
        self.config = config or AdaptiveConfig()
        self.metrics = tuple(metrics)
        self.buffers = {m: deque(maxlen=self.config.buffer_size) for m in self.metrics}
        # only the newest ``buffer_size`` values of a batch can survive in the buffer, so no more wait
        self.pending = {m: deque(maxlen=self.config.buffer_size) for m in self.metrics}
        self.thresholds = {m: self._clip(float(self.config.init.get(m, 0.5))) for m in self.metrics}
        self.updates = 0
        self.last_batch_id: Any = None

    def _clip(self, t: float) -> float:
        return min(max(t, self.config.t_min), self.config.t_max)

    def current(self) -> dict[str, float]:
        """The thresholds scoring uses until the next :meth:`end_batch`."""
        return dict(self.thresholds)

    def observe(self, values: Mapping[str, Sequence[float]]) -> None:
        """Queue a scored batch's raw values (non-finite ones are dropped) for the next boundary."""
        unknown = set(values) - set(self.metrics)
        if unknown:
            raise ValueError(f"expected metrics among {list(self.metrics)}, got {sorted(unknown)!r}")
        for m, xs in values.items():
            self.pending[m].extend(float(x) for x in xs if x is not None and math.isfinite(float(x)))

    def end_batch(self, batch_id: Any = None) -> dict[str, float]:
        """The batch boundary: pending values enter the buffers and each threshold drifts once.

        ``batch_id`` (the step number) makes the call idempotent: several workers may each announce
        the end of the same batch (e.g. verl's global step), and only the first call moves anything.
        An id not newer than the last one seen (a late worker announcing an older step, a repeat)
        moves nothing either; ids must be ordered (ints). ``None`` always ends the batch. Returns
        the thresholds now in force.
        """
        if batch_id is not None and self.last_batch_id is not None:
            try:
                stale = not batch_id > self.last_batch_id
            except TypeError:
                raise ValueError(f"expected batch ids that order like the previous one ({self.last_batch_id!r}), "
                                 f"e.g. step numbers, got {batch_id!r}") from None
            if stale:
                return self.current()
        changed = False
        for m in self.metrics:
            if not self.pending[m]:
                continue
            self.buffers[m].extend(self.pending[m])
            self.pending[m].clear()
            target = float(np.percentile(np.fromiter(self.buffers[m], float), self.config.percentile))
            t = self.thresholds[m]
            move = min(max(target - t, -self.config.delta_max), self.config.delta_max)
            self.thresholds[m] = self._clip(t + move)
            changed = True
        self.updates += int(changed)
        if batch_id is not None:
            self.last_batch_id = batch_id
        return self.current()

    def state_dict(self) -> dict[str, Any]:
        return {
            "store": "local",
            "config": {**asdict(self.config), "init": dict(self.config.init)},
            "thresholds": dict(self.thresholds),
            "buffers": {m: list(b) for m, b in self.buffers.items()},
            "pending": {m: list(b) for m, b in self.pending.items()},
            "updates": self.updates,
            "last_batch_id": self.last_batch_id,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore thresholds, buffers and pending values (the config stays the one this object was
        built with)."""
        try:
            thresholds, buffers = state["thresholds"], state["buffers"]
        except (KeyError, TypeError):
            raise ValueError(f"expected a state with 'thresholds' and 'buffers', got {state!r:.200}") from None
        for m in self.metrics:
            if m in thresholds:
                self.thresholds[m] = self._clip(float(thresholds[m]))
            if m in buffers:
                self.buffers[m] = deque((float(x) for x in buffers[m]), maxlen=self.config.buffer_size)
            self.pending[m] = deque((float(x) for x in state.get("pending", {}).get(m, ())),
                                    maxlen=self.config.buffer_size)
        self.updates = int(state.get("updates", 0))
        self.last_batch_id = state.get("last_batch_id")
