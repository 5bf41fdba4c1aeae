"""MedVQAEnv: the Gymnasium contract, episodes, truncation, bad input and misuse."""

from __future__ import annotations

import json
import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import medvqa_env  # noqa: F401  (registers MedVQA-v0)
from medvqa_env.env import MedVQAEnv
from medvqa_env.errors import ConfigError, EnvStateError
from rewards import RuleReward

ZOOM = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [20, 50, 40, 70]}}</tool_call>'


def zoom(bbox) -> str:
    return '<tool_call>' + json.dumps({"name": "image_zoom_in", "arguments": {"bbox": bbox}}) + '</tool_call>'


@pytest.fixture
def env(tiny_dataset):
    e = MedVQAEnv(dataset=tiny_dataset, reward=RuleReward(), render_mode="rgb_array")
    yield e
    e.close()


def test_check_env_passes(tiny_dataset):
    check_env(MedVQAEnv(dataset=tiny_dataset, reward=RuleReward()))


def test_gym_make_and_check_env_with_render(tiny_dataset):
    env = gym.make("MedVQA-v0", dataset=tiny_dataset, reward=RuleReward(), render_mode="rgb_array")
    check_env(env.unwrapped)
    env.close()


def test_reset_returns_prompt_images_and_info(env):
    obs, info = env.reset(seed=0, options={"index": 1})
    assert "How many lesions?" in obs["text"] and "(B) 1" in obs["text"]
    assert len(obs["images"]) == 1 and obs["images"][0].shape == (96, 96, 3)
    assert info["record_id"] == "t_mcq" and info["answer_type"] == "MCQ" and info["modality"] == "CT"
    assert "image_zoom_in" in info["system_prompt"] and '"bbox"' in info["system_prompt"]
    assert info["tools"][0]["function"]["name"] == "image_zoom_in"
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    assert env.observation_space.contains(obs)


def test_reset_by_record_id_and_seeded_sampling(env):
    assert env.reset(options={"record_id": "t_open"})[1]["index"] == 2
    picks = [env.reset(seed=s)[1]["record_id"] for s in range(6)]
    assert picks == [env.reset(seed=s)[1]["record_id"] for s in range(6)]
    with pytest.raises(IndexError, match="expected an index"):
        env.reset(options={"index": 99})


def test_episode_with_zoom_then_correct_answer(env):
    env.reset(seed=0, options={"index": 0})
    obs, reward, terminated, truncated, info = env.step("<think>small</think>" + ZOOM)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert obs["text"].startswith("<observation>") and "New image: image 1" in obs["text"]
    assert len(obs["images"]) == 1 and obs["images"][0].shape[0] >= 28
    call = info["tool_calls"][0]
    assert call["name"] == "image_zoom_in" and call["error"] is None and call["latency_s"] >= 0
    assert call["data"]["region"][0] <= 20 and call["new_image_indices"] == [1]
    assert len(env.images) == 2
    obs, reward, terminated, truncated, info = env.step(r"It is present: \boxed{Yes}")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["end_reason"] == "answer" and info["answer"] == "Yes" and info["ground_truth"] == "yes"
    assert info["correct"] is True and info["reward_components"]["accuracy"] == 1.0


def test_crop_is_addressable_in_later_calls(env):
    env.reset(options={"index": 0})
    env.step(ZOOM)
    obs, *_ , info = env.step(zoom([0, 0, 10, 10]).replace('"bbox"', '"image_index": 1, "bbox"'))
    assert info["tool_calls"][0]["error"] is None and info["tool_calls"][0]["data"]["image_index"] == 1


def test_mcq_and_wrong_answers(env):
    env.reset(options={"index": 1})
    assert env.step(r"\boxed{(B)}")[1] == 1.0
    env.reset(options={"index": 1})
    assert env.step(r"\boxed{C}")[1] == -1.0
    env.reset(options={"index": 0})
    _, reward, _, _, info = env.step(r"\boxed{yes} \boxed{no}")
    assert reward == -1.0 and info["format_ok"] is False


