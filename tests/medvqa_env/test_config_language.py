"""One config language (issue 11): tools spelt as a string, list, name=engine, URL or dict mean the
same thing in gym.make, eval.run and the trainers; unknown options fail with a suggestion."""

from __future__ import annotations

import gymnasium as gym
import pytest

import medvqa_env  # noqa: F401  (registers MedVQA-v0)
from medvqa_env.errors import ConfigError
from tool_backends.config import load_tool_config, with_tool_options


def test_every_tool_spelling_is_the_same_config():
    same = [
        "image_zoom_in,segment=classical,ground=http://127.0.0.1:7660",
        ["image_zoom_in", "segment=classical", "ground=http://127.0.0.1:7660"],
        {"image_zoom_in": "local", "segment": "classical", "ground": "http://127.0.0.1:7660"},
        {"image_zoom_in": None, "segment": {"engine": "classical"}, "ground": {"url": "http://127.0.0.1:7660"}},
        '{"image_zoom_in": "local", "segment": "classical", "ground": "http://127.0.0.1:7660"}',
    ]
    configs = [load_tool_config(s) for s in same]
    assert all(c == configs[0] for c in configs)
    assert configs[0]["ground"] == {"backend": "http", "url": "http://127.0.0.1:7660"}
    assert load_tool_config("none") == {} == load_tool_config("") == load_tool_config([])


def test_gym_make_takes_the_command_line_spelling():
    env = gym.make("MedVQA-v0", tools="image_zoom_in,segment=classical", reward="rule")
    assert sorted(env.unwrapped.toolbox.names) == ["image_zoom_in", "segment"]
    env2 = gym.make("MedVQA-v0", tools={"segment": "classical"}, reward="rule")
    assert env2.unwrapped.toolbox.names == ["segment"]
    env.close(), env2.close()


def test_typos_are_config_errors_with_suggestions():
    with pytest.raises(ConfigError, match="Did you mean 'max_side'"):
        gym.make("MedVQA-v0", tools={"image_zoom_in": {"max_sid": 3}}, reward="rule")
    with pytest.raises(ConfigError, match="Did you mean 'classical'"):
        gym.make("MedVQA-v0", tools="segment=classicl", reward="rule")
    with pytest.raises(ConfigError, match="Did you mean 'root'"):
        gym.make("MedVQA-v0", dataset="vqa_rad", dataset_options={"roott": "/x"}, reward="rule")
    with pytest.raises(ConfigError, match="Did you mean 'correct'"):
        gym.make("MedVQA-v0", reward="rule:corect=2")
    with pytest.raises(ConfigError, match="Did you mean 'model'"):
        from agents.registry import build_agent
        build_agent("vlm", modle="tiny-qwen2-vl")
    from tool_backends.config import make_backends

    with pytest.raises(ConfigError, match="Did you mean 'timeout_s'"):
        make_backends(load_tool_config({"segment": {"url": "http://127.0.0.1:1", "timout_s": 3}}))


def test_tool_options_and_reward_specs():
    cfg = with_tool_options(load_tool_config("segment=classical"), ["segment.smooth_sigma=2.0"])
    assert cfg == {"segment": {"backend": "local", "engine": "classical", "smooth_sigma": 2.0}}
    with pytest.raises(ConfigError, match="Unknown tool in --tools 'segmnt'"):
        with_tool_options(cfg, ["segmnt.x=1"])
    from rewards import build_reward

    assert build_reward("rule:correct=2").correct == 2.0
    assert build_reward({"name": "rule", "incorrect": -2}).incorrect == -2.0
