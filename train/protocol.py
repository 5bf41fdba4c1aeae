"""``python -m train.protocol``: a learning claim that cannot fool us.

One command runs the whole comparison, resumably, and writes what a reader needs to check it:

1. **Warm start, chosen on val.** One SFT run on gold trajectories (``train.sft``), evaluated on
   the *val* split at every saved checkpoint; the checkpoint with the best val metric (accuracy for
   CLOSED/MCQ, ARMed Avg for OPEN; ties go to the later step) is the warm start. The test split is
   never looked at to choose anything.
2. **GRPO** (``train.grpo``) from that warm start, one run per seed (>= 5), held-out evaluation on
   the test split every few steps, images ablated (blank, shuffled) at the end.
3. **Baselines, same protocol, same seeds, same held-out questions**:
   ``more_sft`` (the warm start trained on with its own SFT recipe for as many steps as GRPO took),
   ``tool_sft`` (SFT from scratch, every gold trajectory calling the tool, warm-start + GRPO steps),
   ``notool_sft`` (SFT from scratch with no tools at all, the same steps), ``question_prior`` (the
   most common training answer for the question's text) and ``constant`` (the best single answer,
   chosen on the held-out questions themselves).
4. **Report** (``protocol.json``): per row and seed the final held-out metric, distinct answers and
   their entropy (a constant answer shows), greedy tool calls, the image-ablation drop and the run's
   CPU seconds; per row the mean, the *sample* SD and a 95% t-interval; for GRPO against each
   baseline the difference of means with a Welch 95% interval. Every held-out answer of every run
   is stored (``heldout_answers.jsonl``), and GRPO's tool calls are the policy's own, sampled.

Each run is a subprocess whose CPU seconds (its own and its children's) are recorded in
``runs.jsonl``; a finished run is skipped on a rerun, so a killed protocol resumes. ``--export DIR``
copies the small run files (args, metrics, answers, no weights) into ``DIR`` for committing::

    python -m train.protocol --out runs/protocol/closed --answer-types CLOSED --tools ground=trained \\
        --export docs/training_runs/protocol/closed
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from medvqa_env.cli import run_cli

STAGES = ("warm", "grpo", "baselines", "report")
TRAINED_BASELINES = ("more_sft", "tool_sft", "notool_sft")
ANSWER_BASELINES = ("question_prior", "constant")
NO_TOOL_PROMPT = "You answer questions about medical images. Give the final answer as \\boxed{answer}."
RUN_FILES = ("args.json", "metrics.jsonl", "heldout_answers.jsonl", "resumes.jsonl")


@dataclass
class Args:
    """The learning protocol: val-chosen warm start, GRPO over seeds, same-protocol baselines."""

    out: str = "runs/protocol"
    """working folder (checkpoints, run folders, runs.jsonl, protocol.json)"""
    stages: str = "warm,grpo,baselines,report"
    """which stages to run (comma list of warm, grpo, baselines, report); finished runs are skipped"""
    export: str = ""
    """copy the small run files (no weights) into this folder when the report is written"""
    seeds: str = "0,1,2,3,4"
    """GRPO and baseline seeds (at least 5 for a claim)"""
    policy: str = "tiny-qwen2-vl"
    """the policy to warm-start (see train.sft --policy)"""
    tools: str = "ground=trained"
    """the env's tools (no oracle in a claim)"""
    answer_types: str = "CLOSED"
    """question types trained and evaluated"""
    dataset: str = "embedded"
    """dataset"""
    dataset_opt: list[str] = field(default_factory=lambda: ["n=800"])
    """loader options for every split (embedded: n=800 gives 800-question val and test splits)"""
    reward: str | None = None
    """the env's reward (default: rule for CLOSED/MCQ, ARMed for OPEN)"""
    max_turns: int = 1
    """tool turns per episode, in every run"""
    max_new_tokens: int = 32
    """tokens per generated turn, in every run"""
    eval_size: int = 200
    """held-out test questions (the first of the test split's questions of these types)"""
    val_size: int = 200
    """val questions the warm start is chosen on"""
    sft_steps: int = 150
    """warm-start SFT steps (checkpoints every sft_save_every are the candidates); 150 was chosen on the
    val split for the CPU demo (docs/training.md: after 60 steps the policy's *sampled* answer after a
    tool call was at chance, so a tool call earned nothing for GRPO to reinforce)"""
    sft_save_every: int = 25
    """warm-start candidates: a checkpoint (and a val evaluation) every k SFT steps"""
    sft_batch_size: int = 16
    """gold trajectories per SFT step"""
    sft_lr: float = 3e-3
    """SFT learning rate"""
    tool_share: float = 0.5
    """share of the warm start's gold trajectories that call the tool (the rest answer directly)"""
    grpo_steps: int = 30
    """GRPO steps per seed"""
    prompts_per_step: int = 8
    """GRPO questions per step"""
    group_size: int = 8
    """GRPO rollouts per question"""
    grpo_lr: float = 5e-4
    """GRPO learning rate"""
    temperature: float = 0.7
    """GRPO sampling temperature"""
    micro_batch: int = 64
    """sequences per forward/backward"""
    eval_every: int = 5
    """held-out evaluation every k GRPO steps"""
    ablations: str = "blank,shuffle"
    """image ablations evaluated on every final policy"""
    baselines: str = "more_sft,tool_sft,notool_sft,question_prior,constant"
    """which baselines to run"""
    demo_prompt: bool = True
    """the short CPU prompt naming the ``ground`` call (see train.common.SHORT_SYSTEM_PROMPT)"""


