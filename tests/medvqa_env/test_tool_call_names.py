"""A tool call's name must be a string: any other JSON value is refused with an observation that
says so, never turned into a call (nor a crash when the call is keyed, logged or dispatched)."""

from __future__ import annotations

import json

import pytest

from medvqa_env.env import MedVQAEnv
from medvqa_env.parser import parse_action
from rewards import RuleReward

NOT_STRINGS = {"int": 5, "float": 1.5, "bool": True, "list": ["image_zoom_in"], "dict": {"tool": "image_zoom_in"}}


def _turn(name) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"bbox": [0, 0, 5, 5]}}) + "</tool_call>"


@pytest.mark.parametrize("kind", list(NOT_STRINGS))
def test_a_non_string_name_is_an_error_not_a_call(kind):
    p = parse_action(_turn(NOT_STRINGS[kind]))
    assert p.tool_calls == () and p.kind == "invalid"
    assert p.errors == (f"\"name\" in <tool_call> must be a string (a tool's name), got {kind}.",)


def test_a_bad_name_does_not_drop_the_good_calls_beside_it():
    p = parse_action(_turn(7) + _turn("image_zoom_in"))
    assert [c.name for c in p.tool_calls] == ["image_zoom_in"] and len(p.errors) == 1


@pytest.mark.parametrize("body", ['{"arguments": {}}', '{"name": null}', '{"name": ""}'])
def test_a_missing_or_empty_name_is_reported_as_missing(body):
    assert parse_action(f"<tool_call>{body}</tool_call>").errors == ("<tool_call> is missing a string \"name\".",)


def test_the_env_tells_the_agent_and_the_episode_goes_on(tiny_dataset):
    env = MedVQAEnv(dataset=tiny_dataset, reward=RuleReward())
    try:
        env.reset(options={"index": 0})
        obs, _, terminated, truncated, info = env.step(_turn(["image_zoom_in"]))
        assert not terminated and not truncated and env.observation_space.contains(obs)
        assert "must be a string" in obs["text"] and not info["tool_calls"]
        assert env.step(r"\boxed{yes}")[1] == 1.0
    finally:
        env.close()
