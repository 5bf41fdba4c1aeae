"""verl's own GRPO trainer, for real, on this CPU, with a *vision* policy (issues 14 and 20).

Two runs of ``python -m train.verl_integration.launch --device cpu`` -- verl's ``main_ppo`` with
``TaskRunnerV1``, an FSDP actor + reference on gloo, a vLLM-CPU rollout replica serving a tiny
Qwen2-VL (vision tower included), verl's weight sync, TransferQueue, our agent loop and env:

* **scripted**: OPEN questions of the embedded default, ARMed with its thresholds in one Ray actor,
  tools ``image_zoom_in`` + oracle ``ground``; each episode's first turn is a *prompted* tool turn
  (``medvqa.scripted_tool_call``: given text at response_mask 0, run by the env for real), so every
  episode carries two images -- the question's and the tool's crop -- into the sampled answer turn;
* **own calls**: CLOSED questions, rule reward, no prompted turn: the tool calls are the policy's
  own, sampled by vLLM, and counted.

The policy (``tiny_policy``: 2 layers, hidden 128, head_dim 64, a 1-block vision tower, vocab =
``len(tokenizer)``) is warm-started once by the project's own SFT (``train.sft``: gold trajectories
that call ``ground`` on lesion questions / zoom on named organs, then answer), the start both runs
share. ``MEDVQA_VISION_TRACE`` (:mod:`train.verl_integration.vision_trace`) records, in every
process, which pixels each vision tower read: the rollout's (vLLM) and the actor's (transformers).

Runs in ``.venv-verl`` (``bash scripts/setup_verl_cpu.sh``; the verl step of ``.ci/run``); in the
main venv, which has no vLLM by design, it is skipped with that pointer. ``MEDVQA_VERL_DEVICE=cuda``
runs the same two runs on one GPU (``scripts/verl_gpu_vision_check.sh``).
"""

from __future__ import annotations

import hashlib
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
    pytest.mark.timeout(3600),  # SFT + two verl runs: Ray, FSDP, vLLM start (minutes on 2 shared cores)
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="verl-on-CPU runs in .venv-verl: bash scripts/setup_verl_cpu.sh, then "
                              ".venv-verl/bin/python -m pytest tests/train/test_verl_trainer_cpu.py (.ci/run does)"),
]

REPO = Path(__file__).resolve().parents[2]
DEVICE = os.environ.get("MEDVQA_VERL_DEVICE", "cpu")
STEPS = 2
TOOLS = "image_zoom_in,ground=oracle"
SCRIPTED = {"batch": 2, "n": 4, "answer_types": "OPEN"}
OWN_CALLS = {"batch": 2, "n": 8, "answer_types": "CLOSED"}

# One GPU on a CUDA node: the CPU run's precision and attention choices (see config.CPU_OVERRIDES),
# without the CPU platform.
GPU_ARGS = [
    "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=false", "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    "actor_rollout_ref.ref.fsdp_config.dtype=float32", "actor_rollout_ref.rollout.dtype=float32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype: fp32, reduce_dtype: fp32, buffer_dtype: fp32}",
    "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype: fp32, reduce_dtype: fp32, buffer_dtype: fp32}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
]


def sft_argv(out: Path, policy: Path) -> list[str]:
    return [sys.executable, "-m", "train.sft", "--policy", str(policy), "--steps", "40", "--batch_size", "8",
            "--lr", "3e-3", "--answer_types", "CLOSED,OPEN", "--tools", TOOLS, "--tool_share", "1.0",
            "--eval_size", "2", "--eval_every", "0", "--max_new_tokens", "48",
            "--device", "cuda" if DEVICE == "cuda" else "cpu", "--out", str(out / "sft")]


