"""The action parser: every form the seeds use, every malformed form, and random text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medvqa_env.errors import ConfigError
from medvqa_env.parser import ParsedAction, get_answer_protocol, parse_action


def call(name="image_zoom_in", **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def test_think_and_one_tool_call():
    p = parse_action("<think>the lesion is small</think>" + call(bbox=[1, 2, 3, 4]))
    assert p.kind == "tool_call"
    assert p.think == "the lesion is small"
    assert [(c.name, c.arguments) for c in p.tool_calls] == [("image_zoom_in", {"bbox": [1, 2, 3, 4]})]
    assert p.answers == () and p.errors == ()


def test_several_tool_calls_keep_order():
    p = parse_action(call("segment", point=[1, 1]) + "\n" + call("ground", text="liver"))
    assert [c.name for c in p.tool_calls] == ["segment", "ground"]


def test_boxed_answer_with_nested_braces_and_text_macro():
    assert parse_action(r"so \boxed{\text{T2 weighted}}").answer == "T2 weighted"
    assert parse_action(r"\boxed{a{b}c}").answer == "a{b}c"
    p = parse_action(r"<think>maybe \boxed{no}</think> final: \boxed{yes}")
    assert p.answers == ("yes",) and p.format_ok


def test_two_answers_is_a_format_error_and_last_wins():
    p = parse_action(r"\boxed{yes} or \boxed{no}")
    assert p.kind == "answer" and p.answer == "no"
    assert not p.format_ok
    assert any("exactly one" in e for e in p.errors)


def test_no_answer_no_call_is_invalid():
    p = parse_action("I think it is a fracture.")
    assert p.kind == "invalid" and p.errors == () and not p.format_ok


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("{not json}", "Invalid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"arguments": {}}', "name"),
        ('{"name": "x", "arguments": [1]}', "must be a JSON object"),
        ('{"name": "x", "arguments": "{bad"}', "Invalid JSON in the arguments"),
        ("", "Empty <tool_call>"),
    ],
)
def test_malformed_tool_calls_become_errors(body, fragment):
    p = parse_action(f"<tool_call>{body}</tool_call>")
    assert p.tool_calls == ()
    assert any(fragment in e for e in p.errors), p.errors


def test_arguments_as_json_string_and_parameters_alias():
    p = parse_action('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
                     '<tool_call>{"name": "b", "parameters": {"y": 2}}</tool_call>')
    assert [(c.name, c.arguments) for c in p.tool_calls] == [("a", {"x": 1}), ("b", {"y": 2})]


def test_unclosed_tags_are_reported():
    assert any("Unclosed <tool_call>" in e for e in parse_action('<tool_call>{"name": "a"}').errors)
    assert any("Unclosed \\boxed" in e for e in parse_action(r"\boxed{yes").errors)


def test_answer_and_tool_call_in_one_turn():
    p = parse_action(call(bbox=[0, 0, 1, 1]) + r"\boxed{yes}")
    assert p.kind == "answer" and not p.format_ok
    assert any("not run" in e for e in p.errors)


def test_invalid_utf8_bytes():
    p = parse_action(b"\xff\xfe \\boxed{yes}")
    assert p.answer == "yes"
    assert any("UTF-8" in e for e in p.errors)


def test_non_text_action():
    p = parse_action(12345)  # type: ignore[arg-type]
    assert p.kind == "invalid" and "must be text" in p.errors[0]


def test_xml_protocol_for_medix():
    p = parse_action("<think>r</think><answer> CT </answer>", protocol="xml")
    assert p.answer == "CT" and p.think == "r" and p.format_ok
    assert parse_action(r"\boxed{CT}", protocol="xml").kind == "invalid"


def test_unknown_protocol_suggests():
    with pytest.raises(ConfigError, match="Did you mean 'boxed'"):
        get_answer_protocol("boxd")


def test_too_many_calls_are_capped():
    p = parse_action(call() * 20)
    assert len(p.tool_calls) == 8 and any("At most" in e for e in p.errors)


def test_megabyte_action_parses():
    text = "x" * 1_000_000 + r"\boxed{yes}"
    assert parse_action(text).answer == "yes"


FRAGMENTS = list("<>{}\\/\"[],: abcdikorstuwx") + ["<tool_call>", "</tool_call>", "\\boxed{", "<think>", "</think>",
                                            '{"name": "a"', '"arguments":', "\x00", "é", "<answer>"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join))
def test_random_text_never_raises(text):
    p = parse_action(text)
    assert isinstance(p, ParsedAction)
    assert p.kind in {"answer", "tool_call", "invalid"}
    json.dumps(p.to_dict())  # the info payload is always serialisable


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_raise(data):
    assert isinstance(parse_action(data), ParsedAction)
