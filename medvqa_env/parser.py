r"""Parse one model turn into reasoning, tool calls and a final answer.

Pure functions, no I/O. The parser never raises on model output: every problem is reported in
:attr:`ParsedAction.errors` so the env can hand it back to the agent as an observation.

Understood forms:

* ``<think>...</think>`` reasoning (closed blocks are removed before anything else is read);
* ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one or more (Hermes/Qwen form);
* a final answer through a pluggable :class:`AnswerProtocol`: ``\boxed{...}`` (seed 000, the
  default) or ``<answer>...</answer>`` (MediX-R1, seed 001).

>>> p = parse_action('<think>small lesion?</think><tool_call>{"name": "image_zoom_in", '
...                  '"arguments": {"bbox": [0, 0, 10, 10]}}</tool_call>')
>>> p.kind, p.tool_calls[0].name, p.tool_calls[0].arguments
('tool_call', 'image_zoom_in', {'bbox': [0, 0, 10, 10]})
>>> parse_action(r"It is \boxed{yes}.").answer
'yes'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
BOXED_RE = re.compile(r"\\boxed\s*\{")
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

MAX_TOOL_CALLS_PER_TURN = 8


@dataclass(frozen=True)
class ToolCall:
    """A tool call as the model wrote it. ``arguments`` is always a dict (maybe empty)."""

    name: str
    arguments: dict[str, Any]

    def key(self) -> str:
        """A canonical string for this call (same tool + same arguments -> same key)."""
        return self.name + ":" + json.dumps(self.arguments, sort_keys=True, default=str)


@dataclass(frozen=True)
class ParsedAction:
    """What one turn contained.

    ``kind`` is ``"answer"`` when a final answer was given (this ends the episode),
    ``"tool_call"`` when only tool calls were made, and ``"invalid"`` when neither parsed.
    ``errors`` lists format problems in words the model can read.
    """

    raw: str
    think: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    answers: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def answer(self) -> str | None:
        """The final answer: the last one given (``None`` if there is none)."""
        return self.answers[-1] if self.answers else None

    @property
    def kind(self) -> str:
        if self.answers:
            return "answer"
        if self.tool_calls:
            return "tool_call"
        return "invalid"

    @property
    def format_ok(self) -> bool:
        """Exactly one final answer and no format errors."""
        return len(self.answers) == 1 and not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "think": self.think,
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in self.tool_calls],
            "answers": list(self.answers),
            "errors": list(self.errors),
        }


class AnswerProtocol(Protocol):
    """How a final answer is written. ``instruction`` goes into the system prompt."""

    name: str
    instruction: str

    def extract(self, text: str) -> tuple[list[str], list[str]]:
        """Return ``(answers, errors)`` found in ``text`` (reasoning already removed)."""
        ...


def _balanced_brace_content(text: str, start: int) -> int:
    """Index of the ``}`` closing the ``{`` just before ``start``, or -1 if unbalanced."""
    depth = 1
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


@dataclass(frozen=True)
class BoxedAnswer:
    r"""``\boxed{...}`` (seed 000). Nested braces are kept: ``\boxed{\text{T2}}``."""

    name: str = "boxed"
    instruction: str = (
        "Think step by step inside <think>...</think> if you wish. When you are confident, give the "
        "final answer exactly once as \\boxed{answer}."
    )

    def extract(self, text: str) -> tuple[list[str], list[str]]:
        answers, errors = [], []
        for m in BOXED_RE.finditer(text):
            end = _balanced_brace_content(text, m.end())
            if end < 0:
                errors.append("Unclosed \\boxed{: add the closing brace.")
                break
            answers.append(_unwrap_text(text[m.end():end]).strip())
        return answers, errors


@dataclass(frozen=True)
class XMLAnswer:
    """MediX-R1 (seed 001): ``<think>...</think><answer>...</answer>``."""

    name: str = "xml"
    instruction: str = (
        "Write your reasoning inside <think>...</think>, then the final answer inside "
        "<answer>...</answer>, exactly once."
    )

    def extract(self, text: str) -> tuple[list[str], list[str]]:
        answers = [a.strip() for a in ANSWER_RE.findall(text)]
        errors = []
        if text.count("<answer>") != len(answers):
            errors.append("Unclosed <answer>: close it with </answer>.")
        return answers, errors


ANSWER_PROTOCOLS: dict[str, AnswerProtocol] = {"boxed": BoxedAnswer(), "xml": XMLAnswer()}


def get_answer_protocol(name: str | AnswerProtocol) -> AnswerProtocol:
    if not isinstance(name, str):
        return name
    from medvqa_env.errors import ConfigError, unknown_name_message

    try:
        return ANSWER_PROTOCOLS[name]
    except KeyError:
        raise ConfigError(unknown_name_message("answer protocol", name, ANSWER_PROTOCOLS)) from None


def _unwrap_text(s: str) -> str:
    r"""``\text{yes}`` -> ``yes`` (models often box LaTeX text)."""
    m = re.fullmatch(r"\s*\\(?:text|textbf|mathrm)\s*\{(.*)\}\s*", s, re.DOTALL)
    return m.group(1) if m else s


def _parse_tool_call(body: str) -> tuple[ToolCall | None, str | None]:
    body = body.strip()
    if not body:
        return None, "Empty <tool_call>: write a JSON object {\"name\": ..., \"arguments\": {...}}."
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as e:
        msg = e.msg if isinstance(e, json.JSONDecodeError) else "too deeply nested"
        return None, f"Invalid JSON in <tool_call>: {msg}. Write {{\"name\": ..., \"arguments\": {{...}}}}."
    if not isinstance(obj, dict):
        return None, f"<tool_call> must hold a JSON object, got {type(obj).__name__}."
    name = obj.get("name")
    if name is not None and not isinstance(name, str):  # 5, ["zoom"], {...}: not a tool's name
        return None, f"\"name\" in <tool_call> must be a string (a tool's name), got {type(name).__name__}."
    if not name:
        return None, "<tool_call> is missing a string \"name\"."
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return None, f"Invalid JSON in the arguments of {name!r}: {e.msg}."
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f"\"arguments\" of {name!r} must be a JSON object, got {type(args).__name__}."
    return ToolCall(name=name, arguments=args), None


def parse_action(action: str | bytes, protocol: AnswerProtocol | str = "boxed") -> ParsedAction:
    """Parse one whole model turn. Never raises on any ``str`` or ``bytes`` input."""
    errors: list[str] = []
    if isinstance(action, (bytes, bytearray)):
        text = bytes(action).decode("utf-8", errors="replace")
        if "\ufffd" in text:
            errors.append("The turn was not valid UTF-8; invalid bytes were replaced.")
    elif isinstance(action, str):
        text = action
    else:
        return ParsedAction(raw=repr(action), errors=(f"A turn must be text, got {type(action).__name__}.",))
    protocol = get_answer_protocol(protocol)

    thinks = THINK_RE.findall(text)
    body = THINK_RE.sub(" ", text)
    think = "\n".join(t.strip() for t in thinks) if thinks else None

    tool_calls: list[ToolCall] = []
    pos = 0
    outside: list[str] = []
    while True:
        start = body.find(TOOL_OPEN, pos)
        if start < 0:
            outside.append(body[pos:])
            break
        outside.append(body[pos:start])
        end = body.find(TOOL_CLOSE, start + len(TOOL_OPEN))
        if end < 0:
            errors.append("Unclosed <tool_call>: end it with </tool_call>.")
            break
        call, err = _parse_tool_call(body[start + len(TOOL_OPEN):end])
        if err:
            errors.append(err)
        elif len(tool_calls) >= MAX_TOOL_CALLS_PER_TURN:
            errors.append(f"At most {MAX_TOOL_CALLS_PER_TURN} tool calls per turn; the rest were ignored.")
        else:
            tool_calls.append(call)
        pos = end + len(TOOL_CLOSE)

    answers, answer_errors = protocol.extract("".join(outside))
    errors.extend(answer_errors)
    if len(answers) > 1:
        errors.append(f"Give exactly one final answer; found {len(answers)}.")
    if answers and tool_calls:
        errors.append("A final answer ends the episode: the tool calls in the same turn were not run.")
    return ParsedAction(
        raw=text, think=think, tool_calls=tuple(tool_calls), answers=tuple(answers), errors=tuple(dict.fromkeys(errors))
    )
