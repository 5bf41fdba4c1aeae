"""DiscreteMedVQA: SB3-compatible spaces over the same env and reward; the PPO script runs."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from agents.sb3_wrapper import DiscreteMedVQA, answer_vocabulary, make_sb3_env
from medvqa_env.datasets import load_dataset
from medvqa_env.env import MedVQAEnv
from rewards import RuleReward


@pytest.fixture(scope="module")
def train_set():
    return load_dataset("embedded", split="train")


@pytest.fixture
def wrapped(train_set):
    env = DiscreteMedVQA(MedVQAEnv(dataset=train_set, reward=RuleReward(), max_turns=2))
    yield env
    env.close()


def test_sb3_and_gymnasium_checkers_pass(wrapped):
    sb3_check_env(wrapped, warn=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*different from the unwrapped version.*")  # wrapping is the point
        gym_check_env(wrapped, skip_render_check=True)


def test_vocabulary_comes_from_the_train_split(train_set, wrapped):
    vocab = answer_vocabulary(train_set, n_open=32)
    assert vocab[:2] == ["yes", "no"] and {"A", "B", "C", "D"} <= set(vocab)
    assert wrapped.answers == vocab
    names = wrapped.action_meanings()
    assert len(names) == wrapped.action_space.n and names[0] == "answer:yes"
    assert "image_zoom_in:centre" in names


def test_a_zoom_action_runs_the_real_tool_and_changes_the_observation(wrapped):
    obs, _ = wrapped.reset(seed=0, options={"index": 0})
    zoom = wrapped.action_meanings().index("image_zoom_in:cell(0,0)")
    obs2, reward, terminated, truncated, info = wrapped.step(zoom)
    assert not (terminated or truncated) and reward == 0.0
    assert info["tool_calls"][0]["error"] is None and '"image_zoom_in"' in info["action_text"]
    assert not np.array_equal(obs["image"], obs2["image"])  # now the crop
    features = obs2["features"]
    assert features[9] == 1.0 and features[11] == 1.0  # last tool ok, gave an image
    assert np.allclose(features[12:16], [0, 0, 1 / 3, 1 / 3], atol=0.05)  # the zoomed cell
    assert obs2 in wrapped.observation_space


def test_answers_get_exactly_the_underlying_env_reward(train_set, wrapped):
    plain = MedVQAEnv(dataset=train_set, reward=RuleReward(), max_turns=2)
    for index in range(6):
        for action in (0, 1, 2):  # yes, no, A
            wrapped.reset(options={"index": index})
            _, reward, terminated, _, info = wrapped.step(action)
            plain.reset(options={"index": index})
            _, expected, *_ = plain.step(info["action_text"])
            assert terminated and reward == expected and info["correct"] == (reward == 1.0)


def test_bad_actions_and_envs_raise(wrapped):
    wrapped.reset(seed=0)
    with pytest.raises(ValueError, match="expected an action in 0.."):
        wrapped.step(wrapped.action_space.n)
    with pytest.raises(ValueError, match="expected a MedVQAEnv"):
        DiscreteMedVQA(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="expected a MedVQAEnv"):
        DiscreteMedVQA(object())
    env = make_sb3_env("embedded", split="test", wrapper_options={"image_size": 48, "grey": False}, max_turns=1)
    assert env.observation_space["image"].shape == (3, 48, 48)


def test_ppo_script_trains_and_reports(tmp_path, capsys):
    import json

    from stable_baselines3 import PPO

    from train.ppo_sb3 import main

    out = tmp_path / "ppo.json"
    argv = ["--total-timesteps", "128", "--n-envs", "2", "--n-steps", "64", "--batch-size", "64",
            "--n-epochs", "1", "--eval-episodes", "8", "--out", str(out)]
    result = main(argv)
    saved = json.loads(out.read_text())
    assert saved["before"]["n"] == 8 and 0.0 <= saved["after"]["accuracy"] <= 1.0
    assert set(result["after"]["accuracy_by_type"]) <= {"CLOSED", "OPEN", "MCQ"}
    # it ends with the final held-out figure, where the policy is, and the command that reproduces it
    printed = capsys.readouterr().out
    end = printed[printed.index("== train.ppo_sb3 done"):]
    assert f"accuracy {saved['after']['accuracy']:.3f}" in end and f"{tmp_path / 'ppo.policy.zip'}" in end
    assert "reproduce the held-out figure: python -m train.ppo_sb3 " + " ".join(argv) in end
    assert PPO.load(str(tmp_path / "ppo.policy.zip"), device="cpu").policy is not None


def test_sb3_copies_share_one_reward_and_ppo_ends_a_batch_per_rollout(train_set):
    from stable_baselines3 import PPO

    from agents.sb3_wrapper import end_batch_callback, make_sb3_vec_env

    vec, services = make_sb3_vec_env(2, train_set, tools=["image_zoom_in"], reward="default", max_turns=1)
    try:
        assert all(e.unwrapped.reward_fn is services.reward for e in vec.envs)
        assert all(e.unwrapped.toolbox is services.toolbox for e in vec.envs)
        ended = []
        real = services.end_batch
        services.end_batch = lambda batch_id=None: ended.append(batch_id) or real(batch_id)
        model = PPO("MultiInputPolicy", vec, n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu")
        model.learn(total_timesteps=64, callback=end_batch_callback(services))
        assert ended == [0, 1]                                             # 64 steps = two rollouts of 2 x 16
        assert services.state_dict()["reward"]["OPEN"]["thresholds"]["last_batch_id"] == 1
    finally:
        vec.close()
        services.close()