# ==============================================================================================
# Runs: one subprocess each, CPU seconds recorded, finished ones skipped
# ==============================================================================================
def seeds_of(args: Args) -> list[int]:
    return [int(s) for s in str(args.seeds).split(",") if s.strip()]


def baselines_of(args: Args) -> list[str]:
    """The baselines asked for (checked against the known ones)."""
    names = [b.strip() for b in str(args.baselines).split(",") if b.strip()]
    unknown = [b for b in names if b not in TRAINED_BASELINES + ANSWER_BASELINES]
    if unknown:
        from medvqa_env.errors import ConfigError

        raise ConfigError(f"unknown baseline(s) {unknown}; expected some of {list(TRAINED_BASELINES + ANSWER_BASELINES)}")
    return names


def metric_key(answer_types: str) -> str:
    """The held-out metric a setting is judged on: ARMed Avg for OPEN only, else accuracy.

    >>> metric_key("OPEN"), metric_key("CLOSED,MCQ")
    ('eval/open/armed_avg', 'eval/accuracy')
    """
    return "eval/open/armed_avg" if {t.strip().upper() for t in answer_types.split(",")} == {"OPEN"} else "eval/accuracy"


def _common(args: Args, tools: str | None = None) -> list[str]:
    argv = ["--dataset", args.dataset, "--answer_types", args.answer_types, "--max_turns", str(args.max_turns),
            "--max_new_tokens", str(args.max_new_tokens), "--tools", args.tools if tools is None else tools]
    for opt in args.dataset_opt:
        argv += ["--dataset-opt", opt]
    if args.reward:
        argv += ["--reward", args.reward]
    return argv


