"""What the env copies of one run share: the reward, the toolbox and the decoded images.

A GRPO group is n copies of the env on one question, and a training step is many groups. They must
agree on anything stateful or expensive: the reward (one object, so one loaded encoder and one set
of ARMed thresholds), the toolbox (its loaded tool models and its result cache, so the n copies
that make the same call pay once) and the image cache (so they decode and hash the question's
image once; see :class:`medvqa_env.images.ImageCache`). Gymnasium's vector envs share nothing between copies on purpose;
here whatever copies share is built once, outside them, and handed to each:

>>> from medvqa_env.env import MedVQAEnv
>>> services = EnvServices.build(tools=[], reward="rule")
>>> a, b = (MedVQAEnv("embedded", services=services) for _ in range(2))
>>> a.reward_fn is b.reward_fn is services.reward and a.toolbox is b.toolbox
True

A single env made in a notebook builds a private ``EnvServices`` from its ``tools``/``reward``
arguments, so it still works alone. Scoring never moves the reward's adaptive state; the owner of
the run (a trainer, :class:`medvqa_env.pool.EnvPool`) calls :meth:`EnvServices.end_batch` once at
the end of each batch, and ``state_dict`` carries that state through checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from medvqa_env.errors import ConfigError
from medvqa_env.images import ImageCache


@dataclass
class EnvServices:
    """One reward object, one toolbox and one image cache for every env copy in this process."""

    reward: Any
    """A :class:`rewards.RewardFunction` (called with batches of :class:`rewards.RewardInput`)."""
    toolbox: Any
    """A :class:`tool_backends.toolbox.Toolbox` (tool backends, loaded models, result cache)."""
    images: ImageCache = field(default_factory=ImageCache)
    """Decoded record images by file (bounded; a changed file is read again)."""
    owns_reward: bool = False
    """The reward was built here (from a name or config), so :meth:`close` closes it too."""

    @classmethod
    def build(cls, tools: Any = None, reward: Any = None, dataset: Any = None) -> "EnvServices":
        """From the env's ``tools`` and ``reward`` arguments (any form :class:`MedVQAEnv` takes);
        ``dataset`` (a name or loaded dataset) gives its engine defaults, as the env does
        (:func:`tool_backends.config.for_dataset`: ``segment`` on real images is LiteMedSAM)."""
        if dataset is not None:
            from tool_backends.config import for_dataset

            tools = for_dataset(tools, dataset)
        return cls(reward=resolve_reward(reward), toolbox=resolve_toolbox(tools), owns_reward=builds_reward(reward))

    def end_batch(self, batch_id: Any = None) -> dict[str, Any]:
        """The end of a training batch: the reward's adaptive state moves once (see
        :meth:`rewards.RewardFunction.end_batch`); returns what moved."""
        return self.reward.end_batch(batch_id) if hasattr(self.reward, "end_batch") else {}

    def state_dict(self) -> dict[str, Any]:
        """The reward state a checkpoint must hold (tool caches are a speed-up, not state)."""
        return {"reward": self.reward.state_dict() if hasattr(self.reward, "state_dict") else {}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "reward" not in state:
            raise ValueError(f"expected a services state with 'reward', got keys {sorted(state)!r}")
        if hasattr(self.reward, "load_state_dict"):
            self.reward.load_state_dict(state["reward"])

    def close(self) -> None:
        self.toolbox.close()
        if self.owns_reward:
            close_reward(self.reward)


def builds_reward(reward: Any) -> bool:
    """Whether :func:`resolve_reward` builds a new object from ``reward`` (a name, a config or
    ``None``), which its builder then owns and closes; a reward object passed in stays the caller's."""
    return reward is None or isinstance(reward, (str, Mapping))


def close_reward(reward: Any) -> None:
    """``reward.close()`` where the reward has one (a Ray-held adaptive state is let go)."""
    close = getattr(reward, "close", None)
    if callable(close):
        close()


def resolve_toolbox(tools: Any):
    """A ``Toolbox`` as is, or one built from any tool config (see :mod:`tool_backends.config`)."""
    from tool_backends.toolbox import Toolbox

    if isinstance(tools, Toolbox):
        return tools
    return Toolbox.from_config(tools)


def resolve_reward(reward: Any):
    """``None`` -> :func:`rewards.default_reward`; a name -> the registry; a callable as is."""
    if reward is None:
        from rewards import default_reward

        return default_reward()
    if isinstance(reward, str):
        from rewards.registry import build_reward

        return build_reward(reward)
    if isinstance(reward, Mapping):
        from rewards.registry import build_reward

        options = dict(reward)
        if "name" not in options:
            raise ConfigError(f"expected a reward mapping with a 'name', got keys {sorted(options)!r}")
        return build_reward(options.pop("name"), **options)
    if not callable(reward):
        raise ConfigError(f"expected a reward function, name or mapping, got {type(reward).__name__}")
    return reward
