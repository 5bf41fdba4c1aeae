"""``AnswerBook``: an agent that answers each record with the text a test wrote down for it (a
test's stand-in for a model that gives right answers, alternatives, near misses and wrong ones)."""

from __future__ import annotations

from typing import Any, Mapping

from agents.base import Agent
from medvqa_env.chat import Conversation


class AnswerBook(Agent):
    """``answers``: record id -> the final answer (``\\boxed{...}``); a record not in it gets ``default``."""

    name = "answer_book"

    def __init__(self, answers: Mapping[str, str] | None = None, default: str = "no idea") -> None:
        self.answers = dict(answers or {})
        self.default = default

    def act(self, conversation: Conversation) -> str:
        answer = self.answers.get(str(conversation.info.get("record_id")), self.default)
        return f"<think>Written down.</think>\\boxed{{{answer}}}"

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "answers": self.answers}
