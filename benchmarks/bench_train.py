"""One GRPO training step broken into phases: generation, tool calls, reward, optimiser.

    python benchmarks/bench_train.py [--quick] [--policy smollm2]

Side by side: the same step with the env copies in this process (``local`` pool) and in Ray
actors (``ray`` pool), where tool calls and rewards run beside generation. Prints a Markdown
section; ``--out`` also writes it to a file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from medvqa_env.datasets import load_dataset  # noqa: E402
from medvqa_env.parser import parse_action  # noqa: E402
from rewards import default_reward  # noqa: E402
from rewards.base import RewardInput  # noqa: E402
from train.algorithms import AdvantageInput, compute_advantages, get_algorithm  # noqa: E402
from train.common import SHORT_SYSTEM_PROMPT, build_policy, env_kwargs, select_indices  # noqa: E402
from train.env_pool import make_pool  # noqa: E402
from train.grpo import Args, update_policy  # noqa: E402
from train.rollout import HFGenerator, collect_rollouts, group_requests  # noqa: E402


def reward_seconds(batch, dataset) -> float:
    """Time the env's default reward on the batch's final answers (what the env computed inside step)."""
    samples = []
    for t in batch.trajectories:
        rec = dataset[dataset.index_of(t.record_id)]
        parsed = parse_action(t.turn_texts[-1] if t.turn_texts else "")
        samples.append(RewardInput(parsed.raw, parsed.answer, rec.answer, rec.answer_type, dict(rec.options),
                                   parsed.format_ok))
    fn = default_reward()
    t0 = time.perf_counter()
    fn(samples)
    return time.perf_counter() - t0


def run_configs(kinds, args: Args, model, encoder, reference, steps: int) -> dict[str, dict[str, float]]:
    """Alternate the pools step by step (so drifting load on a shared machine hits both alike)."""
    kw = env_kwargs(args.dataset, args.split, args.tools, args.max_turns)
    n = args.prompts_per_step * args.group_size
    pools = {k: make_pool(k, kw, n, **({"num_workers": 2} if k == "ray" else {})) for k in kinds}
    dataset = load_dataset(args.dataset, split=args.split)
    idx = select_indices(args.dataset, args.split, args.answer_types)
    algo = get_algorithm(args.algo)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    gen = HFGenerator(model, encoder, max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    keys = ("generation_s", "env_wait_s", "tool_s", "reward_s", "rollout_s", "update_s", "tokens")
    acc = {k: dict.fromkeys(keys, 0.0) for k in kinds}
    for step in range(steps + 1):  # step 0 warms up
        chosen = [idx[(step * args.prompts_per_step + k) % len(idx)] for k in range(args.prompts_per_step)]
        req, groups = group_requests([(step, i) for i in chosen], args.group_size)
        for kind in kinds:
            t0 = time.perf_counter()
            batch = collect_rollouts(gen, pools[kind], encoder, req, groups, micro_batch=max(1, n // 2))
            rollout = time.perf_counter() - t0
            adv = compute_advantages(algo.advantage, AdvantageInput(batch.rewards, batch.group_index), algo.config)
            t0 = time.perf_counter()
            update_policy(model, reference, encoder, opt, batch, adv, torch.ones(len(adv), dtype=torch.bool), algo, args)
            update = time.perf_counter() - t0
            if step == 0:
                continue
            a = acc[kind]
            a["generation_s"] += batch.timings["generation_s"]
            a["env_wait_s"] += batch.timings["env_wait_s"]
            a["tool_s"] += sum(t.tool_latency_s for t in batch.trajectories)
            a["reward_s"] += reward_seconds(batch, dataset)
            a["rollout_s"] += rollout
            a["update_s"] += update
            a["tokens"] += batch.timings["generated_tokens"]
    for p in pools.values():
        p.close()
    return {k: {m: v / steps for m, v in a.items()} for k, a in acc.items()}


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny VLM, 1 step per config")
    p.add_argument("--policy", default=None, help="default: tiny-qwen2-vl (quick) or smollm2")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--out", default=None)
    ns = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    torch.set_num_threads(1)
    policy = ns.policy or ("tiny-qwen2-vl" if ns.quick else "smollm2")
    steps = ns.steps or (1 if ns.quick else 3)
    args = Args(policy=policy, answer_types="CLOSED", prompts_per_step=4, group_size=4, max_new_tokens=32,
                micro_batch=16, tools="ground=oracle", kl_coef=0.01)
    model, encoder, kind, reference = build_policy(policy, SHORT_SYSTEM_PROMPT, 0, 0, 0, need_reference=True)
    rows = run_configs(("local", "ray"), args, model, encoder, reference, steps)
    cmd = "python benchmarks/bench_train.py" + (" --quick" if ns.quick else "") + (f" --policy {ns.policy}" if ns.policy else "")
    lines = ["## Training step: where the time goes", "", f"`{cmd}`", "",
             f"Policy `{policy}` ({kind}), {args.prompts_per_step} questions x {args.group_size} rollouts, "
             f"`{args.tools}` tool, up to {args.max_turns} tool turn, {args.max_new_tokens} new tokens per turn, "
             f"GRPO update with k3 KL; mean of {steps} step(s) after one warm-up, the two pools alternating "
             f"step by step; torch 1 thread. Tool calls and rewards run inside the env step (in the actors for "
             f"Ray), so they show up in 'waiting for envs' only when generation does not hide them.", "",
             "| phase (s per step) | local pool | Ray pool | Ray / local |", "|---|---:|---:|---:|"]
    names = [("generation", "generation_s"), ("tool calls (sum of latencies)", "tool_s"),
             ("reward (default reward on the batch)", "reward_s"), ("waiting for envs", "env_wait_s"),
             ("rollout total", "rollout_s"), ("optimiser (fwd+bwd+step)", "update_s")]
    for label, key in names:
        a, b = rows["local"][key], rows["ray"][key]
        lines.append(f"| {label} | {a:.3f} | {b:.3f} | {b / a if a else float('nan'):.2f} |")
    for kind_ in ("local", "ray"):
        r = rows[kind_]
        lines.append("")
        lines.append(f"- {kind_}: {r['tokens'] / max(1e-9, r['generation_s']):.1f} generated tokens/s; "
                     f"step total {r['rollout_s'] + r['update_s']:.2f} s")
    text = "\n".join(lines) + "\n"
    print(text)
    if ns.out:
        Path(ns.out).write_text(text)
    return text


if __name__ == "__main__":
    main()
