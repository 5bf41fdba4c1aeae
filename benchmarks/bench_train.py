"""One GRPO training step, phase by phase: the step as it was against the step as it is now.

    python benchmarks/bench_train.py [--quick] [--policy smollm2] [--steps 2] [--threads 2]

The policy's first turn is a **scripted tool call** (teacher-forced: ``ground`` with the oracle
engine, the same text for every rollout; the model does not choose it), so every episode makes a
real tool call in the env and the model samples its answer after the tool's observation. Both
configurations run the same trainer code (``train.rollout.collect_rollouts``,
``train.grpo.update_policy``) on the same questions, alternating step by step:

* **baseline** -- the step before issue 13: 1 torch thread, generation in two micro-batches of
  half the rollouts, the behaviour log-probs from a separate forward pass, every rollout running
  its own copy of the prompt (``share_prompts=False, reuse_onpolicy_logp=False``);
* **now** -- ``--threads`` torch threads (both cores), generation in one batch, the behaviour
  log-probs taken from the training forward (one epoch: the same numbers), each GRPO group's prompt
  run once for the policy and the reference (:func:`train.batching.response_logprobs`) and
  prefilled once for generation (``HFGenerator(share_prompts=True)``), logits only at the trained
  tokens (not at the tool's observation or padding; the baseline computes them at every response
  position, ``all_logits=True``), AdamW fused (:func:`train.common.make_optimizer`; the baseline
  runs torch's default, unfused AdamW).

"now" runs with the env copies in this process (``local``: a thread pool) and in Ray actors.
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)
from medvqa_env.datasets import load_dataset  # noqa: E402
from medvqa_env.parser import parse_action  # noqa: E402
from medvqa_env.pool import EnvPool  # noqa: E402
from rewards import default_reward  # noqa: E402
from rewards.base import RewardInput  # noqa: E402
from train.algorithms import AdvantageInput, compute_advantages, get_algorithm  # noqa: E402
from train.common import SHORT_SYSTEM_PROMPT, build_policy, env_kwargs, make_optimizer, select_indices  # noqa: E402
from train.grpo import Args, update_policy  # noqa: E402
from train.rollout import HFGenerator, collect_rollouts, group_requests  # noqa: E402

TOOL_TURN = '<tool_call>{"name": "ground", "arguments": {"text": "lesion"}}</tool_call>'
CONFIGS = {  # name -> (pool backend, torch threads (None: --threads), generation micro-batches, fast update)
    "baseline": ("thread", 1, 2, False),
    "now": ("thread", None, 1, True),
    "now_ray": ("ray", None, 1, True),
}


class ScriptedToolTurn:
    """A generator whose first turn is ``TOOL_TURN``, teacher-forced (no sampling); later turns
    come from ``inner`` (the policy)."""

    def __init__(self, inner: HFGenerator) -> None:
        self.inner = inner
        enc = inner.encoder
        self.forced = enc.tokenizer(TOOL_TURN, add_special_tokens=False)["input_ids"] + [enc.eos_token_id]

    def generate(self, contexts, convs):
        out: list = [None] * len(contexts)
        sampled = [i for i, c in enumerate(convs) if c.turns > 0]
        for i, c in enumerate(convs):
            if c.turns == 0:
                out[i] = list(self.forced)
        if sampled:
            for i, ids in zip(sampled, self.inner.generate([contexts[i] for i in sampled], [convs[i] for i in sampled])):
                out[i] = ids
        return out


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


def run_configs(names, args: Args, model, encoder, reference, steps: int, threads: int) -> dict[str, dict[str, float]]:
    """Alternate the configurations step by step (drifting load on a shared machine hits all alike)."""
    kw = env_kwargs(args.dataset, args.split, args.tools, args.max_turns)
    n = args.prompts_per_step * args.group_size
    pools = {c: EnvPool(kw, n, backend=CONFIGS[c][0], workers=1 if CONFIGS[c][0] == "thread" else 2,
                        group_size=args.group_size) for c in names}
    dataset = load_dataset(args.dataset, split=args.split)
    idx = select_indices(args.dataset, args.split, args.answer_types)
    algo = get_algorithm(args.algo)
    opts = {c: make_optimizer(model, 1e-6) if CONFIGS[c][3] else  # fused AdamW where torch has the kernel
            torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6) for c in names}
    gen = ScriptedToolTurn(HFGenerator(model, encoder, max_new_tokens=args.max_new_tokens,
                                       temperature=args.temperature))
    keys = ("generation_s", "env_wait_s", "tool_s", "tool_calls", "reward_s", "rollout_s", "update_s", "tokens",
            "step_s")
    acc = {c: dict.fromkeys(keys, 0.0) for c in names}
    before = torch.get_num_threads()
    try:
        for step in range(steps + 1):  # step 0 warms up
            chosen = [idx[(step * args.prompts_per_step + k) % len(idx)] for k in range(args.prompts_per_step)]
            req, groups = group_requests([(step, i) for i in chosen], args.group_size)
            for c in (names if step % 2 == 0 else names[::-1]):
                _, n_threads, gen_batches, fast = CONFIGS[c]
                torch.set_num_threads(n_threads or threads)
                gen.inner.share_prompts = fast  # a group's prompt prefilled once for generation too
                t0 = time.perf_counter()
                batch = collect_rollouts(gen, pools[c], encoder, req, groups, micro_batch=-(-n // gen_batches))
                rollout = time.perf_counter() - t0
                adv = compute_advantages(algo.advantage, AdvantageInput(batch.rewards, batch.group_index), algo.config)
                t1 = time.perf_counter()
                update_policy(model, reference, encoder, opts[c], batch, adv, None, algo, args,
                              share_prompts=fast, reuse_onpolicy_logp=fast, all_logits=not fast)
                update = time.perf_counter() - t1
                if step == 0:
                    continue
                a = acc[c]
                a["generation_s"] += batch.timings["generation_s"]
                a["env_wait_s"] += batch.timings["env_wait_s"]
                a["tool_s"] += sum(t.tool_latency_s for t in batch.trajectories)
                a["tool_calls"] += sum(len(t.tool_calls) for t in batch.trajectories)
                a["reward_s"] += reward_seconds(batch, dataset)
                a["rollout_s"] += rollout
                a["update_s"] += update
                a["step_s"] += rollout + update
                a["tokens"] += batch.timings["generated_tokens"]
    finally:
        torch.set_num_threads(before)
        for p in pools.values():
            p.close()
    return {c: {m: v / steps for m, v in a.items()} for c, a in acc.items()}


def main(argv=None) -> str:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny VLM, 1 step per config")
    p.add_argument("--policy", default=None, help="default: tiny-qwen2-vl (quick) or smollm2")
    p.add_argument("--steps", type=int, default=None, help="timed steps per configuration after one warm-up (default 2)")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="torch threads of 'now'")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"which of {list(CONFIGS)}")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                   "none with --quick)")
    ns = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    torch.set_num_threads(1)
    policy = ns.policy or ("tiny-qwen2-vl" if ns.quick else "smollm2")
    steps = ns.steps or (1 if ns.quick else 2)
    names = [c.strip() for c in ns.configs.split(",") if c.strip()]
    args = Args(policy=policy, answer_types="CLOSED", prompts_per_step=4, group_size=4, max_new_tokens=32,
                micro_batch=16, tools="ground=oracle", max_turns=1, kl_coef=0.01, temperature=1.0)
    model, encoder, kind, reference = build_policy(policy, SHORT_SYSTEM_PROMPT, 0, 0, 0, need_reference=True)
    rows = run_configs(names, args, model, encoder, reference, steps, ns.threads)
    cmd = command_line("bench_train.py", argv)
    labels = {"baseline": "baseline (local)", "now": "now (local)", "now_ray": "now (Ray)"}
    lines = ["## Training step: where the time goes, before and after", "", f"`{cmd}`", "",
             f"Policy `{policy}` ({kind}), {args.prompts_per_step} questions x {args.group_size} rollouts, first turn a "
             f"scripted (teacher-forced) `ground` call to the oracle engine, then the policy samples up to "
             f"{args.max_new_tokens} tokens; GRPO update with k3 KL against a frozen reference, micro-batch "
             f"{args.micro_batch}; mean of {steps} step(s) after one warm-up, configurations alternating step by step. "
             f"*baseline*: 1 torch thread, generation in 2 micro-batches (each rollout prefilling its own prompt), behaviour log-probs by a separate forward, "
             f"every rollout runs its own prompt, logits at every response position, torch's default AdamW. *now*: {ns.threads} torch thread(s), one generation batch (each group's prompt prefilled once), behaviour "
             f"log-probs from the training forward, each group's prompt run once, logits only at the trained tokens (not at the tool's "
             f"observation or padding), fused AdamW. Tool calls and rewards run inside the env step (in the actors for Ray).", "",
             "| phase (s per step) | " + " | ".join(labels[c] for c in names) + " |",
             "|---|" + "---:|" * len(names)]
    phases = [("generation", "generation_s"), ("tool calls made", "tool_calls"), ("tool calls (sum of latencies)", "tool_s"),
              ("reward (default reward on the batch)", "reward_s"), ("waiting for envs", "env_wait_s"),
              ("rollout total", "rollout_s"), ("optimiser (log-probs, fwd+bwd, step)", "update_s"),
              ("**step total**", "step_s")]
    for label, key in phases:
        fmt = "{:.0f}" if key == "tool_calls" else "{:.3f}"
        lines.append(f"| {label} | " + " | ".join(fmt.format(rows[c][key]) for c in names) + " |")
    figures: dict[str, float] = {"steps": steps, "threads": ns.threads}
    for c in names:
        r = rows[c]
        figures.update({f"{c}.{k}": v for k, v in r.items()})
        figures[f"{c}.tokens_per_s"] = r["tokens"] / max(1e-9, r["generation_s"])
    lines.append("")
    if "baseline" in rows:
        base = rows["baseline"]["step_s"]
        for c in names:
            if c != "baseline":
                figures[f"{c}.speedup"] = base / max(1e-9, rows[c]["step_s"])
        if "now" in rows:
            figures["step_speedup"] = figures["now.speedup"]
            lines.append(f"Step speed-up, now (local) against baseline (local), same run: **{figures['step_speedup']:.2f}×** "
                         f"(optimiser {rows['baseline']['update_s'] / max(1e-9, rows['now']['update_s']):.2f}×, "
                         f"generation {rows['baseline']['generation_s'] / max(1e-9, rows['now']['generation_s']):.2f}×).")
    lines += ["", "Generated tokens/s: " + ", ".join(f"{labels[c]} {figures[f'{c}.tokens_per_s']:.1f}" for c in names)
              + f". Load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."]
    text = "\n".join(lines) + "\n"
    record("train", text, figures, cmd, results_dir_arg(ns.quick, ns.results))
    return text


if __name__ == "__main__":
    main()
