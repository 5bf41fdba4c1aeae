"""A policy's turn text cannot freeze or crash the env (issue 28, items 1 and 2).

RL policies find slow paths by accident: ``"<think>" * 9362`` took 11.5 s for one ``step`` with
the regex parser, nested ``\\boxed{`` 21.4 s, and a ``bytes`` turn skipped the length cap. Every
hostile turn here must be an observation (never an exception) in time comparable to a plain
step: the bound is a ratio against a plain tool-call step measured in the same run, so a loaded
machine slows both alike. Hypothesis drives it with any text, any bytes and long repetitions
of the parser's own tokens.
"""

from __future__ import annotations

import logging
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medvqa_env import MedVQAEnv
from medvqa_env.parser import MAX_ACTION_CHARS, parse_action

PLAIN = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [%d, 0, 40, 40]}}</tool_call>'
RATIO = 25  # a hostile step may cost this many plain steps (the quadratic parser was over 1,000x)
TOKENS = ["<think>", "</think>", "\\boxed{", "}", "{", "<tool_call>", "</tool_call>", "<answer>", "</answer>",
          "\\text{", '{"name": "image_zoom_in", "arguments": {', '"bbox": [', "9" * 50, "[", "]", "\\", '"']


def pathological(n_chars: int = MAX_ACTION_CHARS - 16) -> dict[str, str]:
    """The issue's turns, each as long as the env lets a turn be."""
    half = n_chars // 16
    return {
        "think opened": "<think>" * (n_chars // 7),
        "think closed late": "<think>" * (n_chars // 7 - 2) + "</think>",
        "nested boxed": "\\boxed{" * half + "}" * half,
        "unclosed boxed": "\\boxed{" * (n_chars // 7),
        "answers": "<answer>" * (n_chars // 8),
        "tool calls": "<tool_call>" * (n_chars // 11),
        "braces": "{" * n_chars,
        "text wrapper": "\\boxed{" + "\\text{" * (n_chars // 7 - 2) + "}",
    }


@pytest.fixture(scope="module")
def env():
    e = MedVQAEnv("embedded", tools=["image_zoom_in"], reward="rule", max_turns=10 ** 6)
    e.reset(seed=0)
    yield e
    e.close()


def _step_seconds(env, action, repeats: int = 3) -> float:
    best = float("inf")
    for i in range(repeats):
        if env.done:
            env.reset(seed=0)
        turn = action(i) if callable(action) else action
        start = time.perf_counter()
        obs, *_ = env.step(turn)
        best = min(best, time.perf_counter() - start)
        assert isinstance(obs["text"], str)
    return best


@pytest.fixture(scope="module")
def plain_step_s(env):
    """A plain tool-call step: a zoom the toolbox has not cached (a new box each time)."""
    return _step_seconds(env, lambda i: PLAIN % (i % 20), repeats=5)


@pytest.mark.parametrize("name", sorted(pathological()))
def test_a_pathological_turn_costs_a_few_plain_steps(env, plain_step_s, name):
    action = pathological()[name]
    assert len(action) <= MAX_ACTION_CHARS
    hostile = _step_seconds(env, action)
    assert hostile < RATIO * plain_step_s, f"{name}: {hostile:.4f} s vs a plain step's {plain_step_s:.4f} s"


def test_a_bytes_turn_gets_the_same_length_cap(env):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(b"<think>" * 20_000)
    assert not terminated and "the limit is 65536" in obs["text"] and "140000 bytes" in obs["text"]
    env.reset(seed=0)
    obs, *_ = env.step("x" * (MAX_ACTION_CHARS + 1))
    assert "65537 characters; the limit is 65536" in obs["text"]


@pytest.mark.parametrize("digits", [400, 5000])
def test_a_huge_integer_in_a_tool_call_is_an_observation(env, caplog, digits):
    """Over 4,300 digits ``json.loads`` raises ``ValueError`` (the env raised); 400 digits reached
    the tool, which crashed and logged a traceback on every call."""
    env.reset(seed=0)
    turn = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, %s, 40]}}</tool_call>' % ("9" * digits)
    with caplog.at_level(logging.WARNING):
        obs, reward, terminated, truncated, info = env.step(turn)
    assert f"an integer of {digits} digits" in obs["text"] and not info["tool_calls"]
    assert not [r for r in caplog.records if r.exc_info], "no traceback for a model's number"
    parsed = parse_action('<tool_call>{"name": "t", "arguments": "{\\"x\\": %s}"}</tool_call>' % ("1" * digits))
    assert parsed.errors and "digits" in parsed.errors[0]  # arguments as a JSON string: same refusal


# ---- property-based: any text, any bytes, long runs of the parser's tokens ----------------------
REPEATED = st.lists(st.tuples(st.sampled_from(TOKENS), st.integers(1, 3000)), min_size=1, max_size=6).map(
    lambda parts: "".join(tok * n for tok, n in parts)[:MAX_ACTION_CHARS])
ANY_TURN = st.one_of(st.text(max_size=2000), st.binary(max_size=2000), REPEATED,
                     st.lists(st.sampled_from(TOKENS + ["a", " ", "\x00", "\ud800", "é"]), max_size=400).map("".join))


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(turn=ANY_TURN)
def test_any_turn_is_an_observation_in_bounded_time(env, plain_step_s, turn):
    if env.done:
        env.reset(seed=0)
    start = time.perf_counter()
    obs, reward, terminated, truncated, info = env.step(turn)
    elapsed = time.perf_counter() - start
    assert isinstance(obs["text"], str) and isinstance(reward, float)
    assert isinstance(info["format_errors"], list)
    assert elapsed < RATIO * plain_step_s + 0.05, f"{elapsed:.4f} s for a {len(turn)}-long turn"


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(turn=ANY_TURN, protocol=st.sampled_from(["boxed", "xml"]))
def test_the_parser_never_raises(turn, protocol):
    parsed = parse_action(turn, protocol, max_chars=MAX_ACTION_CHARS)
    assert parsed.kind in ("answer", "tool_call", "invalid")
    assert all(isinstance(e, str) and e for e in parsed.errors)
    assert len(parsed.tool_calls) <= 8 and len(parsed.answers) <= 8


# ---- the rewards read the policy's text too ---------------------------------------------------
MEDIX_TOKENS = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "a", "CT", "[CT]", "<modality>", "</modality>"]


def _old_split_medix(text: str):
    """The regex formulation ``split_medix`` had (quadratic on ``"<think>" * n``), as the oracle."""
    import re

    from rewards.medix import _NESTED, _TAGS

    spans = re.findall(r"<answer>(.*?)</answer>", text, re.S)
    answer = spans[-1].strip() if spans else None
    m = re.match(r"^\s*(?P<pre>.*?)\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", text, re.S)
    if not m or _NESTED.search(m.group("think")) or _NESTED.search(m.group("answer")):
        return False, None, answer
    if not m.group("think").strip() or not m.group("answer").strip():
        return False, None, answer
    pre = m.group("pre").strip()
    if not pre:
        return True, None, answer
    for pattern in _TAGS:
        t = pattern.fullmatch(pre)
        if t:
            return True, t.group(1).strip(), answer
    return False, None, answer


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(parts=st.lists(st.sampled_from(MEDIX_TOKENS), max_size=40))
def test_the_linear_medix_format_agrees_with_the_regex(parts):
    from rewards.medix import split_medix

    text = "".join(parts)
    assert split_medix(text) == _old_split_medix(text)


@pytest.mark.parametrize("name", sorted(pathological()))
def test_the_rewards_read_a_pathological_turn_in_linear_time(plain_step_s, name):
    from rewards.grasp import reasoning_text
    from rewards.medix import split_medix

    action = pathological()[name]
    start = time.perf_counter()
    split_medix(action), reasoning_text(action)
    assert time.perf_counter() - start < RATIO * plain_step_s, name
