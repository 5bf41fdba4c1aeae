"""VQA-Med's accepted alternatives are scored the way the official evaluations do (the best over
them): in the evaluation's metrics and as the env reward option ``alternatives``. Real VQA-Med 2019
test lines (from the organisers' README) in a copy of the published layout; real MiniLM metrics."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image

import medvqa_env  # noqa: F401 -- registers MedVQA-v0
from eval.results import load_results
from eval.runner import EvalConfig, evaluate
from eval.scoring import OpenMetrics, score_episode
from eval.scripted import ScriptedAgent
from medvqa_env.datasets import load_dataset

LINES = [  # VQAMed2019Test/README-VQA-Med-2019-TestSet.txt's two examples
    "synpic54143|abnormality|what is the primary abnormality in this image?|anaplastic oligodendroglioma#multi-cystic complex mass",
    "synpic35171|abnormality|what is abnormal in the ct scan?|(angioinvasive aspergillosis with) septic cerebral emboli#mass",
]


@pytest.fixture
def vqamed_root(tmp_path) -> Path:
    test = tmp_path / "VQAMed2019Test"
    for i, image in enumerate(("synpic54143", "synpic35171")):
        (test / "VQAMed2019_Test_Images").mkdir(parents=True, exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 255, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(test / "VQAMed2019_Test_Images" / f"{image}.jpg")
    (test / "VQAMed2019_Test_Questions_w_Ref_Answers.txt").write_text("\n".join(LINES) + "\n")
    return tmp_path


@pytest.fixture(scope="module")
def metrics() -> OpenMetrics:
    return OpenMetrics()


def test_any_accepted_answer_is_correct(vqamed_root):
    record = load_dataset("vqamed", split="test", root=vqamed_root)[1]
    assert record.answer == "(angioinvasive aspergillosis with) septic cerebral emboli"
    for answer in ("mass", "Septic cerebral emboli.", "angioinvasive aspergillosis with septic cerebral emboli"):
        s = score_episode(record, answer, True)
        assert s["correct"] and s["exact_match"], answer
        assert s["references"] == record.metadata["answer_alternatives"]
    wrong = score_episode(record, "septic emboli", True)
    assert not wrong["correct"] and not wrong["exact_match"]


def test_open_metrics_take_the_best_alternative(metrics):
    refs = ["(angioinvasive aspergillosis with) septic cerebral emboli", "septic cerebral emboli", "mass"]
    best = metrics(["mass", "septic emboli"], [refs, refs])
    singles = [metrics(["septic emboli"], [r])[0] for r in refs]
    assert best[0]["bleu1"] == best[0]["armed_avg"] == 1.0
    for name in ("bleu1", "rouge1", "bertscore", "cossim"):
        assert best[1][name] == max(s[name] for s in singles)
    assert best[1]["armed_avg"] == pytest.approx(sum(best[1][m] for m in ("bleu1", "rouge1", "bertscore", "cossim")) / 4,
                                                 abs=1e-6)
    assert best[1]["armed_avg"] > metrics(["septic emboli"], [refs[0]])[0]["armed_avg"]


def test_identical_texts_score_exactly_one(metrics):
    texts = ["left lower lobe", "pneumothorax", "anaplastic oligodendroglioma", "mass", "ct w/contrast (iv)"]
    for row in metrics(texts, texts):
        assert row["armed_avg"] == 1.0 and all(v <= 1.0 for v in row.values())


def test_the_harness_scores_alternatives(vqamed_root, tmp_path):
    dataset = load_dataset("vqamed", split="test", root=vqamed_root)
    config = EvalConfig(workers=0, bootstrap=0, progress=False)
    summary = evaluate(ScriptedAgent(answer="mass", zoom=False), dataset, config, out_dir=tmp_path / "run")
    # "mass" is an accepted answer of the second question only
    assert summary.overall.open_exact_match.value == 0.5
    by_id = {r["record_id"]: r for r in load_results(tmp_path / "run")}
    second = by_id["vqamed2019_test_synpic35171_0"]
    assert second["correct"] and second["metrics"]["armed_avg"] == 1.0 and len(second["references"]) == 4


# issue 27: the plain rewards credit alternatives too (the eval's ``correct`` and the reward agree)
@pytest.mark.parametrize("reward, mass, emboli", [("exact_match", 1.0, 1.0), ("alternatives:reward=exact_match", 1.0, 1.0)])
def test_env_reward_option_scores_the_best_alternative(vqamed_root, reward, mass, emboli):
    env = gym.make("MedVQA-v0", dataset="vqamed", split="test", dataset_options={"root": str(vqamed_root)},
                   tools=[], reward=reward)
    got = []
    for answer in ("mass", "septic cerebral emboli"):
        env.reset(seed=0, options={"index": 1})
        _, r, terminated, _, info = env.step(rf"<think>t</think>\boxed{{{answer}}}")
        assert terminated
        got.append(r)
    assert got == [mass, emboli]
    if reward.startswith("alternatives"):
        assert info["reward_components"]["alternative"] in (1.0, 2.0) and info["reward_components"]["n_alternatives"] == 4


def test_default_reward_credits_an_accepted_answer_as_the_alternatives_wrapper_does(vqamed_root):
    plain = gym.make("MedVQA-v0", dataset="vqamed", split="test", dataset_options={"root": str(vqamed_root)}, tools=[])
    best = gym.make("MedVQA-v0", dataset="vqamed", split="test", dataset_options={"root": str(vqamed_root)}, tools=[],
                    reward="alternatives")
    rewards = []
    for env in (plain, best):
        env.reset(seed=0, options={"index": 1})
        rewards.append(env.step(r"<think>t</think>\boxed{mass}")[1])
    # ARMed scores the best accepted answer itself (issue 27: it was -0.4, wrong against the first answer)
    assert 0.9 < rewards[0] == pytest.approx(rewards[1])
