"""The text the model reads: system prompt (tools + protocol), question, and tool observations."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from medvqa_env.parser import AnswerProtocol
from medvqa_env.records import AnswerType, VQARecord

SYSTEM_TEMPLATE = """You are a medical imaging assistant answering questions about radiology and pathology images.

You may call tools to inspect the image before answering. Available tools (JSON schemas):
<tools>
{tools}
</tools>

To call a tool, write one or more blocks of the form
<tool_call>{{"name": <tool-name>, "arguments": <args-json-object>}}</tool_call>
and stop; the results come back in the next message. Images are numbered in the order they appear
(image 0 is the original); tools that return an image add a new one. You have at most {max_turns} tool turns.

{answer_instruction}"""

NO_TOOLS_SYSTEM_TEMPLATE = """You are a medical imaging assistant answering questions about radiology and pathology images.

{answer_instruction}"""

ANSWER_HINTS = {
    AnswerType.CLOSED: "Answer yes or no.",
    AnswerType.MCQ: "Answer with the letter of the correct option.",
    AnswerType.OPEN: "Answer with a short phrase.",
}


def system_prompt(tool_schemas: Sequence[Mapping[str, Any]], protocol: AnswerProtocol, max_turns: int) -> str:
    if not tool_schemas:
        return NO_TOOLS_SYSTEM_TEMPLATE.format(answer_instruction=protocol.instruction)
    tools = "\n".join(json.dumps(s, ensure_ascii=False) for s in tool_schemas)
    return SYSTEM_TEMPLATE.format(tools=tools, max_turns=max_turns, answer_instruction=protocol.instruction)


def question_prompt(record: VQARecord) -> str:
    """The user turn: the question, the options for MCQ, and what kind of answer is wanted."""
    lines = [f"Question: {record.question.strip()}"]
    if record.options:
        lines.append("Options:")
        lines.extend(f"({k}) {v}" for k, v in record.options.items())
    lines.append(ANSWER_HINTS[record.answer_type])
    return "\n".join(lines)


def wrap_observation(parts: Sequence[str], style: str) -> str:
    """Seed style ``<observation>...</observation>``, or bare text for a ``tool`` role message."""
    body = "\n".join(p for p in parts if p)
    if style == "observation_tag":
        return f"<observation>\n{body}\n</observation>"
    return body


def turns_left_note(turns_left: int) -> str:
    if turns_left <= 0:
        return "No tool turns left: give your final answer now."
    return f"Tool turns left: {turns_left}."
