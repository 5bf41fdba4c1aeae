"""The agent contract: turn conversations into next turns.

An agent gets :class:`~medvqa_env.chat.Conversation` objects (the whole chat so far, images
included) and returns the next assistant turn as text. ``act_batch`` is the throughput path (one
batched generation for many episodes); ``act`` is the one-episode convenience. Agents never see
the ground truth -- except :class:`agents.baselines.OracleAgent`, which is named for it.
"""

from __future__ import annotations

import abc
from typing import Any, Sequence

from medvqa_env.chat import Conversation


class Agent(abc.ABC):
    """Subclasses implement :meth:`act_batch` (preferred) or :meth:`act`."""

    name: str = "agent"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.act is Agent.act and cls.act_batch is Agent.act_batch and not getattr(cls, "__abstractmethods__", None):
            raise TypeError(f"{cls.__name__} must implement act() or act_batch()")

    def act(self, conversation: Conversation) -> str:
        return self.act_batch([conversation])[0]

    def act_batch(self, conversations: Sequence[Conversation]) -> list[str]:
        return [self.act(c) for c in conversations]

    def config(self) -> dict[str, Any]:
        """What identifies this agent in result files (model path, sampling settings...)."""
        return {"name": self.name}

    def close(self) -> None:
        pass