def test_max_turns_truncates_with_reason(env):
    env.reset(options={"index": 0})
    for turn in range(3):
        obs, reward, terminated, truncated, _ = env.step(ZOOM)
        assert not (terminated or truncated)
    assert "No tool turns left" in obs["text"]
    obs, reward, terminated, truncated, info = env.step(ZOOM)
    assert truncated and not terminated and info["end_reason"] == "max_turns"
    assert reward == -1.0 and info["answer"] is None and info["tool_calls"] == []


def test_max_turns_zero_means_answer_at_once(tiny_dataset):
    env = MedVQAEnv(dataset=tiny_dataset, reward=RuleReward(), max_turns=0)
    env.reset(options={"index": 0})
    assert env.step(ZOOM)[3] is True


def test_misuse_raises_clear_errors(env, tiny_dataset):
    with pytest.raises(EnvStateError, match="before reset"):
        MedVQAEnv(dataset=tiny_dataset, reward=RuleReward()).step(ZOOM)
    env.reset(options={"index": 0})
    env.step(r"\boxed{yes}")
    with pytest.raises(EnvStateError, match="has ended"):
        env.step(r"\boxed{yes}")
    with pytest.raises(ConfigError, match="observation_style"):
        MedVQAEnv(dataset=tiny_dataset, observation_style="xml")
    with pytest.raises(ConfigError, match="Did you mean"):
        MedVQAEnv(dataset=tiny_dataset, tools=["image_zoom"])


BAD_TURNS = {
    "malformed json": ("<tool_call>{'name': 'image_zoom_in'}</tool_call>", "Invalid JSON"),
    "unknown tool": ('<tool_call>{"name": "zoom", "arguments": {}}</tool_call>', "Unknown tool 'zoom'"),
    "missing argument": ('<tool_call>{"name": "image_zoom_in", "arguments": {}}</tool_call>', "Missing required argument 'bbox'"),
    "wrong type": (zoom("top left"), "must be array"),
    "wrong item type": (zoom([1, 2, "x", 4]), "must be number"),
    "three numbers": (zoom([1, 2, 3]), "at least 4"),
    "negative, partly inside": (zoom([-50, -50, 30, 30]), None),
    "inverted": (zoom([40, 40, 10, 10]), "inverted"),
    "outside": (zoom([500, 500, 600, 600]), "outside the image"),
    "nan": ('<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [NaN, 0, 5, 5]}}</tool_call>', "finite"),
    "huge": (zoom([0, 0, 1e308, 1e308]), None),
    "infinite": ('<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 1e999, 5]}}</tool_call>', "finite"),
    "bad image index": (zoom([0, 0, 5, 5]).replace('"bbox"', '"image_index": 7, "bbox"'), "out of range"),
    "unknown argument": (zoom([0, 0, 5, 5]).replace('"bbox"', '"zoom": 2, "bbox"'), "Unknown argument 'zoom'"),
    "no answer": ("I am not sure.", "No tool call and no final answer"),
    "empty": ("", "No tool call and no final answer"),
    "megabyte": ("a" * 1_000_000, "the limit is"),
    "invalid utf-8": (b"\xff\xfe\xfd", "UTF-8"),
    "control characters": ("\x00\x07\x1b[31m", "No tool call"),
}


@pytest.mark.parametrize("name", list(BAD_TURNS))
def test_bad_turns_become_error_observations(env, name):
    action, fragment = BAD_TURNS[name]
    env.reset(options={"index": 0})
    obs, reward, terminated, truncated, info = env.step(action)
    assert not terminated and not truncated
    assert env.observation_space.contains(obs)
    if fragment is None:  # clipped into the image: the call succeeds
        assert info["tool_calls"][0]["error"] is None
    else:
        assert fragment in obs["text"], obs["text"]
    # the episode goes on and can still be won
    assert env.step(r"\boxed{yes}")[1] == 1.0


def test_format_penalty_for_turns_without_call_or_answer(tiny_dataset):
    env = MedVQAEnv(dataset=tiny_dataset, reward=RuleReward(), format_penalty=-0.1)
    env.reset(options={"index": 0})
    assert env.step("hmm")[1] == pytest.approx(-0.1)
    assert env.step(ZOOM)[1] == 0.0


