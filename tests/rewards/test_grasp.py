"""GRASP reward: exact match 2/0, synonym BERTScore, CLIP image-reasoning term, format penalties."""

from __future__ import annotations

import pickle

import pytest
from PIL import Image

from medvqa_env.records import AnswerType
from rewards.base import RewardInput
from rewards.grasp import GRASPReward, reasoning_text


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "scan.png"
    Image.radial_gradient("L").convert("RGB").save(path)
    return str(path)


@pytest.fixture
def grasp(minilm):
    return GRASPReward(token_encoder=minilm)


def _s(answer, truth, image=None, format_ok=True, completion=None):
    completion = completion or rf"<think>the liver looks enlarged</think> \boxed{{{answer}}}"
    return RewardInput(completion, answer, truth, AnswerType.OPEN, format_ok=format_ok,
                       metadata={"image_paths": [image] if image else []})


def test_reasoning_text():
    assert reasoning_text(r"<think> a  b </think>\boxed{c}") == "a b"
    assert reasoning_text(r"I think so \boxed{yes}") == "I think so"


def test_exact_match_synonym_and_penalties(grasp):
    right, synonym, wrong, bad_format, missing = grasp([
        _s("The liver.", "liver"), _s("hepatic", "liver"), _s("spleen", "liver"),
        _s("liver", "liver", format_ok=False), _s(None, "liver", format_ok=False),
    ])
    assert right.components["exact_match"] == 2.0 and right.components["synonym"] > 0.8
    assert right.total == pytest.approx(2.0 + 0.5 * right.components["synonym"])
    assert synonym.components["exact_match"] == 0.0 and synonym.components["synonym"] > wrong.components["synonym"]
    assert bad_format.components["format_penalty"] == -0.5 and bad_format.total == pytest.approx(2.0 + 0.5 * bad_format.components["synonym"] - 0.5)
    assert missing.total == -1.0 and missing.components["synonym"] == 0.0
    assert "image_reasoning" not in right.components            # no image, no term


def test_image_reasoning_term_is_off_without_a_clip_checkpoint(grasp, image, caplog, minilm):
    assert grasp.clip is None
    (out,) = grasp([_s("liver", "liver", image=image)])
    assert "image_reasoning" not in out.components
    assert out.total == pytest.approx(2.0 + 0.5 * out.components["synonym"])
    with caplog.at_level("WARNING", logger="rewards.grasp"):
        GRASPReward(token_encoder=minilm)
    assert "image-reasoning term is off" in caplog.text


def test_image_reasoning_term_with_tiny_random_clip(minilm, image, tmp_path):
    grasp = GRASPReward(token_encoder=minilm, clip_model="tiny-random-clip")  # untrained: the code path only
    assert grasp.clip.name == "tiny-random-clip"
    with_img, broken = grasp([_s("liver", "liver", image=image), _s("liver", "liver", image=str(tmp_path / "gone.png"))])
    sim = with_img.components["image_reasoning"]
    assert 0.0 <= sim <= 1.0
    assert with_img.total == pytest.approx(2.0 + 0.5 * with_img.components["synonym"] + 0.25 * sim)
    assert "image_reasoning" not in broken.components           # unreadable image: term absent, no crash
    again = pickle.loads(pickle.dumps(grasp))
    assert again.clip._model is None
    assert again([_s("liver", "liver", image=image)])[0].components["image_reasoning"] == pytest.approx(sim, abs=1e-6)
