"""Image ablation in the env: the agent, the tools and the oracle annotations all see the change."""

from __future__ import annotations

import numpy as np
import pytest

from medvqa_env.ablation import donor_indices
from medvqa_env.env import MedVQAEnv
from medvqa_env.errors import ConfigError

GROUND = '<tool_call>{"name": "ground", "arguments": {"text": "lesion"}}</tool_call>'


def lesion_index(env: MedVQAEnv) -> int:
    """A record whose image holds a lesion (the oracle grounder finds it)."""
    return next(i for i, r in enumerate(env.dataset) if r.metadata.get("n_lesions", 0) > 0)


def test_blank_shows_black_pixels_and_tools_find_nothing():
    normal = MedVQAEnv(split="test", tools={"ground": "oracle"})
    blank = MedVQAEnv(split="test", tools={"ground": "oracle"}, image_ablation="blank")
    i = lesion_index(normal)
    obs_n, info_n = normal.reset(seed=0, options={"index": i})
    obs_b, info_b = blank.reset(seed=0, options={"index": i})
    assert obs_n["images"][0].max() > 0
    assert obs_b["images"][0].shape == obs_n["images"][0].shape and obs_b["images"][0].max() == 0
    assert info_b["question"] == info_n["question"]  # the question is the record's own
    assert "Found nothing" not in normal.step(GROUND)[0]["text"]  # the real image holds a lesion
    found = blank.step(GROUND)[0]["text"]
    assert "Found nothing" in found
    _, reward, *_ = blank.step(rf"\boxed{{{blank.record.answer}}}")
    assert reward == 1.0  # scored against the record's own gold answer


def test_shuffle_shows_another_records_image_and_its_annotations():
    normal = MedVQAEnv(split="test", tools={"ground": "oracle"})
    shuffled = MedVQAEnv(split="test", tools={"ground": "oracle"}, image_ablation="shuffle")
    donors = donor_indices(normal.dataset)
    for i in range(0, 40, 3):
        obs_s, _ = shuffled.reset(seed=0, options={"index": i})
        donor_obs, _ = normal.reset(seed=0, options={"index": donors[i]})
        own_obs, _ = normal.reset(seed=0, options={"index": i})
        assert normal.dataset[donors[i]].image_paths != normal.dataset[i].image_paths
        assert np.array_equal(obs_s["images"][0], donor_obs["images"][0])
        assert not np.array_equal(obs_s["images"][0], own_obs["images"][0])
        assert shuffled.annotations == normal.dataset[donors[i]].annotations


def test_shuffle_is_the_same_in_every_copy():
    a = MedVQAEnv(split="test", image_ablation="shuffle")
    b = MedVQAEnv(split="test", image_ablation="shuffle")
    assert donor_indices(a.dataset) == donor_indices(b.dataset)
    oa, _ = a.reset(seed=3, options={"index": 7})
    ob, _ = b.reset(seed=3, options={"index": 7})
    assert np.array_equal(oa["images"][0], ob["images"][0])


def test_unknown_ablation_is_a_clear_error():
    with pytest.raises(ConfigError, match="blank"):
        MedVQAEnv(split="test", image_ablation="blnak")


def test_shuffle_needs_two_images(tmp_path):
    from PIL import Image

    from medvqa_env.records import VQADataset, VQARecord

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    ds = VQADataset([VQARecord(id=f"q{i}", image_paths=(str(tmp_path / "a.png"),), question="q?", answer="yes",
                               answer_type="CLOSED", dataset="x") for i in range(3)], name="x")
    with pytest.raises(ConfigError, match="at least 2 different images"):
        MedVQAEnv(dataset=ds, image_ablation="shuffle")


def test_blank_policy_blinds_the_agent_only_the_tools_see_the_real_image():
    normal = MedVQAEnv(split="test", tools={"ground": "oracle", "image_zoom_in": "local"})
    blind = MedVQAEnv(split="test", tools={"ground": "oracle", "image_zoom_in": "local"}, image_ablation="blank_policy")
    i = lesion_index(normal)
    obs_n, _ = normal.reset(seed=0, options={"index": i})
    obs_b, _ = blind.reset(seed=0, options={"index": i})
    assert obs_b["images"][0].shape == obs_n["images"][0].shape and obs_b["images"][0].max() == 0
    assert obs_n["images"][0].max() > 0
    said = normal.step(GROUND)[0]["text"]
    assert blind.step(GROUND)[0]["text"] == said and "Found nothing" not in said  # the tool saw the lesion
    zoom = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 60, 60]}}</tool_call>'
    blind.reset(seed=0, options={"index": i})
    crop = blind.step(zoom)[0]["images"]
    assert len(crop) == 1 and crop[0].max() == 0  # a tool's crop of the real image is not shown either
    assert blind.images[0].getextrema() != ((0, 0), (0, 0), (0, 0))  # the env (and its tools) keep the real one
