"""``ScriptedAgent``: a zero-cost, deterministic agent for testing and timing the harness.

It is not a baseline (see ``agents.registry`` for random / prior / oracle agents): it exists so
the harness can be exercised end to end -- tool calls, bad generations, crashes -- with no model.
Each conversation's answer depends only on the episode seed (``info["seed"]``), so a rerun or a
resumed run gives identical episodes whatever the batching.

Options (``--agent scripted --agent-opt zoom=true --agent-opt crash_on=q3``):

* ``zoom``: first turn zooms into a seed-chosen quarter of image 0 (default true);
* ``crash_on`` / ``garbage_on`` / ``bad_tool_on``: comma-separated record-id substrings for which the
  agent raises, writes an unparseable turn forever, or calls an unknown tool first;
* ``answer``: a fixed answer instead of the seeded guess;
* ``delay_s``: sleep this long per ``act_batch`` call (to imitate a model in tests).

>>> from medvqa_env.chat import Conversation
>>> conv = Conversation.start({"text": "Q", "images": ()}, {"answer_type": "CLOSED", "seed": 3,
...                            "record_id": "q1"})
>>> from medvqa_env.parser import parse_action
>>> parse_action(ScriptedAgent(zoom=False).act(conv)).answer in ("yes", "no")
True
"""

from __future__ import annotations

import json
import random
import time
from typing import Any, Sequence

from agents.base import Agent
from medvqa_env.chat import Conversation

OPEN_GUESSES = ("left", "right", "lung", "brain", "liver", "ct", "mri", "x-ray", "axial", "kidney")


def _ids(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(str(v) for v in value)


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class ScriptedAgent(Agent):
    """See the module docstring."""

    name = "scripted"

    def __init__(self, zoom: Any = True, crash_on: Any = None, garbage_on: Any = None,
                 bad_tool_on: Any = None, answer: str | None = None, delay_s: float = 0.0) -> None:
        self.zoom = _flag(zoom)
        self.crash_on, self.garbage_on, self.bad_tool_on = _ids(crash_on), _ids(garbage_on), _ids(bad_tool_on)
        self.answer = answer
        self.delay_s = float(delay_s)
        self.batch_sizes: list[int] = []  # what act_batch was given, call by call

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "zoom": self.zoom, "crash_on": list(self.crash_on),
                "garbage_on": list(self.garbage_on), "bad_tool_on": list(self.bad_tool_on), "answer": self.answer}

    def act_batch(self, conversations: Sequence[Conversation]) -> list[str]:
        self.batch_sizes.append(len(conversations))
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return [self._turn(c) for c in conversations]

    def _turn(self, conv: Conversation) -> str:
        record_id = str(conv.info.get("record_id", ""))
        if any(s in record_id for s in self.crash_on):
            raise RuntimeError(f"scripted crash on {record_id}")
        if any(s in record_id for s in self.garbage_on):
            return "I am not sure what to say here {{{"
        rng = random.Random(int(conv.info.get("seed", 0)) * 7 + conv.turns)
        if conv.turns == 0 and any(s in record_id for s in self.bad_tool_on):
            return '<tool_call>{"name": "zoom", "arguments": {}}</tool_call>'
        if self.zoom and not any(m.get("role") == "assistant" and "image_zoom_in" in str(m.get("content"))
                                 for m in conv.messages):
            if conv.images:
                w, h = conv.images[0].size
                qx, qy = rng.randrange(2), rng.randrange(2)
                box = [qx * w // 2, qy * h // 2, (qx + 1) * w // 2, (qy + 1) * h // 2]
                call = {"name": "image_zoom_in", "arguments": {"bbox": box, "image_index": 0}}
                return f"<think>Look closer.</think><tool_call>{json.dumps(call)}</tool_call>"
        return f"<think>Scripted.</think>\\boxed{{{self._guess(conv, rng)}}}"

    def _guess(self, conv: Conversation, rng: random.Random) -> str:
        if self.answer is not None:
            return self.answer
        kind = conv.answer_type
        if kind == "CLOSED":
            return rng.choice(("yes", "no"))
        options = conv.info.get("options") or {}
        if kind == "MCQ" and options:
            return rng.choice(sorted(options))
        return rng.choice(OPEN_GUESSES)
