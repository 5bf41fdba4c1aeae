"""A turn that neither calls a tool nor answers costs the episode ``format_penalty`` (issue 42:
``closed_machine2`` seed 1 drifted into ``yes}`` then ``\\boxed{yes}``, a wasted turn that cost
nothing), in the return GRPO's advantages are computed from; and the trainers pass it to the env."""

from __future__ import annotations

import os

import pytest

from agents.models import load_policy
from medvqa_env.pool import EnvPool
from train import grpo
from train.common import SHORT_SYSTEM_PROMPT, env_kwargs, run_env_kwargs
from train.rollout import ScriptedGenerator, collect_rollouts

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _episode(encoder, penalty: float, first_turn: str):
    pool = EnvPool(env_kwargs("embedded", "val", "ground=oracle", 1, format_penalty=penalty), 2)
    script = ScriptedGenerator(encoder, lambda conv: first_turn if conv.turns == 0 else "\\boxed{yes}")
    try:
        return collect_rollouts(script, pool, encoder, [(0, {"index": 0}), (0, {"index": 0})]).trajectories[0]
    finally:
        pool.close()


def test_an_invalid_turn_costs_the_penalty_and_is_counted():
    _, encoder, _ = load_policy("tiny-qwen2-vl", system_prompt=SHORT_SYSTEM_PROMPT)
    direct = _episode(encoder, -0.2, "\\boxed{yes}")
    wasted = _episode(encoder, -0.2, "yes}")
    free = _episode(encoder, 0.0, "yes}")
    assert direct.invalid_turns == 0 and wasted.invalid_turns == free.invalid_turns == 1
    assert len(wasted.turn_texts) == 2 and wasted.answer == direct.answer == "yes"
    assert wasted.reward == pytest.approx(direct.reward - 0.2) and free.reward == pytest.approx(direct.reward)
    called = _episode(encoder, -0.2, '<tool_call>{"name": "ground", "arguments": {"text": "lesion"}}</tool_call>')
    assert called.invalid_turns == 0 and called.reward == pytest.approx(direct.reward)  # a tool turn is not invalid


def test_the_trainer_hands_its_format_penalty_to_the_env():
    args = grpo.Args(format_penalty=-0.2, tools="ground=oracle", dataset="embedded")
    assert run_env_kwargs(args, "train")["format_penalty"] == -0.2
    assert "format_penalty" not in run_env_kwargs(grpo.Args(tools="ground=oracle"), "train")  # the env's default
