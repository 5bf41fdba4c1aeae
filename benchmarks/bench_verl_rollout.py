"""The verl agent loop's own cost per episode, beside the bare env doing the same episode.

Every episode is the same two turns on the embedded dataset: zoom into a quadrant, then answer.

* env only (baseline): ``MedVQAEnv.reset`` + ``step(zoom)`` + ``step(answer)``, no tokens;
* ``medvqa_agent``, sequential: the verl agent loop (verl's Continuous Token tokenization of
  prompt, turns and observations with a Qwen2-VL processor; env steps in a thread) generating
  through ``CPUStandInServerManager`` (tiny random Qwen2-VL on CPU, teacher-forcing the two turns);
* ``medvqa_agent``, concurrent: the same episodes under one ``asyncio.gather``.

The agent loop's own timers split each episode into generation (the stand-in's forward passes),
env steps (``tool_calls``) and the rest (env creation and reset, verl tokenization, bookkeeping).
The stand-in serves one request at a time, so "concurrent" shows that episodes interleave
correctly, not a speed-up.
Wall and CPU seconds are both given: the machine is shared. The stand-in's forward time says
nothing about vLLM on a GPU; the env and tokenization figures carry over.

    python benchmarks/bench_verl_rollout.py [--quick]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MEDVQA_CACHE", os.path.join(tempfile.gettempdir(), "medvqa-bench-cache"))

from figures import record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

ZOOM = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 128, 128]}}</tool_call>'
ANSWER = r"\boxed{no}"
SAMPLING = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "logprobs": True}


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def setup(n_records: int):
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from medvqa_env.datasets import load_dataset
    from train.verl_integration import agent_loop  # noqa: F401  (registers medvqa_agent)
    from train.verl_integration.config import AGENT_NAME, compose_config
    from train.verl_integration.cpu_stand_in import (
        CPUStandInServerManager,
        build_processor,
        build_tiny_qwen2vl,
        build_tokenizer,
    )
    from train.verl_integration.data import env_system_prompt

    dataset = load_dataset("embedded", split="train", n=n_records)
    tok = build_tokenizer([env_system_prompt({}, dataset), ZOOM])
    proc, model = build_processor(tok), build_tiny_qwen2vl(tok)
    cfg = compose_config(["data.max_response_length=1024", "medvqa.env.dataset=embedded",
                          f"+medvqa.env.dataset_options.n={n_records}", "medvqa.max_action_length=64"])

    def make_loop():
        server = CPUStandInServerManager(model, tok, proc, responses=[ZOOM, ANSWER])
        return hydra.utils.instantiate(
            config=_agent_loop_registry[AGENT_NAME], trainer_config=DictConfigWrap(config=cfg), server_manager=server,
            tokenizer=tok, processor=proc, hf_model_type="qwen2_vl", dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))

    return dataset, make_loop


def env_only(dataset, ids):
    from medvqa_env.env import MedVQAEnv
    from train.verl_integration.reward import shared_reward

    for rid in ids:
        env = MedVQAEnv(dataset=dataset, reward=shared_reward())
        env.reset(options={"record_id": rid})
        env.step(ZOOM)
        env.step(ANSWER)
        env.close()


def agent_episodes(make_loop, ids, concurrent: bool):
    async def go():
        loop = make_loop()
        calls = [loop.run(dict(SAMPLING), raw_prompt=[], extra_info={"record_id": rid}) for rid in ids]
        if concurrent:
            return await asyncio.gather(*calls)
        return [await c for c in calls]

    return asyncio.run(go())


def main(argv: list[str] | None = None) -> str:
    ap = ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="4 episodes instead of 16")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                    "none with --quick)")
    args = ap.parse_args(argv)
    n = 4 if args.quick else 16
    dataset, make_loop = setup(max(n, 8))
    ids = [dataset[i].id for i in range(n)]
    agent_episodes(make_loop, ids, concurrent=False)  # warm-up: lazy imports, ARMed's encoders
    env_only(dataset, ids)

    _, env_w, env_c = _timed(lambda: env_only(dataset, ids))
    seq, seq_w, seq_c = _timed(lambda: agent_episodes(make_loop, ids, concurrent=False))
    _, con_w, con_c = _timed(lambda: agent_episodes(make_loop, ids, concurrent=True))
    gen = sum(o.metrics.generate_sequences for o in seq)
    step = sum(o.metrics.tool_calls for o in seq)
    rest = seq_w - gen - step
    ok = sum(o.reward_score == 1.0 for o in seq)
    tokens = sum(len(o.response_ids) for o in seq) / n
    ms = lambda s: f"{1000 * s / n:.0f}"  # noqa: E731
    rows = [
        f"| env only: reset + zoom + answer (baseline) | {env_w:.2f} | {env_c:.2f} | {ms(env_w)} | 1.0 |",
        f"| `medvqa_agent`, sequential | {seq_w:.2f} | {seq_c:.2f} | {ms(seq_w)} | {seq_w / env_w:.1f} |",
        f"| &nbsp;&nbsp;of which stand-in generation (2 forwards) | {gen:.2f} | | {ms(gen)} | {gen / env_w:.1f} |",
        f"| &nbsp;&nbsp;of which env steps (in a thread) | {step:.2f} | | {ms(step)} | {step / env_w:.1f} |",
        f"| &nbsp;&nbsp;of which env creation + reset, tokenization, bookkeeping | {rest:.2f} | | {ms(rest)} | {rest / env_w:.1f} |",
        f"| `medvqa_agent`, {n} concurrent (`asyncio.gather`) | {con_w:.2f} | {con_c:.2f} | {ms(con_w)} | "
        f"{con_w / env_w:.1f} |",
    ]
    command = f"python benchmarks/bench_verl_rollout.py{' --quick' if args.quick else ''}"
    section = "\n".join([
        "## verl agent loop: cost per episode on CPU",
        "",
        f"`{command}` — {n} episodes "
        f"(zoom, then answer; {tokens:.0f} response tokens each, {ok}/{n} rewarded 1.0), embedded dataset, "
        "CPU stand-in for verl's rollout server (tiny random Qwen2-VL, teacher-forced turns).",
        "",
        "| what | wall s | CPU s | wall ms / episode | wall ratio to env only |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
    ])
    per_ep = {"env_only": env_w, "sequential": seq_w, "generation": gen, "env_steps": step, "bookkeeping": rest,
              "concurrent": con_w}
    figures = {f"{k}.ms_per_episode": 1000 * v / n for k, v in per_ep.items()}
    figures.update({f"{k}.ratio": v / env_w for k, v in per_ep.items()})
    figures.update(episodes=n, rewarded=ok, response_tokens=tokens)
    record("verl_rollout", section, figures, command, results_dir_arg(args.quick, args.results))
    return section


if __name__ == "__main__":
    main()