def launch_argv(out: Path, policy: Path, batch: int, n: int, answer_types: str, temperature: float,
                extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "train.verl_integration.launch", "--device", DEVICE, "--prepare-data",
        # verl's RLHFDataset decodes parquet images with qwen_vl_utils (torchvision); the agent loop
        # takes each episode's images from the env, so the parquet carries the questions only
        "--answer-types", answer_types, "--image-mode", "none", "--limit", "8", "--output-dir", str(out),
        f"actor_rollout_ref.model.path={policy}",
        "medvqa.env.dataset=embedded", "medvqa.env.tools.image_zoom_in=local", "medvqa.env.tools.ground.engine=oracle",
        "medvqa.env.max_turns=1", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns=1",
        "medvqa.max_action_length=48", "medvqa.max_obs_length=64",
        "data.max_prompt_length=2048", "data.max_response_length=256", "actor_rollout_ref.rollout.max_model_len=2400",
        f"data.train_batch_size={batch}", f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.actor.optim.lr=1e-3", f"actor_rollout_ref.rollout.temperature={temperature}",
        f"trainer.total_training_steps={STEPS}", "trainer.total_epochs=100",
        "trainer.logger=[console,file]", "trainer.test_freq=-1",
        f"trainer.default_local_dir={out / 'checkpoints'}", f"trainer.rollout_data_dir={out / 'rollouts'}",
        f"medvqa.episode_log_dir={out / 'episodes'}",
        *(GPU_ARGS if DEVICE == "cuda" else []), *extra,
    ]


def run_env(out: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_AUTH_MODE": "disabled",
            "MEDVQA_CACHE": str(out.parent / "cache"), "MEDVQA_VISION_TRACE": str(out / "vision")}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """The tiny Qwen2-VL, warm-started by ``train.sft`` (the start both runs share)."""
    from train.verl_integration.tiny_policy import build

    out = tmp_path_factory.mktemp("verl_policy")
    build(out / "policy", kind="qwen2-vl")
    with open(out / "sft.log", "w") as log:
        rc = subprocess.run(sft_argv(out, out / "policy"), cwd=REPO, env=run_env(out), stdout=log,
                            stderr=subprocess.STDOUT, timeout=1500).returncode
    assert rc == 0, tail(out / "sft.log")
    return out / "sft" / "final"


def _launch(tmp_path_factory, policy, name, settings, temperature, extra):
    out = tmp_path_factory.mktemp(name)
    with open(out / "launch.log", "w") as log:
        rc = subprocess.run(launch_argv(out, policy, settings["batch"], settings["n"], settings["answer_types"],
                                        temperature, extra),
                            cwd=REPO, env=run_env(out), stdout=log, stderr=subprocess.STDOUT, timeout=1800).returncode
    return out, rc


@pytest.fixture(scope="module")
def scripted(tmp_path_factory, policy):
    return _launch(tmp_path_factory, policy, "verl_scripted", SCRIPTED, 1.0,
                   [f"trainer.save_freq={STEPS}", "medvqa.scripted_tool_call.name=image_zoom_in",
                    "medvqa.scripted_tool_call.arguments.bbox=[0,0,48,48]"])


@pytest.fixture(scope="module")
def own_calls(tmp_path_factory, policy):
    # the seed's sampling temperature (0.7): the warm start writes its tool call more often than at 1.0
    return _launch(tmp_path_factory, policy, "verl_own_calls", OWN_CALLS, 0.7, ["trainer.save_freq=-1"])


def metrics(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["data"] for r in rows}


def episodes(out: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((out / "episodes").glob("*.jsonl"))
            for line in p.read_text().splitlines() if line.strip()]


def vision_rows(out: Path) -> list[dict]:
    from train.verl_integration.vision_trace import read

    return read(out / "vision")