def test_tool_role_observations_and_xml_protocol(tiny_dataset):
    env = MedVQAEnv(dataset=tiny_dataset, reward=RuleReward(), observation_style="tool_role", answer_protocol="xml")
    env.reset(options={"index": 0})
    obs, *_ = env.step(ZOOM)
    assert not obs["text"].startswith("<observation>")
    assert env.messages[-1]["role"] == "tool" and env.messages[-1]["images"] == [1]
    assert "<answer>" in env.system_prompt
    assert env.step("<think>x</think><answer>yes</answer>")[1] == 1.0


def test_no_tools_config(tiny_dataset):
    env = MedVQAEnv(dataset=tiny_dataset, reward=RuleReward(), tools=[])
    _, info = env.reset(options={"index": 0})
    assert info["tools"] == [] and "<tools>" not in info["system_prompt"]
    obs, *_ = env.step(ZOOM)
    assert "Unknown tool 'image_zoom_in'. Available: []" in obs["text"]


def test_same_seed_and_index_give_identical_episodes(tiny_dataset):
    runs = []
    for _ in range(2):
        env = MedVQAEnv(dataset=tiny_dataset, reward=RuleReward())
        obs0, _ = env.reset(seed=3, options={"index": 2})
        obs1, *_ = env.step(ZOOM)
        runs.append((obs0, obs1))
    (a0, a1), (b0, b1) = runs
    assert a0["text"] == b0["text"] and a1["text"] == b1["text"]
    assert all(np.array_equal(x, y) for x, y in zip(a1["images"], b1["images"]))


def test_env_pickles_mid_episode(env):
    env.reset(options={"index": 0})
    env.step(ZOOM)
    clone = pickle.loads(pickle.dumps(env))
    assert len(clone.images) == 2 and clone.turn == 1
    assert clone.step(r"\boxed{yes}")[1] == 1.0


def test_render_draws_the_zoom_region(env):
    assert MedVQAEnv(dataset=env.dataset, reward=RuleReward()).render() is None
    env.reset(options={"index": 0})
    before = env.render()
    env.step(ZOOM)
    env.step(r"\boxed{yes}")
    after = env.render()
    assert after.dtype == np.uint8 and after.ndim == 3 and after.shape[2] == 3
    yellow = (after[..., 0] > 230) & (after[..., 1] > 190) & (after[..., 2] < 40)
    assert yellow.sum() > 50 and not ((before[..., 0] > 230) & (before[..., 1] > 190) & (before[..., 2] < 40)).any()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=80) | st.sampled_from([ZOOM, zoom([0, 0, 2, 2]), r"\boxed{yes}", "<tool_call>"]),
                min_size=1, max_size=6))
def test_random_turns_never_raise_and_episodes_end(tiny_dataset, turns):
    env = MedVQAEnv(dataset=tiny_dataset, reward=RuleReward(), max_turns=2)
    env.reset(seed=0)
    for steps, action in enumerate(turns, 1):
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs) and np.isfinite(reward)
        if terminated or truncated:
            break
        assert steps <= 2  # at most max_turns non-final turns


def test_render_overlays_a_tool_mask_where_the_tool_found_it(tiny_dataset):
    """The renderer decodes the same RLE the segment tool encodes (the lesion sits at x=30, y=60)."""
    env = MedVQAEnv(dataset=tiny_dataset, reward=RuleReward(), render_mode="rgb_array",
                    tools={"segment": {"engine": "classical"}})
    env.reset(options={"index": 0})
    _, _, _, _, info = env.step('<tool_call>{"name": "segment", "arguments": {"point": [30, 60]}}</tool_call>')
    assert info["tool_calls"][0]["error"] is None and info["tool_calls"][0]["data"]["mask_rle"]
    from medvqa_env.render import draw_overlays

    placed = []
    drawn = np.asarray(draw_overlays(env.images[0], env.trace, placed=placed)).astype(int)
    red = (drawn[..., 0] - drawn[..., 1]) > 70  # the mask tint; the yellow region outline stays out
    for _, _, (x0, y0, x1, y1) in placed:  # the tool's label (in its red) sits beside the mask
        red[y0:y1, x0:x1] = False
    ys, xs = np.nonzero(red)
    assert red.sum() > 20 and abs(xs.mean() - 30) < 4 and abs(ys.mean() - 60) < 4
