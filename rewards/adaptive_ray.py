"""One owner for ARMed's thresholds across Ray workers: a named actor.

Every copy of an :class:`rewards.armed.ARMedReward` built with ``threshold_store="ray"`` (the
driver's, and the pickled copies inside env workers) talks to the same actor, found by name with
``get_if_exists=True``. The actor is *detached* (whoever creates it first, its state must outlive
that caller's task) in the job's namespace; :meth:`RayThresholds.close` kills it. The actor runs
one call at a time, with the semantics of the in-process :class:`rewards.adaptive.AdaptiveThresholds`:
scoring reads :meth:`~RayThresholds.current` and queues raw values with ``observe``; only
``end_batch`` moves a threshold, and ``end_batch(batch_id)`` is idempotent, so every worker of a
step may announce the step's end and the thresholds still move once. ``state_dict`` reads the
actor's state, so a checkpoint taken on the driver holds what all workers contributed.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rewards.adaptive import AdaptiveConfig, AdaptiveThresholds

DEFAULT_ACTOR_NAME = "medvqa-armed-thresholds"


class _ThresholdOwner:
    """The actor body: an :class:`AdaptiveThresholds` behind remote methods."""

    def __init__(self, config: AdaptiveConfig, metrics: Sequence[str]) -> None:
        self.inner = AdaptiveThresholds(config, metrics)

    def current(self) -> dict[str, float]:
        return self.inner.current()

    def observe(self, values: Mapping[str, Sequence[float]]) -> None:
        self.inner.observe(values)

    def end_batch(self, batch_id: Any = None) -> dict[str, float]:
        return self.inner.end_batch(batch_id)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inner.load_state_dict(state)


class RayThresholds:
    """Same interface as :class:`AdaptiveThresholds`, state held by the named actor ``name``.

    Needs ``ray.init(...)`` to have run (in the driver; Ray workers are connected already).
    Pickles by name: a copy shipped to a worker finds the same actor.
    """

    def __init__(self, config: AdaptiveConfig | None = None, metrics: Sequence[str] = ("bertscore", "cosine"),
                 name: str = DEFAULT_ACTOR_NAME, namespace: str | None = None) -> None:
        self.config = config or AdaptiveConfig()
        self.metrics = tuple(metrics)
        self.name = name
        self.namespace = namespace
        self._actor = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_actor": None}

    def _handle(self):
        if self._actor is None:
            import ray

            if not ray.is_initialized():
                raise RuntimeError("threshold_store='ray' needs ray.init(...) before the first reward call")
            actor_cls = ray.remote(num_cpus=0, max_concurrency=1)(_ThresholdOwner)
            # detached: a non-detached actor created inside a task dies with the task's last
            # handle, and the next caller would silently get a fresh, empty owner
            self._actor = actor_cls.options(name=self.name, namespace=self.namespace, get_if_exists=True,
                                            lifetime="detached").remote(self.config, self.metrics)
        return self._actor

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self._handle(), method).remote(*args))

    def current(self) -> dict[str, float]:
        return self._call("current")

    def observe(self, values: Mapping[str, Sequence[float]]) -> None:
        # blocking, so a trainer's end_batch after the rollouts cannot overtake a worker's values
        self._call("observe", {k: list(map(float, v)) for k, v in values.items()})

    def end_batch(self, batch_id: Any = None) -> dict[str, float]:
        return self._call("end_batch", batch_id)

    @property
    def thresholds(self) -> dict[str, float]:
        return self.current()

    def state_dict(self) -> dict[str, Any]:
        return self._call("state_dict")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._call("load_state_dict", dict(state))

    def close(self) -> None:
        """Kill the owner actor (it is detached, so it otherwise lives until the cluster stops)."""
        import ray

        if ray.is_initialized():
            try:
                ray.kill(ray.get_actor(self.name, namespace=self.namespace))
            except ValueError:  # already gone
                pass
        self._actor = None
