"""Headroom for RL on the CLOSED protocol task (issue 29), measured on the val split only.

On presence questions ("Is there a lesion in the X?") the trained ``ground`` tool's output supports
two readings: *any* (yes iff it found anything) and *host* (yes iff a box names the organ asked
about). Where they disagree, only reading the organ label is right. RL amplifies what a policy
already samples, so the question before any lever is pulled is: on those questions, how often does
a policy's *sampled* answer (temperature 0.7, as GRPO samples) follow the right reading?

For each policy of a protocol run folder (each build's val-chosen warm start, GRPO seed 0, tool SFT
seed 0) this asks the val split's first ``val_size`` CLOSED questions, finds the disagreement
questions from the tool's own outputs on val (the build the policy was trained with), and reports
greedy accuracy there, the mean accuracy of K sampled answers, and pass@K (some sample right).
Nothing here looks at the test split.

    python benchmarks/bench_headroom.py --run runs/protocol/closed --k 16
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
import re
import sys
import tempfile
from pathlib import Path

from figures import ROOT, command_line, record, results_dir_arg

PRESENCE = re.compile(r"Is there a lesion in the (.+)\?")
FOUND_LABEL = re.compile(r"\(([^(),]+), score [0-9.]+\)")


def disagreements(args, build: int, split: str = "val") -> list:
    """The presence questions of ``split`` (val: its first ``val_size``; train: all) on which the
    tool's two readings disagree (tool build ``build``)."""
    from medvqa_env.config import parse_options
    from medvqa_env.env import MedVQAEnv
    from train.common import env_kwargs, select_indices
    from train.protocol import trained_tools
    from train.sft import gold_tool_call

    options = parse_options(args.dataset_opt, "--dataset-opt")
    env = MedVQAEnv(**env_kwargs(args.dataset, split, args.tools, 1, options, reward="rule",
                                 tool_options=[f"{name}.seed={build}" for name in trained_tools(args)]))
    out = []
    try:
        for i in select_indices(args.dataset, split, args.answer_types, limit=args.val_size if split == "val" else None,
                                dataset_options=options):
            record = env.dataset[i]
            match = PRESENCE.match(record.question)
            call = gold_tool_call(record, env.toolbox.names)
            if not match or not call:
                continue
            env.reset(seed=0, options={"index": i})
            labels = FOUND_LABEL.findall(env.step(call)[0]["text"])
            any_, host = ("yes" if labels else "no"), ("yes" if f"{match.group(1)} lesion" in labels else "no")
            if any_ != host:
                out.append(record)
    finally:
        env.close()
    return out


def ask(policy: Path, records: list, args, build: int, k: int, temperature: float, folder: Path) -> list[dict]:
    """``eval.run`` of ``policy`` on ``records`` with ``k`` samples each (greedy when temperature is
    0), in the env it was trained in (its tools, this build's, from its ``medvqa_run.json``)."""
    from eval.run import main as eval_main

    data = folder / "records.jsonl"
    data.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    out = folder / f"eval_t{temperature}_k{k}"
    argv = ["--agent", "vlm", "--agent-opt", f"model={policy}", "--agent-opt", f"temperature={temperature}",
            "--dataset", str(data), "--split", "val", "--k", str(k), "--workers", "0", "--no-progress",
            "--bootstrap", "0", "--out", str(out)]
    if eval_main(argv) != 0:
        raise SystemExit(f"eval.run failed on {policy}")
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def measure(policy: Path, records: list, args, build: int, k: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        greedy = ask(policy, records, args, build, 1, 0.0, Path(tmp))
        sampled = ask(policy, records, args, build, k, 0.7, Path(tmp))
    by_q: dict[str, list[bool]] = {}
    for row in sampled:
        by_q.setdefault(row["record_id"], []).append(bool(row["correct"]))
    return {"questions": len(records), "greedy_accuracy": sum(bool(r["correct"]) for r in greedy) / len(greedy),
            "sampled_accuracy": sum(sum(v) for v in by_q.values()) / sum(len(v) for v in by_q.values()),
            f"pass_at_{k}": sum(any(v) for v in by_q.values()) / len(by_q),
            "sampled_tool_calls": sum(r["tool_stats"]["calls"] for r in sampled) / len(sampled)}


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a train.protocol folder with its checkpoints (runs/protocol/closed)")
    ap.add_argument("--k", type=int, default=16, help="samples per question")
    ap.add_argument("--quick", action="store_true", help="print only, keep nothing")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    a = ap.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from train.protocol import build_of, builds_of, recorded_args, warm_checkpoint, warm_names

    run = Path(a.run)
    saved = json.loads((run / "protocol_args.json").read_text())
    args = recorded_args({**saved, "baselines": "more_sft,tool_sft,notool_sft,question_prior,constant"}, run)
    fig: dict = {"k": a.k}
    lines = [f"## RL headroom on the CLOSED task: the val split's disagreement questions (K = {a.k})", "",
             "On val presence questions where the tool's two readings disagree (only the organ label is right): "
             "greedy accuracy, mean accuracy of K answers sampled at temperature 0.7, pass@K.", "",
             f"| policy | tool build | questions | greedy accuracy | sampled accuracy | pass@{a.k} | sampled tool calls / ep |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    asked = {b: disagreements(args, b) for b in builds_of(args)}
    policies = [(f"warm_start_b{b}", b, Path(warm_checkpoint(run, json.loads(warm_names(run, b)[2].read_text()))))
                for b in builds_of(args)]
    policies += [(f"{name}_s0", build_of(args, 0), run / f"{name}_s0" / "final") for name in ("grpo", "tool_sft")]
    for name, build, policy in policies:
        if not policy.is_dir() or not asked[build]:
            continue
        m = measure(policy, asked[build], args, build, a.k)
        fig.update({f"{name}.{key}": value for key, value in m.items()})
        lines.append(f"| {name} | {build} | {m['questions']} | {m['greedy_accuracy']:.3f} | {m['sampled_accuracy']:.3f} | "
                     f"{m[f'pass_at_{a.k}']:.3f} | {m['sampled_tool_calls']:.2f} |")
    fig["table"] = "\n".join(lines[4:])
    record("headroom", "\n".join(lines) + "\n", fig, command_line("bench_headroom.py", argv),
           results_dir_arg(a.quick, a.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
