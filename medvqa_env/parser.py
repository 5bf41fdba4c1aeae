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

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
BOXED_RE = re.compile(r"\\boxed\s*\{")
_BRACE_RE = re.compile(r"[{}]")

MAX_TOOL_CALLS_PER_TURN = 8
MAX_ANSWERS_KEPT = 8
"""Answers beyond this many are counted (for the error) but not kept: nested ``\\boxed{`` runs
would otherwise copy the turn once per level."""
MAX_ACTION_CHARS = 65_536
"""Longest turn parsed, in characters for ``str`` and in bytes for ``bytes``; longer turns get
one error and are not read (the env's ``max_action_chars`` and the server's setting default to it)."""
MAX_INT_DIGITS = 32
"""Integers in tool-call JSON with more digits than this are refused: no coordinate needs them, and
Python refuses to parse ints over 4,300 digits with a ``ValueError``, not a ``JSONDecodeError``."""


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


def tag_blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[tuple[int, int]], bool]:
    """Spans ``(start, end)`` of every ``open_tag ... close_tag`` block, leftmost first, blocks not
    nested (what ``re.findall(open(.*?)close, re.S)`` finds), in one linear scan; and whether an
    ``open_tag`` was left unclosed. The regex re-scans the rest of the text from every unclosed
    opening: quadratic on ``"<think>" * n``.

    >>> tag_blocks("a<t>b</t>c<t>d", "<t>", "</t>")
    ([(1, 9)], True)
    """
    spans, pos = [], 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return spans, False
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:  # no closing tag after this opening, so none after any later one either
            return spans, True
        spans.append((start, end + len(close_tag)))
        pos = end + len(close_tag)


def cut_blocks(text: str, open_tag: str, close_tag: str) -> str:
    """``text`` with every :func:`tag_blocks` block replaced by a space
    (``re.sub(open(.*?)close, " ", text, flags=re.S)`` in linear time).

    >>> cut_blocks("a<t>b</t>c<t>d", "<t>", "</t>")
    'a c<t>d'
    """
    return _cut(text, tag_blocks(text, open_tag, close_tag)[0])


def _closing_braces(text: str) -> dict[int, int]:
    """For every ``{`` in ``text``, the index of the ``}`` that closes it (unclosed ones absent);
    one pass over the braces with a stack."""
    stack: list[int] = []
    closing: dict[int, int] = {}
    for m in _BRACE_RE.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            closing[stack.pop()] = m.start()
    return closing


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
        closing = None
        found = 0
        for m in BOXED_RE.finditer(text):
            if closing is None:
                closing = _closing_braces(text)
            end = closing.get(m.end() - 1, -1)
            if end < 0:
                errors.append("Unclosed \\boxed{: add the closing brace.")
                break
            found += 1
            if found <= MAX_ANSWERS_KEPT:
                answers.append(_unwrap_text(text[m.end():end]).strip())
        if found > MAX_ANSWERS_KEPT:
            errors.append(f"Give exactly one final answer; found {found}.")
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
        spans, _ = tag_blocks(text, ANSWER_OPEN, ANSWER_CLOSE)
        answers = [text[a + len(ANSWER_OPEN):b - len(ANSWER_CLOSE)].strip() for a, b in spans]
        errors = []
        if text.count(ANSWER_OPEN) != len(answers):
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


_TEXT_WRAPPER = re.compile(r"\s*\\(?:text|textbf|mathrm)\s*\{")


def _unwrap_text(s: str) -> str:
    r"""``\text{yes}`` -> ``yes`` (models often box LaTeX text).

    >>> _unwrap_text(r" \text{T2 } "), _unwrap_text(r"\text{a}b")
    ('T2 ', '\\text{a}b')
    """
    m = _TEXT_WRAPPER.match(s)
    if not m:
        return s
    tail = s.rstrip()
    return s[m.end():len(tail) - 1] if tail.endswith("}") else s