def tail(log: Path, n: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def finished(run) -> Path:
    out, rc = run
    assert rc == 0, tail(out / "launch.log")
    assert sorted(metrics(out)) == list(range(1, STEPS + 1))
    return out


# ---------------------------------------------------------------------------------------------
# Both runs: real steps, and the rollout's log-probs are the actor's, images included
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["scripted", "own_calls"])
def test_the_run_finishes_its_steps_with_real_updates(name, request):
    out = finished(request.getfixturevalue(name))
    m = metrics(out)
    for step in range(1, STEPS + 1):
        assert m[step]["actor/pg_loss"] == m[step]["actor/pg_loss"]  # not NaN
    assert m[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the actor starts as the reference
    if name == "scripted":  # ARMed's continuous rewards differ within a group: both steps update
        assert all(m[s]["actor/grad_norm"] > 0 for s in range(1, STEPS + 1)), m
        assert m[2]["actor/kl_loss"] > 1e-6  # after the first update the actor has moved away


@pytest.mark.parametrize("name", ["scripted", "own_calls"])
def test_rollout_log_probs_match_the_actor_with_images(name, request):
    """vLLM's sampling log-probs vs the FSDP actor's recomputation of the same tokens -- every one
    of them conditioned on the question's image (and in the scripted run on the tool's crop too).
    At step 2 they only agree if the step-1 update reached vLLM, vision tower included (verl's
    weight sync); a rollout whose vision tower read other pixels is off by far more than this
    tolerance (``test_the_policys_log_probs_depend_on_the_pixels``). What remains is verl banning
    the image-pad tokens in vLLM only (``get_vision_placeholder_token_ids``): the rollout
    renormalises over the rest of the vocabulary, the actor does not."""
    out = finished(request.getfixturevalue(name))
    m = metrics(out)
    for step in range(1, STEPS + 1):
        assert abs(m[step]["training/rollout_probs_diff_mean"]) < 1e-3, m[step]
        assert abs(m[step]["rollout_corr/log_ppl_diff"]) < 1e-3, m[step]


@pytest.mark.parametrize("name", ["scripted", "own_calls"])
def test_the_same_pixels_reach_both_vision_towers(name, request):
    """Every image the env handed the agent loop (its digest as verl's processor makes pixels of it)
    was read, bit for bit, by the rollout's vision tower (vLLM) and by the actor's (transformers, in
    verl's FSDP worker: the log-prob pass without autograd and the update with it) -- and nothing else."""
    out = finished(request.getfixturevalue(name))
    rows = vision_rows(out)
    env_images = {sha for e in episodes(out) for sha in e["image_sha1"]}
    rollout = {i["sha1"] for r in rows if r["side"] == "vllm" for i in r["images"]}
    actor = {i["sha1"] for r in rows if r["side"] == "hf" for i in r["images"]}
    assert env_images and env_images == rollout == actor
    assert {r["grad"] for r in rows if r["side"] == "hf"} == {False, True}
    assert {r["grad"] for r in rows if r["side"] == "vllm"} == {False}


@pytest.mark.parametrize("name", ["scripted", "own_calls"])
def test_image_tokens_in_every_trajectory(name, request):
    """Each trajectory the trainer got holds one image pad per merged patch of each of its images:
    the tokens both vision towers filled (their features count) -- nothing truncated away."""
    out = finished(request.getfixturevalue(name))
    grid = {i["sha1"]: i["grid"] for r in vision_rows(out) for i in r["images"]}
    for e in [e for e in episodes(out) if not e["validate"]]:
        expected = sum(t * h * w // 4 for t, h, w in (grid[s] for s in e["image_sha1"]))  # merge size 2
        assert e["num_image_tokens"] == expected > 0, e
        assert len(e["image_sha1"]) == e["num_images"] == 1 + sum(c["new_images"] for c in e["tool_calls"])


def test_the_weight_sync_moves_the_rollouts_vision_tower(scripted, policy):
    """The rollout's vision tower starts on the warm start's vision weights (synced from the actor
    into vLLM's dummy-initialised engine) and holds other weights after the first update."""
    import torch
    from safetensors.torch import load_file

    out = finished(scripted)
    checkpoint = sorted(hashlib.sha1(t.to(torch.float32).contiguous().numpy().tobytes()).hexdigest()
                        for k, t in load_file(str(policy / "model.safetensors")).items() if "visual" in k)
    versions = []
    for r in vision_rows(out):
        if r["side"] == "vllm" and r["weights"] not in versions:
            versions.append(r["weights"])
    assert checkpoint in versions and versions[-1] != checkpoint, [v[:2] for v in versions]


def test_the_policys_log_probs_depend_on_the_pixels(policy):
    """What makes the log-prob match above a statement about pixels: the warm-started policy's
    log-probs of an answer move by more than ten times that match's tolerance when the question's
    image is replaced (here: by zeros). (transformers on its own, the model both engines run.)"""
    import torch

    from agents.models import load_policy, model_inputs
    from medvqa_env.chat import Conversation
    from medvqa_env.env import MedVQAEnv

    model, encoder, kind = load_policy(policy)
    assert kind == "vlm"
    shifts = []
    for index in range(4):  # four training questions, their gold answers teacher-forced
        env = MedVQAEnv(dataset="embedded", split="train", max_turns=1, tools={"image_zoom_in": "local"})
        env.reset(options={"index": index})
        inputs = model_inputs(encoder, Conversation(messages=env.messages, images=env.images))
        answer = encoder.tokenizer(f"\\boxed{{{env.record.answer}}}<|im_end|>", add_special_tokens=False)["input_ids"]
        ids = torch.cat([inputs["input_ids"], torch.tensor([answer])], dim=1)
        extra = {"attention_mask": torch.ones_like(ids), "image_grid_thw": inputs["image_grid_thw"],
                 "mm_token_type_ids": (ids == encoder.image_pad_id()).int()}

        def answer_log_probs(pixel_values):
            with torch.no_grad():
                logits = model(input_ids=ids, pixel_values=pixel_values, **extra).logits[0, -len(answer) - 1:-1]
            return torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(answer)[:, None])[:, 0]

        real = answer_log_probs(inputs["pixel_values"])
        blank = answer_log_probs(torch.zeros_like(inputs["pixel_values"]))
        shifts.append((real - blank).abs().mean().item())
    assert sum(shifts) / len(shifts) > 10 * 1e-3, shifts


# ---------------------------------------------------------------------------------------------
# The scripted run: tools succeed, rewards and the ARMed state (today's evidence)
# ---------------------------------------------------------------------------------------------
def test_each_prompted_tool_call_succeeded_and_its_crop_was_seen(scripted):
    """Every episode's prompted ``image_zoom_in`` ran through the env and returned a successful
    observation with a new image -- which then reached both vision towers (previous test) -- and
    the sampled answers were scored, with different rewards within some group (something for
    GRPO's advantages to act on)."""
    out = finished(scripted)
    train = [e for e in episodes(out) if not e["validate"]]
    assert len(train) == STEPS * SCRIPTED["batch"] * SCRIPTED["n"]
    for e in train:
        assert e["answer_type"] == "OPEN" and e["tool_names"] == ["image_zoom_in"], e
        assert e["tool_calls"] == [{"name": "image_zoom_in", "ok": True, "error": None, "scripted": True,
                                    "new_images": 1}], e
        assert e["num_images"] == 2
    for step in range(1, STEPS + 1):
        assert any(e["answer"] is not None for e in train if e["global_steps"] == step)
    by_group = defaultdict(set)
    for e in train:
        by_group[(e["global_steps"], e["uid"])].add(round(e["env_reward"], 9))
    assert any(len(v) > 1 for v in by_group.values())


def test_rewards_reaching_verl_are_the_envs(scripted):
    """verl's rollout dump (``rm_scores`` summed: what advantages are computed from) against what
    the env computed for the same trajectory (uid, session)."""
    out = finished(scripted)
    env_reward = {(e["global_steps"], f"{e['uid']}_{e['session_id']}_0"): e["env_reward"]
                  for e in episodes(out) if not e["validate"]}
    seen = 0
    for step in range(1, STEPS + 1):
        for line in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines():
            row = json.loads(line)
            assert row["score"] == pytest.approx(env_reward[(step, row["uid"])], abs=1e-6), row
            seen += 1
    assert seen == len(env_reward)


def test_one_threshold_set_per_step_and_the_state_in_the_checkpoint(scripted):
    out = finished(scripted)
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


# ---------------------------------------------------------------------------------------------
# The run without prompted turns: the policy's own tool calls
# ---------------------------------------------------------------------------------------------
def test_the_policy_writes_its_own_tool_calls(own_calls):
    """No turn is prompted; the tool calls the env ran are the ones vLLM sampled from the warm
    start. Each is recorded with its outcome; at least one succeeded, and a tool image it returned
    was read by both vision towers (the pixel test above covers every episode image)."""
    out = finished(own_calls)
    train = [e for e in episodes(out) if not e["validate"]]
    assert len(train) == STEPS * OWN_CALLS["batch"] * OWN_CALLS["n"]
    calls = [c for e in train for c in e["tool_calls"]]
    assert calls and not any(c["scripted"] for c in calls)
    assert sum(e["num_tool_calls"] for e in train) == len(calls)
    assert any(c["ok"] for c in calls)
    assert all(c["ok"] == (c["error"] is None) for c in calls)
    with_image = [e for e in train if any(c["ok"] and c["new_images"] for c in e["tool_calls"])]
    assert with_image and all(e["num_images"] == 2 for e in with_image)


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
         "reward_components": {"bertscore": 0.0, "threshold_cosine": 0.5}, "tool_names": [], "tool_calls": []},
        {"record_id": "embedded_train_0030", "end_reason": "answer", "answer": "right lung", "correct": False,
         "reward_components": {"bertscore": 0.61, "cosine": 0.4, "threshold_cosine": 0.49},
         "tool_names": ["image_zoom_in", "segment"],
         "tool_calls": [{"name": "image_zoom_in", "ok": True, "error": None, "scripted": False, "new_images": 1},
                        {"name": "segment", "ok": False, "error": "bad bbox", "scripted": False, "new_images": 0}]},
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
