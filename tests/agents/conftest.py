"""Fixtures for agent tests: real VQA-RAD slices, a tiny annotated set and an episode runner."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from medvqa_env.chat import Conversation
from medvqa_env.env import MedVQAEnv
from medvqa_env.records import Annotations, AnswerType, Box, VQADataset, VQARecord
from rewards import RuleReward


def run_episodes(env: MedVQAEnv, agent, indices, max_steps: int = 8) -> list[dict]:
    """Run one episode per index with ``act_batch`` over all live episodes; return final infos
    (plus ``turns`` and ``actions``). Stepping stops at ``max_steps`` as a guard, never silently:
    a test sees ``end_reason is None``."""
    envs, convs, results = [], [], []
    for i in indices:
        e = MedVQAEnv(dataset=env.dataset, tools=env.toolbox, reward=env.reward_fn, max_turns=env.max_turns,
                      answer_protocol=env.protocol, observation_style=env.observation_style)
        obs, info = e.reset(options={"index": i})
        envs.append(e)
        convs.append(Conversation.start(obs, info, observation_style=env.observation_style))
        results.append({"actions": [], "end_reason": None})
    live = list(range(len(envs)))
    for _ in range(max_steps):
        if not live:
            break
        actions = agent.act_batch([convs[k] for k in live])
        assert len(actions) == len(live) and all(isinstance(a, str) for a in actions)
        still = []
        for k, action in zip(live, actions):
            obs, reward, terminated, truncated, info = envs[k].step(action)
            results[k]["actions"].append(action)
            if terminated or truncated:
                results[k].update(info, reward=reward, turns=len(results[k]["actions"]))
            else:
                convs[k].add_turn(action, obs)
                still.append(k)
        live = still
    return results


@pytest.fixture(scope="session")
def rad_train(vqa_rad_root):
    from medvqa_env.datasets.vqa_rad import load_vqa_rad

    return load_vqa_rad("train", root=vqa_rad_root)


@pytest.fixture(scope="session")
def rad_test(vqa_rad_root):
    from medvqa_env.datasets.vqa_rad import load_vqa_rad

    return load_vqa_rad("test", root=vqa_rad_root)


@pytest.fixture
def rad_env(rad_test):
    env = MedVQAEnv(dataset=rad_test, reward=RuleReward())
    yield env
    env.close()


@pytest.fixture(scope="session")
def tiny_annotated(tmp_path_factory) -> VQADataset:
    """Three real PNG phantoms with a bright annotated lesion: CLOSED, MCQ and OPEN."""
    root = tmp_path_factory.mktemp("tiny_agents")
    paths = []
    for i in range(3):
        rng = np.random.default_rng(i)
        img = rng.normal(60, 8, (96, 96)).clip(0, 255)
        yy, xx = np.mgrid[:96, :96]
        img[(yy - 60) ** 2 + (xx - 30) ** 2 < 36] = 200
        p = root / f"img{i}.png"
        Image.fromarray(np.stack([img] * 3, -1).astype(np.uint8)).save(p)
        paths.append(str(p))
    lesion = Annotations(boxes=(Box("lesion", (24.0, 54.0, 36.0, 66.0)),))
    return VQADataset([
        VQARecord("t_closed", (paths[0],), "Is there a lesion?", "yes", AnswerType.CLOSED, "tiny", annotations=lesion),
        VQARecord("t_mcq", (paths[1],), "How many lesions?", "B", AnswerType.MCQ, "tiny",
                  options={"A": "0", "B": "1", "C": "2"}, annotations=lesion),
        VQARecord("t_open", (paths[2],), "Which side is the lesion on?", "left", AnswerType.OPEN, "tiny",
                  annotations=lesion),
    ], name="tiny")


@pytest.fixture(scope="session")
def episodes():
    """:func:`run_episodes` as a fixture (test modules here are not importable as a package)."""
    return run_episodes
