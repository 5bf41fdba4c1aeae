"""verl's own GRPO trainer, for real, on this CPU, against MedVQA-Gym (issue 14).

One run of ``python -m train.verl_integration.launch --device cpu`` (what ``scripts/train_verl_cpu.sh``
runs): verl's ``main_ppo`` with ``TaskRunnerV1``, an FSDP actor + reference on gloo, a vLLM-CPU
rollout replica, weight sync, TransferQueue, our agent loop and env (OPEN questions of the embedded
default, tools ``image_zoom_in`` + classical ``segment``, ARMed with its thresholds in one Ray actor),
a tiny random Qwen2 policy (head_dim 64, vocab = len(tokenizer)), 2 GRPO steps, a checkpoint.

A random policy never writes a ``\boxed{}`` answer (every reward would be the same "no answer"
score, and GRPO's advantages zero), so the policy is first warm-started by the project's own SFT
(``train.sft``: 40 steps on gold trajectories -- an ``image_zoom_in`` call, the env's real
observation, the boxed answer). Sampled at temperature 1, that tiny policy still answers at once
and never calls a tool, so each episode's first turn is a *prompted* tool turn
(``medvqa.scripted_tool_call``: given text at response_mask 0, run by the env for real); the
answer turn is sampled by vLLM.

Runs in ``.venv-verl`` (``bash scripts/setup_verl_cpu.sh``; the verl step of ``.ci/run``). In the main
venv, which has no vLLM by design, it is skipped with that pointer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # one verl run: Ray, FSDP, vLLM start (minutes on 2 shared cores), 2 steps
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="verl-on-CPU runs in .venv-verl: bash scripts/setup_verl_cpu.sh, then "
                              ".venv-verl/bin/python -m pytest tests/train/test_verl_trainer_cpu.py (.ci/run does)"),
]

REPO = Path(__file__).resolve().parents[2]
STEPS = 2
N = 4  # rollouts per question
BATCH = 2  # questions per step


def sft_argv(out: Path, policy: Path) -> list[str]:
    return [sys.executable, "-m", "train.sft", "--policy", str(policy), "--steps", "40", "--batch_size", "8",
            "--lr", "3e-3", "--answer_types", "OPEN", "--tools", "image_zoom_in,segment=classical",
            "--tool_share", "1.0", "--eval_size", "8", "--eval_every", "0", "--max_new_tokens", "48",
            "--out", str(out / "sft")]


def launch_argv(out: Path, policy: Path) -> list[str]:
    return [
        sys.executable, "-m", "train.verl_integration.launch", "--device", "cpu", "--prepare-data",
        "--answer-types", "OPEN", "--image-mode", "none", "--limit", "8", "--output-dir", str(out),
        f"actor_rollout_ref.model.path={policy}",
        "medvqa.env.dataset=embedded", "medvqa.env.tools.image_zoom_in=local",
        "medvqa.env.tools.segment.engine=classical",
        "medvqa.env.max_turns=1", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns=1",
        "medvqa.max_action_length=48", "medvqa.max_obs_length=64",
        "data.max_prompt_length=2048", "data.max_response_length=192", "actor_rollout_ref.rollout.max_model_len=2400",
        f"data.train_batch_size={BATCH}", f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.rollout.temperature=1.0",
        f"trainer.total_training_steps={STEPS}", "trainer.total_epochs=100",
        "trainer.logger=[console,file]", f"trainer.save_freq={STEPS}", "trainer.test_freq=-1",
        f"trainer.default_local_dir={out / 'checkpoints'}", f"trainer.rollout_data_dir={out / 'rollouts'}",
        f"medvqa.episode_log_dir={out / 'episodes'}",
        "medvqa.scripted_tool_call.name=image_zoom_in", "medvqa.scripted_tool_call.arguments.bbox=[0,0,48,48]",
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from train.verl_integration.tiny_policy import build

    out = tmp_path_factory.mktemp("verl_cpu")
    policy = build(out / "policy", kind="qwen2")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_AUTH_MODE": "disabled",
           "MEDVQA_CACHE": str(out / "cache")}
    with open(out / "launch.log", "w") as log:
        sft = subprocess.run(sft_argv(out, policy), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                             timeout=900)
        if sft.returncode != 0:
            return out, sft.returncode
        proc = subprocess.run(launch_argv(out, out / "sft" / "final"), cwd=REPO, env=env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=1800)
    return out, proc.returncode


def metrics(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["data"] for r in rows}


def episodes(out: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((out / "episodes").glob("*.jsonl"))
            for line in p.read_text().splitlines() if line.strip()]


def tail(out: Path, n: int = 60) -> str:
    return "\n".join((out / "launch.log").read_text(errors="replace").splitlines()[-n:])


def test_the_run_finishes_its_steps(run):
    out, rc = run
    assert rc == 0, tail(out)
    assert sorted(metrics(out)) == list(range(1, STEPS + 1))


def test_each_step_is_a_real_update(run):
    out, _ = run
    m = metrics(out)
    for step in range(1, STEPS + 1):
        assert m[step]["actor/grad_norm"] > 0, m[step]
        assert m[step]["actor/pg_loss"] == m[step]["actor/pg_loss"]  # not NaN
    assert m[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the actor starts as the reference
    assert m[2]["actor/kl_loss"] > 1e-6  # after the first update it has moved away


def test_rollout_log_probs_match_the_actor_after_weight_sync(run):
    """vLLM's sampling log-probs vs the FSDP actor's recomputation on the same tokens: at step 2
    they only agree if the step-1 update reached vLLM (verl's weight sync)."""
    out, _ = run
    m = metrics(out)
    for step in range(1, STEPS + 1):
        assert abs(m[step]["training/rollout_probs_diff_mean"]) < 1e-3, m[step]
        assert abs(m[step]["rollout_corr/log_ppl_diff"]) < 1e-3, m[step]


def test_tools_ran_and_the_policy_answered(run):
    """Every episode's tool call ran through the env's tools, the sampled answers were scored by
    ARMed -- with different rewards within a group (something for GRPO's advantages to act on)."""
    out, _ = run
    train = [e for e in episodes(out) if not e["validate"]]
    assert len(train) == STEPS * BATCH * N
    for e in train:
        assert e["answer_type"] == "OPEN" and e["num_tool_calls"] == 1 and e["tool_names"] == ["image_zoom_in"], e
    for step in range(1, STEPS + 1):
        assert any(e["answer"] is not None for e in train if e["global_steps"] == step)
    by_group = defaultdict(set)
    for e in train:
        by_group[(e["global_steps"], e["uid"])].add(round(e["env_reward"], 9))
    assert any(len(v) > 1 for v in by_group.values())


def test_rewards_reaching_verl_are_the_envs(run):
    """verl's rollout dump (``rm_scores`` summed: what advantages are computed from) against what
    the env computed for the same trajectory (uid, session)."""
    out, _ = run
    env_reward = {(e["global_steps"], f"{e['uid']}_{e['session_id']}_0"): e["env_reward"]
                  for e in episodes(out) if not e["validate"]}
    seen = 0
    for step in range(1, STEPS + 1):
        for line in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines():
            row = json.loads(line)
            assert row["score"] == pytest.approx(env_reward[(step, row["uid"])], abs=1e-6), row
            seen += 1
    assert seen == len(env_reward)


def test_one_threshold_set_per_step_and_the_state_in_the_checkpoint(run):
    out, _ = run
    per_step = defaultdict(set)
    for e in episodes(out):
        c = e["reward_components"]
        per_step[e["global_steps"]].add((c["threshold_bertscore"], c["threshold_cosine"]))
    assert all(len(v) == 1 for v in per_step.values()), dict(per_step)
    state = json.loads((out / "checkpoints" / f"global_step_{STEPS}" / "medvqa_reward_state.json").read_text())
    thresholds = state["OPEN"]["thresholds"]
    assert thresholds["last_batch_id"] == STEPS - 1  # step 2 began by ending batch 1
    assert set(thresholds["thresholds"]) == {"bertscore", "cosine"}
    (last,) = per_step[STEPS]
    assert (thresholds["thresholds"]["bertscore"], thresholds["thresholds"]["cosine"]) == last


def test_our_extra_fields_survive_transferqueue():
    """What the TQ worker stores per episode (``as_dict`` -> tensordict -> TransferQueue) comes back
    intact: the nested ``medvqa`` summary (None in one episode, values in another) and
    ``turn_scores`` of different lengths."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from train.verl_integration.config import compose_config

    summaries = [
        {"record_id": "embedded_train_0002", "end_reason": "length", "answer": None, "correct": None,
         "reward_components": {"bertscore": 0.0, "threshold_cosine": 0.5}, "tool_names": []},
        {"record_id": "embedded_train_0030", "end_reason": "answer", "answer": "right lung", "correct": False,
         "reward_components": {"bertscore": 0.61, "cosine": 0.4, "threshold_cosine": 0.49},
         "tool_names": ["image_zoom_in", "segment"]},
    ]
    fields = []
    for i, summary in enumerate(summaries):
        o = AgentLoopOutput(prompt_ids=[1, 2, 3], response_ids=[4] * (i + 2), response_mask=[1] * (i + 2),
                            reward_score=-0.5 + i, num_turns=3, metrics=AgentLoopMetrics(),
                            extra_fields={"medvqa": summary, "turn_scores": [0.0] * (2 * i + 1),
                                          "reward_extra_info": {"score": -0.5 + i}, "min_global_steps": 1})
        fields.append(o.as_dict())
    cfg = compose_config(["actor_rollout_ref.model.path=/unused"], device="cpu").transfer_queue
    OmegaConf.set_struct(cfg, False)
    cfg.enable = True
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tq.init(cfg)
        keys = ["a_0_0", "b_0_0"]
        tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), tags=[{}, {}], partition_id="train")
        got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["extra_fields"])["extra_fields"]
        back = got.tolist() if hasattr(got, "tolist") else list(got)
        assert back == [f["extra_fields"] for f in fields]
        tq.close()
    finally:
        ray.shutdown()
