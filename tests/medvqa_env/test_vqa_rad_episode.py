"""An episode on the real VQA-RAD images (runs when ../shared/data/vqa_rad is there)."""

from __future__ import annotations

from gymnasium.utils.env_checker import check_env

from medvqa_env.env import MedVQAEnv
from rewards import RuleReward


def test_zoom_and_boxed_answer_on_vqa_rad(vqa_rad_root):
    env = MedVQAEnv(dataset="vqa_rad", split="test", dataset_options={"root": vqa_rad_root}, reward=RuleReward(),
                    render_mode="rgb_array")
    assert len(env.dataset) == 451
    index = next(i for i, r in enumerate(env.dataset) if r.answer_type.value == "CLOSED")
    record = env.dataset[index]
    obs, info = env.reset(seed=0, options={"index": index})
    h, w, _ = obs["images"][0].shape
    assert info["organ"] in {"HEAD", "CHEST", "ABD"} and min(h, w) > 100
    bbox = [w // 4, h // 4, w // 2, h // 2]
    obs, reward, terminated, truncated, info = env.step(
        f'<tool_call>{{"name": "image_zoom_in", "arguments": {{"bbox": {bbox}}}}}</tool_call>')
    assert info["tool_calls"][0]["error"] is None and obs["images"][0].shape[0] >= 300
    obs, reward, terminated, truncated, info = env.step(rf"\boxed{{{record.answer}}}")
    assert terminated and reward == 1.0 and info["ground_truth"] == record.answer
    assert env.render().shape[2] == 3
    check_env(env)