class _HugeNumber(ValueError):
    pass


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _HugeNumber(f"an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def loads_bounded(text: str) -> Any:
    """``json.loads`` that refuses integers over :data:`MAX_INT_DIGITS` digits (``ValueError``).

    >>> loads_bounded('{"x": 12}')
    {'x': 12}
    >>> parse_action('<tool_call>{"name": "t", "arguments": {"x": ' + '9' * 5000 + '}}</tool_call>').errors
    ('Invalid JSON in <tool_call>: an integer of 5000 digits (at most 32). Write {"name": ..., "arguments": {...}}.',)
    """
    return json.loads(text, parse_int=_bounded_int)


def _json_error(e: BaseException) -> str:
    if isinstance(e, json.JSONDecodeError):
        return e.msg
    if isinstance(e, RecursionError):
        return "too deeply nested"
    if isinstance(e, _HugeNumber):
        return str(e)
    return f"{type(e).__name__}: {str(e)[:120]}"


def _parse_tool_call(body: str) -> tuple[ToolCall | None, str | None]:
    body = body.strip()
    if not body:
        return None, "Empty <tool_call>: write a JSON object {\"name\": ..., \"arguments\": {...}}."
    try:
        obj = loads_bounded(body)
    except (ValueError, RecursionError) as e:
        msg = _json_error(e)
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
            args = loads_bounded(args) if args.strip() else {}
        except (ValueError, RecursionError) as e:
            return None, f"Invalid JSON in the arguments of {name!r}: {_json_error(e)}."
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f"\"arguments\" of {name!r} must be a JSON object, got {type(args).__name__}."
    return ToolCall(name=name, arguments=args), None


def too_long(action: Any, max_chars: int = MAX_ACTION_CHARS) -> str | None:
    """The error for a turn over ``max_chars`` (characters of a ``str``, bytes of ``bytes``), else ``None``."""
    if isinstance(action, (str, bytes, bytearray)) and len(action) > max_chars:
        unit = "characters" if isinstance(action, str) else "bytes"
        return f"Your turn was {len(action)} {unit}; the limit is {max_chars}. Be concise."
    return None


def parse_action(action: str | bytes, protocol: AnswerProtocol | str = "boxed",
                 max_chars: int | None = None) -> ParsedAction:
    """Parse one whole model turn. Never raises on any ``str`` or ``bytes`` input; takes time
    linear in its length. With ``max_chars`` (the env and the server pass theirs), a longer turn
    is not read: one error, and ``raw`` holds its first 200 characters."""
    errors: list[str] = []
    long = too_long(action, max_chars) if max_chars is not None else None
    if long is not None:
        head = action[:200]
        head = head if isinstance(head, str) else bytes(head).decode("utf-8", errors="replace")
        return ParsedAction(raw=head, errors=(long,))
    if isinstance(action, (bytes, bytearray)):
        text = bytes(action).decode("utf-8", errors="replace")
        if "\ufffd" in text:
            errors.append("The turn was not valid UTF-8; invalid bytes were replaced.")
    elif isinstance(action, str):
        text = action
    else:
        return ParsedAction(raw=repr(action), errors=(f"A turn must be text, got {type(action).__name__}.",))
    protocol = get_answer_protocol(protocol)

    spans, _ = tag_blocks(text, THINK_OPEN, THINK_CLOSE)
    thinks = [text[a + len(THINK_OPEN):b - len(THINK_CLOSE)] for a, b in spans]
    body = _cut(text, spans)
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
    if len(answers) > 1 and not any(e.startswith("Give exactly one final answer") for e in errors):
        errors.append(f"Give exactly one final answer; found {len(answers)}.")
    if answers and tool_calls:
        errors.append("A final answer ends the episode: the tool calls in the same turn were not run.")
    return ParsedAction(
        raw=text, think=think, tool_calls=tuple(tool_calls), answers=tuple(answers), errors=tuple(dict.fromkeys(errors))
    )


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each span replaced by one space (as ``THINK_RE.sub(" ", text)`` did)."""
    if not spans:
        return text
    out, pos = [], 0
    for a, b in spans:
        out.append(text[pos:a])
        pos = b
    out.append(text[pos:])
    return " ".join(out)
