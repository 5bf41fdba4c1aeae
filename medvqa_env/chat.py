"""``Conversation``: the chat an agent sees, rebuilt from what the env returns.

The env returns only what is *new* each step (the observation text and new images). Agents that
use chat templates need the whole history; a :class:`Conversation` keeps it on the agent's side,
so it works the same through a vector env, a Ray actor or a remote env.

>>> conv = Conversation.start({"text": "Question: Is there a lesion?", "images": ()},
...                           {"system_prompt": "You are...", "tools": [], "answer_type": "CLOSED"})
>>> conv.add_turn("<tool_call>...</tool_call>", {"text": "<observation>ok</observation>", "images": ()})
>>> [m["role"] for m in conv.messages]
['system', 'user', 'assistant', 'user']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from PIL import Image

from medvqa_env.images import LazyImage


@dataclass
class Conversation:
    """Messages in OpenAI chat form; image parts are ``{"type": "image", "image_index": i}``
    into :attr:`images` (PIL, in episode order: original first, then tool outputs)."""

    messages: list[dict[str, Any]]
    images: list[Image.Image]
    info: dict[str, Any] = field(default_factory=dict)
    observation_style: str = "observation_tag"
    usage: dict[str, int] = field(default_factory=dict)
    """Token usage of the agent's turns in this chat, for agents that know it (an API agent adds
    each response's ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and ``requests``);
    the evaluation harness writes it with the episode."""

    @classmethod
    def start(cls, obs: Mapping[str, Any], info: Mapping[str, Any], observation_style: str = "observation_tag") -> "Conversation":
        images = [_to_pil(a) for a in obs.get("images", ())]
        content = [{"type": "image", "image_index": i} for i in range(len(images))]
        content.append({"type": "text", "text": obs["text"]})
        messages = []
        if info.get("system_prompt"):
            messages.append({"role": "system", "content": info["system_prompt"]})
        messages.append({"role": "user", "content": content})
        return cls(messages=messages, images=images, info=dict(info), observation_style=observation_style)

    def add_turn(self, action: str, obs: Mapping[str, Any]) -> None:
        """Record the agent's ``action`` and the env's answer to it."""
        self.messages.append({"role": "assistant", "content": action})
        first = len(self.images)
        self.images.extend(_to_pil(a) for a in obs.get("images", ()))
        indices = range(first, len(self.images))
        if self.observation_style == "tool_role":
            msg: dict[str, Any] = {"role": "tool", "content": obs["text"]}
            if len(indices):
                msg["images"] = list(indices)
        else:
            content = [{"type": "image", "image_index": i} for i in indices]
            content.append({"type": "text", "text": obs["text"]})
            msg = {"role": "user", "content": content}
        self.messages.append(msg)

    @property
    def question(self) -> str:
        return self.info.get("question", "")

    @property
    def answer_type(self) -> str:
        return self.info.get("answer_type", "OPEN")

    @property
    def turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")

    def text_messages(self, image_token: str = "<image>") -> list[dict[str, str]]:
        """Messages with plain string content, images replaced by ``image_token`` (for text-only
        models and tokenizer chat templates)."""
        out = []
        for m in self.messages:
            content = m["content"]
            if isinstance(content, list):
                parts = [image_token if p.get("type") == "image" else p.get("text", "") for p in content]
                content = "\n".join(p for p in parts if p)
            role = "user" if m["role"] == "tool" else m["role"]
            out.append({"role": role, "content": content})
        return out


def _to_pil(array: Any) -> Image.Image:
    """An observation image as PIL. An RGB array becomes an image on first pixel access: an agent
    that never looks at pixels (a scripted or text-only one) does not pay ~1-2 ms per megapixel."""
    if isinstance(array, Image.Image):
        return array
    a = np.asarray(array)
    if a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3:
        return LazyImage(lambda: Image.fromarray(a), (a.shape[1], a.shape[0]))
    return Image.fromarray(np.asarray(array, dtype=np.uint8))
