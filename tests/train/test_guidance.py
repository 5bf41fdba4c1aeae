"""Issue 46's off-policy guidance lever (``train.grpo --guidance k``): in every group, ``k`` episodes
are train.sft's gold demonstration on the same question, rewarded by the env like the policy's, marked
off-policy; the policy's own rollouts (what the rollout metrics count) are the other ``group_size - k``."""

from __future__ import annotations

import os

import pytest
import torch

from agents.models import load_policy
from medvqa_env.errors import ConfigError
from medvqa_env.pool import EnvPool
from train import grpo
from train.algorithms import AdvantageInput, compute_advantages
from train.common import SHORT_SYSTEM_PROMPT, run_env_kwargs, select_indices
from train.rollout import ScriptedGenerator

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("emb"))
    args = grpo.Args(tools="ground=oracle", dataset="embedded", dataset_opt=[f"root={root}"], answer_types="CLOSED",
                     group_size=4, guidance=1, max_turns=1)
    _, encoder, _ = load_policy("tiny-qwen2-vl", system_prompt=SHORT_SYSTEM_PROMPT)
    pool = EnvPool(run_env_kwargs(args, "train"), 8)
    yield args, encoder, pool, select_indices("embedded", "train", "CLOSED", dataset_options={"root": root})
    pool.close()


def test_each_group_holds_the_policys_samples_and_one_gold_demonstration(setup):
    args, encoder, pool, train_idx = setup
    policy = ScriptedGenerator(encoder, lambda conv: "\\boxed{maybe}")  # the policy: always wrong, never calls
    guide = grpo.guide_generator(args, encoder, pool)
    items = grpo.sample_questions(train_idx, 2, seed=0, step=0)
    batch = grpo.sample_groups(policy, guide, pool, encoder, items, args.group_size, args.guidance, 8)
    by_group = {}
    for t in batch.trajectories:
        by_group.setdefault(t.group, []).append(t)
    assert sorted(by_group) == [0, 1] and all(len(g) == 4 for g in by_group.values())
    for group in by_group.values():
        demos = [t for t in group if t.off_policy]
        own = [t for t in group if not t.off_policy]
        assert len(demos) == 1 and len(own) == 3
        assert len({t.record_id for t in group}) == 1  # the same question
        assert demos[0].correct and demos[0].tool_calls == ["ground"]  # the gold trajectory, its tool call
        assert not any(t.correct or t.tool_calls for t in own)
    adv = compute_advantages("grpo", AdvantageInput(batch.rewards, batch.group_index), grpo.get_algorithm("grpo").config)
    demo_adv = torch.tensor([a for a, t in zip(adv.tolist(), batch.trajectories) if t.off_policy])
    assert bool((demo_adv > 0).all())  # the group's only right answer: the demonstration is pushed up


def test_without_guidance_every_rollout_is_the_policys(setup):
    args, encoder, pool, train_idx = setup
    policy = ScriptedGenerator(encoder, lambda conv: "\\boxed{maybe}")
    items = grpo.sample_questions(train_idx, 2, seed=0, step=0)
    batch = grpo.sample_groups(policy, None, pool, encoder, items, 4, 0, 8)
    assert len(batch.trajectories) == 8 and not any(t.off_policy for t in batch.trajectories)


@pytest.mark.parametrize("k", [-1, 4, 5])
def test_guidance_must_leave_the_policy_a_sample(setup, k):
    args, encoder, pool, _ = setup
    with pytest.raises(ConfigError, match="guidance"):
        grpo.guide_generator(grpo.Args(**{**vars(args), "guidance": k}), encoder, pool)


@pytest.mark.slow
def test_a_guided_run_logs_the_policys_own_rollouts_and_the_demonstrations_apart(tmp_path):
    import json

    out = tmp_path / "run"
    grpo.main(grpo.Args(policy="tiny-qwen2-vl", answer_types="CLOSED", eval_size=2, max_new_tokens=4, eval_every=0,
                        prompts_per_step=2, group_size=3, guidance=1, tools="ground=oracle", demo_prompt=True,
                        steps=1, save_every=0, out=str(out), dataset_opt=[f"root={tmp_path / 'emb'}"]))
    row = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] == 1][0]
    assert row["rollout/guidance_accuracy"] == 1.0  # the gold demonstrations
    assert json.loads((out / "args.json").read_text())["args"]["guidance"] == 1
