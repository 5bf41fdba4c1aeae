"""PPO (Stable-Baselines3) on MedVQAEnv through :class:`agents.sb3_wrapper.DiscreteMedVQA`.

Classic RL as a sanity baseline: a small CNN + MLP policy picks zoom cells and answers from a
fixed vocabulary; it reads the image and a hashed bag of the question's words. It trains on the
train split and reports accuracy on held-out questions before and after training.

    python -m train.ppo_sb3                      # embedded default dataset, ~3 CPU minutes
    python -m train.ppo_sb3 --dataset vqa_rad --dataset-opt root=../shared/data/vqa_rad

Reads top to bottom: config -> env factory -> evaluation -> train.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


# ----------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------
@dataclass
class Args:
    """PPO (Stable-Baselines3) on MedVQAEnv: a non-LLM baseline on the same env and reward."""

    dataset: str = "embedded"
    """dataset name for medvqa_env.datasets.load_dataset ("embedded" is MedVQAEnv()'s default)"""
    dataset_opt: list[str] = field(default_factory=list)
    """loader option ``key=value`` (repeatable), e.g. ``root=../shared/data/vqa_rad``"""
    split: str = field(default="train", metadata={"cli": {"alias": ["--train-split"]}})
    """split PPO trains on (and the answer vocabulary is learned from); ``--train-split`` is the old name"""
    eval_split: str = "test"
    """held-out split for the before/after accuracy"""
    eval_episodes: int = 200
    """held-out questions evaluated (the first n of the split; 0 = all)"""
    total_timesteps: int = 65_536
    """env steps of PPO training (one step = one tool call or answer)"""
    n_envs: int = 4
    """parallel envs (DummyVecEnv: same process)"""
    n_steps: int = 256
    """rollout length per env per PPO update"""
    batch_size: int = 256
    """PPO minibatch size"""
    n_epochs: int = 4
    """PPO epochs per update"""
    lr: float = field(default=1e-3, metadata={"cli": {"alias": ["--learning-rate"]}})
    """Adam learning rate (``--learning-rate`` is the old name)"""
    ent_coef: float = 0.01
    """entropy bonus"""
    gamma: float = 0.99
    """discount (episodes are 1-4 steps long)"""
    reward: str = "rule"
    """the env's reward, any registry spec: ``rule`` (±1 by answer type, fast), ``default`` (ARMed for OPEN), ``armed:...``"""
    max_turns: int = 2
    """tool turns allowed per episode"""
    image_size: int = 64
    """side of the grey image observation"""
    n_open_answers: int = 32
    """open answers in the action vocabulary (most common in the train split)"""
    seed: int = 0
    """seed for PPO and the envs"""
    device: str = "cpu"
    """torch device for the policy: ``cpu`` (fastest for this tiny CNN), ``auto``, ``cuda``"""
    torch_threads: int = 1
    """torch CPU threads (1 is fastest for this tiny policy on a shared machine)"""
    out: str | None = None
    """write the figures as JSON here"""


# ----------------------------------------------------------------------------------------------
# Env factory
# ----------------------------------------------------------------------------------------------
def load_split(args: Args, split: str):
    from medvqa_env.datasets import load_dataset

    from medvqa_env.config import parse_options

    return load_dataset(args.dataset, split=split, **parse_options(args.dataset_opt, "--dataset-opt"))


def make_env(args: Args, dataset, answers: list[str], services=None):
    """One copy; copies given one ``services`` share its reward (one ARMed state) and toolbox."""
    from agents.sb3_wrapper import DiscreteMedVQA
    from medvqa_env.env import MedVQAEnv

    from rewards import build_reward

    shared = {"services": services} if services is not None else {"reward": build_reward(args.reward)}
    env = MedVQAEnv(dataset=dataset, max_turns=args.max_turns, **shared)
    return DiscreteMedVQA(env, answers=answers, image_size=args.image_size)


# ----------------------------------------------------------------------------------------------
# Evaluation: greedy policy on held-out questions, one episode each
# ----------------------------------------------------------------------------------------------
def evaluate(policy, env, n: int) -> dict[str, float]:
    """``policy(obs) -> action``; returns accuracy, mean reward, tool calls per episode, n."""
    total = len(env.unwrapped.dataset) if n <= 0 else min(n, len(env.unwrapped.dataset))
    correct, rewards, tool_steps = [], [], 0
    by_type: dict[str, list[bool]] = {}
    for i in range(total):
        obs, _ = env.reset(options={"index": i})
        done = False
        while not done:
            obs, reward, terminated, truncated, info = env.step(policy(obs))
            done = terminated or truncated
            tool_steps += int(not done)
        correct.append(bool(info.get("correct")))
        by_type.setdefault(str(info.get("answer_type")), []).append(correct[-1])
        rewards.append(reward)
    return {"accuracy": float(np.mean(correct)), "mean_reward": float(np.mean(rewards)),
            "tool_calls_per_episode": tool_steps / total, "n": total,
            "accuracy_by_type": {k: float(np.mean(v)) for k, v in sorted(by_type.items())}}


def sb3_policy(model):
    return lambda obs: int(model.predict(obs, deterministic=True)[0])


# ----------------------------------------------------------------------------------------------
# Train
# ----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.baselines import AnswerPriorAgent
    from agents.devices import resolve_device
    from agents.sb3_wrapper import answer_vocabulary, end_batch_callback
    from medvqa_env.services import EnvServices

    torch.set_num_threads(args.torch_threads)
    train_set, eval_set = load_split(args, args.split), load_split(args, args.eval_split)
    answers = answer_vocabulary(train_set, args.n_open_answers)
    # the training copies share one reward (its ARMed state moves once per PPO rollout) and toolbox;
    # the held-out env keeps its own, frozen, so the before/after evaluations are comparable
    services = EnvServices.build(reward=args.reward)
    vec_env = DummyVecEnv([lambda: make_env(args, train_set, answers, services) for _ in range(args.n_envs)])
    vec_env.seed(args.seed)
    eval_env = make_env(args, eval_set, answers)

    model = PPO("MultiInputPolicy", vec_env, n_steps=args.n_steps, batch_size=args.batch_size,
                n_epochs=args.n_epochs, learning_rate=args.lr, ent_coef=args.ent_coef,
                gamma=args.gamma, seed=args.seed, verbose=0, device=resolve_device(args.device))
    before = evaluate(sb3_policy(model), eval_env, args.eval_episodes)

    start = time.perf_counter()
    model.learn(total_timesteps=args.total_timesteps, callback=end_batch_callback(services))
    train_s = time.perf_counter() - start
    after = evaluate(sb3_policy(model), eval_env, args.eval_episodes)

    # The answer prior on the same held-out questions, for scale (a blind, dataset-bias baseline).
    prior = AnswerPriorAgent().fit(train_set)
    prior_acc = _prior_accuracy(prior, eval_set, before["n"], args)

    result = {"args": asdict(args), "train_questions": len(train_set), "eval_questions": before["n"],
              "actions": int(vec_env.action_space.n), "before": before, "after": after,
              "answer_prior_accuracy": prior_acc, "train_seconds": round(train_s, 1)}
    print(report(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        model.save(policy_path(args.out))
    print(end_lines(result, args, sys.argv[1:] if argv is None else argv))
    vec_env.close()
    services.close()
    eval_env.close()
    return result


def policy_path(out: str) -> str:
    """Where the trained PPO policy is saved beside the ``--out`` figures (SB3's ``.zip``)."""
    import os

    return os.path.splitext(out)[0] + ".policy.zip"


def end_lines(result: dict[str, Any], args: Args, argv: list[str]) -> str:
    """What the run ends with: the final held-out figure, where the policy and figures are, and
    the command that reproduces them. The PPO policy acts through the discrete wrapper, not as an
    ``eval.run`` agent, so its held-out figure is this script's own evaluation (seeded: the same
    command gives the same figure)."""
    import shlex

    a = result["after"]
    saved = (f"policy: {policy_path(args.out)} (stable-baselines3 PPO.load); figures: {args.out}" if args.out
             else "policy: not saved (pass --out FILE.json to keep the figures and the policy)")
    return "\n".join([f"== train.ppo_sb3 done: {args.total_timesteps} steps ==",
                      f"held-out ({args.eval_split} split, {result['eval_questions']} questions): accuracy "
                      f"{a['accuracy']:.3f}, mean reward {a['mean_reward']:+.3f} (answer prior "
                      f"{result['answer_prior_accuracy']:.3f})", saved,
                      "reproduce the held-out figure: python -m train.ppo_sb3 " + " ".join(shlex.quote(x) for x in argv)])


def _prior_accuracy(prior, dataset, n: int, args: Args) -> float:
    from agents.baselines import normalize_answer
    from medvqa_env.records import AnswerType

    hits = []
    for record in list(dataset)[:n]:
        guess = prior.predict(record.answer_type.value, record.question, record.options)
        truth = record.answer.strip().upper() if record.answer_type is AnswerType.MCQ else normalize_answer(record.answer)
        hits.append(guess == truth)
    return float(np.mean(hits))


def report(result: dict[str, Any]) -> str:
    b, a = result["before"], result["after"]
    lines = [
        "| policy | held-out accuracy | by answer type | mean reward | tool calls / episode |",
        "|---|---|---|---|---|",
        f"| PPO, before training (random init) | {b['accuracy']:.3f} | {_types(b)} | {b['mean_reward']:+.3f} | "
        f"{b['tool_calls_per_episode']:.2f} |",
        f"| PPO, after {result['args']['total_timesteps']} steps ({result['train_seconds']} s) | "
        f"{a['accuracy']:.3f} | {_types(a)} | {a['mean_reward']:+.3f} | {a['tool_calls_per_episode']:.2f} |",
        f"| answer prior (no image, for scale) | {result['answer_prior_accuracy']:.3f} | | | 0 |",
    ]
    head = (f"dataset {result['args']['dataset']}: {result['train_questions']} train questions, "
            f"{result['eval_questions']} held-out, {result['actions']} actions")
    return head + "\n\n" + "\n".join(lines)


def _types(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in figures["accuracy_by_type"].items())


def parse_args(argv: list[str] | None) -> Args:
    from medvqa_env.cli import parse_dataclass

    return parse_dataclass(Args, argv, prog="python -m train.ppo_sb3")


if __name__ == "__main__":
    from medvqa_env.cli import run_cli

    sys.exit(run_cli("python -m train.ppo_sb3", main))