def run(out: Path, name: str, module: str, argv: list[str]) -> dict[str, Any]:
    """Run ``python -m module argv`` once: skipped when ``out/name/DONE`` exists; its CPU seconds
    (user + system, with its children) and wall seconds go to ``DONE`` and ``runs.jsonl``. A
    failing run stops the protocol (its log is ``out/name.log``)."""
    done = out / name / "DONE"
    if done.is_file():
        return json.loads(done.read_text())
    (out / name).mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", module, *argv]
    print(f"[protocol] {name}: {' '.join(cmd[1:])}", flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    info = {"name": name, "argv": [f"python -m {module}", *argv], "rc": rc, "wall_s": round(time.perf_counter() - start, 1),
            "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1)}
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(info) + "\n")
    if rc != 0:
        raise RuntimeError(f"{name} failed with exit code {rc}; see {out / f'{name}.log'}")
    done.write_text(json.dumps(info) + "\n")
    print(f"[protocol] {name}: done in {info['wall_s']:.0f} s wall, {info['cpu_s']:.0f} CPU s", flush=True)
    return info


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of ``path``, or of ``path.gz`` (how :func:`export` stores the large answer files); none if neither."""
    import gzip

    zipped = path.with_name(path.name + ".gz")
    if path.is_file():
        text = path.read_text()
    elif zipped.is_file():
        text = gzip.decompress(zipped.read_bytes()).decode("utf-8")
    else:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ==============================================================================================
# Stage 1: the warm start, chosen on val
# ==============================================================================================
def warm_start(args: Args, out: Path) -> dict[str, Any]:
    """SFT with a val evaluation at every checkpoint; the best val checkpoint is the warm start."""
    key = metric_key(args.answer_types)
    argv = ["--policy", args.policy, "--seed", "0", "--steps", str(args.sft_steps), "--batch_size",
            str(args.sft_batch_size), "--lr", str(args.sft_lr), "--tool_share", str(args.tool_share),
            "--eval_split", "val", "--eval_size", str(args.val_size), "--eval_every", str(args.sft_save_every),
            "--save_every", str(args.sft_save_every), "--keep", "0", "--out", str(out / "warm_sft"), *_common(args)]
    if args.demo_prompt:
        argv.append("--demo-prompt")
    run(out, "warm_sft", "train.sft", argv)
    evals = {r["step"]: r[key] for r in read_jsonl(out / "warm_sft" / "metrics.jsonl") if key in r and r["step"] > 0}
    candidates = {s: v for s, v in evals.items() if (out / "warm_sft" / "checkpoints" / f"step_{s:06d}").is_dir()}
    if not candidates:
        raise RuntimeError(f"no SFT checkpoint with a val evaluation under {out / 'warm_sft'}")
    best = max(candidates, key=lambda s: (candidates[s], s))  # ties: the later step
    choice = {"metric": key, "split": "val", "val_by_step": candidates, "chosen_step": best,
              "checkpoint": str(out / "warm_sft" / "checkpoints" / f"step_{best:06d}")}
    (out / "warm_start.json").write_text(json.dumps(choice, indent=1) + "\n")
    ev = ["--policy", choice["checkpoint"], "--split", "test", "--eval_size", str(args.eval_size),
          "--ablations", args.ablations, "--out", str(out / "warm_test" / "eval.json"), *_common(args)]
    run(out, "warm_test", "train.evaluate", ev)
    return choice


# ==============================================================================================
# Stage 2: GRPO over seeds
# ==============================================================================================
def grpo_runs(args: Args, out: Path, checkpoint: str) -> None:
    for seed in seeds_of(args):
        argv = ["--policy", checkpoint, "--seed", str(seed), "--algo", "grpo", "--steps", str(args.grpo_steps),
                "--prompts_per_step", str(args.prompts_per_step), "--group_size", str(args.group_size),
                "--lr", str(args.grpo_lr), "--temperature", str(args.temperature), "--micro_batch",
                str(args.micro_batch), "--eval_split", "test", "--eval_size", str(args.eval_size), "--eval_every",
                str(args.eval_every), "--eval_ablations", args.ablations, "--save_every", str(args.grpo_steps),
                "--keep", "1", "--tensorboard", "false", "--out", str(out / f"grpo_s{seed}"), *_common(args)]
        run(out, f"grpo_s{seed}", "train.grpo", argv)


# ==============================================================================================
# Stage 3: baselines from the same protocol
# ==============================================================================================
def sft_baseline(args: Args, out: Path, name: str, seed: int, checkpoint: str) -> None:
    """``more_sft``: the warm start, trained on by its recipe for the GRPO steps; ``tool_sft`` /
    ``notool_sft``: from scratch for warm-start + GRPO steps, every trajectory calling the tool /
    no tools in the env."""
    total = args.sft_steps + args.grpo_steps
    recipe = {"more_sft": (checkpoint, args.grpo_steps, args.tool_share, None),
              "tool_sft": (args.policy, total, 1.0, None),
              "notool_sft": (args.policy, total, 0.0, "none")}
    policy, steps, share, tools = recipe[name]
    argv = ["--policy", policy, "--seed", str(seed), "--steps", str(steps), "--batch_size", str(args.sft_batch_size),
            "--lr", str(args.sft_lr), "--tool_share", str(share), "--eval_split", "test", "--eval_size",
            str(args.eval_size), "--eval_every", "0", "--eval_ablations", args.ablations, "--save_every", str(steps),
            "--keep", "1", "--out", str(out / f"{name}_s{seed}"), *_common(args, tools)]
    if name == "notool_sft":
        argv += ["--system_prompt", NO_TOOL_PROMPT]
    elif args.demo_prompt and name != "more_sft":  # more_sft keeps the warm start's saved prompt
        argv.append("--demo-prompt")
    run(out, f"{name}_s{seed}", "train.sft", argv)


def answer_baselines(args: Args, out: Path) -> dict[str, Any]:
    """``question_prior`` and ``constant``, scored like a policy on the same test questions."""
    path = out / "answer_baselines.json"
    if path.is_file():
        return json.loads(path.read_text())
    from agents.models import load_policy
    from medvqa_env.config import parse_options
    from medvqa_env.datasets import load_dataset
    from medvqa_env.pool import EnvPool
    from train.answer_baselines import best_constant, evaluate_question_prior
    from train.common import env_kwargs, reward_spec, select_indices

    key = metric_key(args.answer_types)
    options = parse_options(args.dataset_opt, "--dataset-opt")
    train = load_dataset(args.dataset, split="train", **options)
    wanted = {t.strip().upper() for t in args.answer_types.split(",") if t.strip()}
    train_records = [r for r in train if r.answer_type.value in wanted]
    indices = select_indices(args.dataset, "test", args.answer_types, limit=args.eval_size, dataset_options=options)
    _, encoder, _ = load_policy(args.policy)
    pool = EnvPool(env_kwargs(args.dataset, "test", "none", args.max_turns, options, reward=reward_spec(args.reward)),
                   min(len(indices), 32))
    answers = out / "answer_baselines" / "heldout_answers.jsonl"
    answers.unlink(missing_ok=True)
    try:
        prior = evaluate_question_prior(encoder, pool, indices, train_records, answers, args.max_new_tokens)
        candidates = sorted({r.answer for r in train_records})
        best, metrics, scores = best_constant(encoder, pool, indices, candidates, key, answers, args.max_new_tokens)
    finally:
        pool.close()
    result = {"metric": key, "question_prior": prior, "constant": {"answer": best, **metrics},
              "constant_candidates": scores}
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def tool_outputs(args: Args, out: Path) -> Path:
    """What the tool says on each held-out question when called the way the gold trajectories call
    it (``train.sft.gold_tool_call``), recorded once through the env: with the stored answers it
    shows *how* a policy reads its tool (e.g. "yes iff anything was found" against "yes iff the
    asked-about organ was found"), which accuracy alone cannot."""
    path = out / "tool_outputs.jsonl"
    if path.is_file():
        return path
    from medvqa_env.config import parse_options
    from medvqa_env.env import MedVQAEnv
    from train.common import env_kwargs, select_indices
    from train.sft import gold_tool_call

    options = parse_options(args.dataset_opt, "--dataset-opt")
    env = MedVQAEnv(**env_kwargs(args.dataset, "test", args.tools, max(1, args.max_turns), options, reward="rule"))
    rows = []
    try:
        for i in select_indices(args.dataset, "test", args.answer_types, limit=args.eval_size, dataset_options=options):
            record = env.dataset[i]
            call = gold_tool_call(record, env.toolbox.names)
            env.reset(seed=0, options={"index": i})
            text = env.step(call)[0]["text"] if call else ""
            rows.append({"record_id": record.id, "question": record.question, "gold": record.answer,
                         "call": call, "observation": text})
    finally:
        env.close()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ==============================================================================================
# Stage 4: the report
# ==============================================================================================
def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """Mean, sample SD (n - 1), and the two ends of the Student-t interval of the mean.

    >>> [round(v, 3) for v in t_interval([1.0, 2.0, 3.0])]
    [2.0, 1.0, -0.484, 4.484]
    """
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan"), float("nan"), float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


def welch_difference(a: list[float], b: list[float], level: float = 0.95) -> dict[str, float]:
    """Difference of means ``mean(a) - mean(b)`` with Welch's interval; ``b`` of one value (a
    deterministic baseline) is a constant, so the interval is ``a``'s t-interval shifted."""
    from scipy import stats

    ma, sa, _, _ = t_interval(a)
    mb = sum(b) / len(b)
    va = sa ** 2 / len(a)
    vb = (t_interval(b)[1] ** 2 / len(b)) if len(b) > 1 else 0.0
    se = math.sqrt(va + vb)
    if len(b) > 1 and se > 0:
        dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    else:
        dof = len(a) - 1
    half = float(stats.t.ppf(0.5 + level / 2, dof)) * se if se > 0 else 0.0
    d = ma - mb
    return {"difference": d, "ci_low": d - half, "ci_high": d + half, "beats": d - half > 0}


def final_eval(metrics: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The last held-out evaluation of a run (and its ablations) as plain figures."""
    last = [r for r in metrics if key in r][-1]
    row = {"step": last["step"], "metric": last[key], "distinct_answers": last.get("eval/distinct_answers"),
           "answer_entropy": last.get("eval/answer_entropy"), "top_answer_share": last.get("eval/top_answer_share"),
           "greedy_tool_calls": last.get("eval/calls_per_episode")}
    for mode in ("blank", "shuffle"):
        k = key.replace("eval/", f"eval_{mode}/", 1)
        if k in last:
            row[f"{mode}_metric"] = last[k]
            row[f"{mode}_drop"] = last[key] - last[k]
    return row


def _summary(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    values = [r["metric"] for r in per_seed.values()]
    mean, sd, low, high = t_interval(values)
    out = {"seeds": len(values), "mean": mean, "sd": sd, "ci_low": low, "ci_high": high, "per_seed": per_seed}
    for field_ in ("distinct_answers", "greedy_tool_calls", "blank_drop", "shuffle_drop", "cpu_s"):
        vals = [r[field_] for r in per_seed.values() if r.get(field_) is not None]
        if vals:
            out[f"{field_}_mean"] = sum(vals) / len(vals)
            out[f"{field_}_max"] = max(vals)
            out[f"{field_}_min"] = min(vals)
    return out


def report(args: Args, out: Path) -> dict[str, Any]:
    key = metric_key(args.answer_types)
    runs = {r["name"]: r for r in read_jsonl(out / "runs.jsonl") if r["rc"] == 0}
    warm = json.loads((out / "warm_start.json").read_text())
    warm_test = json.loads((out / "warm_test" / "eval.json").read_text())["metrics"]
    rows: dict[str, Any] = {}
    for name in ("grpo", *[b for b in TRAINED_BASELINES if b in baselines_of(args)]):
        per_seed = {}
        for seed in seeds_of(args):
            folder = out / f"{name}_s{seed}"
            metrics = read_jsonl(folder / "metrics.jsonl")
            if not metrics or not (folder / "DONE").is_file():
                continue
            row = final_eval(metrics, key)
            row["cpu_s"] = runs.get(f"{name}_s{seed}", {}).get("cpu_s")
            if name == "grpo":
                sampled = [r["tools/calls_per_episode"] for r in metrics if "tools/calls_per_episode" in r and r["step"] > 0]
                row["sampled_tool_calls_first"] = sampled[0] if sampled else None
                row["sampled_tool_calls_last5"] = sum(sampled[-5:]) / len(sampled[-5:]) if sampled else None
            per_seed[seed] = row
        if per_seed:
            rows[name] = _summary(per_seed)
    warm_row = final_eval([{"step": warm["chosen_step"], **warm_test}], key)
    rows["warm_start"] = {"seeds": 1, "mean": warm_row["metric"], "per_seed": {0: warm_row},
                          "cpu_s": runs.get("warm_sft", {}).get("cpu_s")}
    answers = json.loads((out / "answer_baselines.json").read_text()) if (out / "answer_baselines.json").is_file() else {}
    for name in ANSWER_BASELINES:
        if name in answers:
            m = answers[name]
            rows[name] = {"seeds": 1, "mean": m[key], "per_seed": {0: {"metric": m[key],
                          "distinct_answers": m.get("eval/distinct_answers"), "greedy_tool_calls": 0.0}}}
            if name == "constant":
                rows[name]["answer"] = m["answer"]
    comparisons = {}
    if "grpo" in rows:
        grpo_values = [r["metric"] for r in rows["grpo"]["per_seed"].values()]
        for name, row in rows.items():
            if name != "grpo":
                comparisons[name] = welch_difference(grpo_values, [r["metric"] for r in row["per_seed"].values()])
    result = {"args": asdict(args), "metric": key, "warm_start": warm, "rows": rows, "grpo_minus": comparisons,
              "beats_every_baseline": bool(comparisons) and all(c["beats"] for c in comparisons.values())}
    (out / "protocol.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


GZIPPED = ("heldout_answers.jsonl", "eval.answers.jsonl")  # every held-out answer: large, very repetitive


def export(out: Path, dest: Path) -> None:
    """Copy what a reader needs (no weights): each run's args, metrics and held-out answers (the
    answer files gzipped, ~60x smaller), the warm-start choice, the runs' CPU seconds, the answer
    baselines, the tool's outputs and the report."""
    import gzip

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("protocol.json", "warm_start.json", "runs.jsonl", "answer_baselines.json", "tool_outputs.jsonl"):
        if (out / name).is_file():
            shutil.copy2(out / name, dest / name)
    for folder in sorted(p for p in out.iterdir() if p.is_dir() and (p / "DONE").is_file() or p.name == "answer_baselines"):
        target = dest / folder.name
        target.mkdir(exist_ok=True)
        for f in (*RUN_FILES, "DONE", "eval.json", "eval.answers.jsonl"):
            if not (folder / f).is_file():
                continue
            if f in GZIPPED:  # mtime=0: the same answers give the same bytes
                (target / f"{f}.gz").write_bytes(gzip.compress((folder / f).read_bytes(), mtime=0))
            else:
                shutil.copy2(folder / f, target / f)
    print(f"[protocol] exported run files to {dest}")


def main(args: Args) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        from medvqa_env.errors import ConfigError

        raise ConfigError(f"unknown stage(s) {unknown}; expected a comma list of {list(STAGES)}")
    if len(seeds_of(args)) < 5:
        print(f"[protocol] warning: {len(seeds_of(args))} seeds; a learning claim needs at least 5", flush=True)
    (out / "protocol_args.json").write_text(json.dumps(asdict(args), indent=1) + "\n")
    baselines = baselines_of(args)
    needs_warm = "grpo" in stages or ("baselines" in stages and "more_sft" in baselines)
    choice = warm_start(args, out) if "warm" in stages else (
        json.loads((out / "warm_start.json").read_text()) if needs_warm else {})
    if "grpo" in stages:
        grpo_runs(args, out, choice["checkpoint"])
    if "baselines" in stages:
        for name in TRAINED_BASELINES:
            if name in baselines:
                for seed in seeds_of(args):
                    sft_baseline(args, out, name, seed, choice.get("checkpoint", ""))
        if any(b in baselines for b in ANSWER_BASELINES):
            answer_baselines(args, out)
    if "report" in stages:
        result = report(args, out)
        if "grpo" not in result["rows"]:  # nothing to compare: a report of baselines alone is no result
            print(f"[protocol] no finished GRPO run under {out}: nothing to report", file=sys.stderr)
            return 1
        tool_outputs(args, out)
        for name, row in result["rows"].items():
            sd = f" ± {row['sd']:.3f} (sample SD)" if row.get("sd") == row.get("sd") and "sd" in row else ""
            print(f"[protocol] {name:15s} {result['metric']} {row['mean']:.3f}{sd} over {row['seeds']} seed(s)")
        print(f"[protocol] GRPO beats every baseline: {result['beats_every_baseline']}")
        if args.export:
            export(out, Path(args.export))
    return 0


if __name__ == "__main__":
    from train.common import parse_args

    _args = parse_args(Args, prog="python -m train.protocol")
    sys.exit(run_cli("python -m train.protocol", lambda: main(_args)))
