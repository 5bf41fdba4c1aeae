"""The reward registry and the env's string reward names."""

from __future__ import annotations

import pickle

import pytest

from medvqa_env.errors import ConfigError
from rewards import default_reward
from rewards.armed import ARMedReward
from rewards.base import ByAnswerType
from rewards.registry import available_rewards, build_reward
from rewards.shaping import ToolUseShaping


def test_names():
    assert available_rewards() == ["alternatives", "armed", "default", "exact_match", "grasp", "medix", "rule"]
    assert isinstance(build_reward("default"), ByAnswerType)
    assert isinstance(build_reward("armed", lambda1=0.3), ARMedReward)
    assert build_reward("armed", lambda1=0.3).config.lambda1 == 0.3
    assert build_reward("grasp").name == "grasp"
    assert build_reward("medix", judge={"base_url": "http://127.0.0.1:9"}).name == "medix"


def test_default_reward_is_cheap_and_routes_open_to_armed():
    r = default_reward()
    armed = [fn for fn in r.routes.values() if isinstance(fn, ARMedReward)]
    assert len(armed) == 1 and armed[0]._token_encoder is None   # nothing loaded at construction


def test_shaping_is_one_suffix_away():
    r = build_reward("default+tools", tool_shaping={"bonus": 0.5})
    assert isinstance(r, ToolUseShaping) and r.bonus == 0.5 and r.name == "by_answer_type+tools"
    assert isinstance(build_reward("medix+tools", judge={"base_url": "http://127.0.0.1:9"}), ToolUseShaping)


@pytest.mark.parametrize("name,message", [
    ("armd", "Did you mean 'armed'"), ("exact", "Did you mean 'exact_match'"),
    ("nope+tools", "Unknown reward 'nope'"),
])
def test_unknown_names_are_helpful(name, message):
    with pytest.raises(ConfigError, match=message):
        build_reward(name)


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="reward 'rule' has no option 'colour'"):
        build_reward("rule", colour="red")
    with pytest.raises(ConfigError, match="Did you mean 'correct'"):
        build_reward("rule:corect=2")
    with pytest.raises(ConfigError, match="bad tool_shaping options"):
        build_reward("rule+tools", tool_shaping={"colour": 1})
    with pytest.raises(ConfigError, match="no '\\+tools' suffix"):
        build_reward("rule", tool_shaping={})
    with pytest.raises(ConfigError, match="reward name"):
        build_reward(3)


def test_env_with_string_reward_scores_and_pickles():
    from medvqa_env.env import MedVQAEnv

    env = MedVQAEnv(dataset="embedded", reward="default+tools")
    env.reset(seed=0)
    clone = pickle.loads(pickle.dumps(env))                       # env + reward pickle (models dropped)
    _, reward, terminated, _, info = clone.step(r"\boxed{" + clone.record.answer + "}")
    assert terminated and info["correct"] is True and reward > 0.9
    assert "tools/used" in info["reward_components"]


def test_build_reward_is_exported_and_string_answer_types_are_scored():
    """``from rewards import build_reward`` failed, and answer_type="CLOSED" (a plain string, as
    JSON gives it) was silently unscored ([None])."""
    from rewards import RewardInput, build_reward

    reward = build_reward("default")
    out = reward([RewardInput(completion="\\boxed{yes}", answer="yes", ground_truth="yes", answer_type="CLOSED"),
                  RewardInput(completion="\\boxed{B}", answer="B", ground_truth="A", answer_type="mcq")])
    assert [o.total for o in out] == [1.0, -1.0]
