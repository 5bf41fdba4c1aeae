"""``python -m train.protocol``: a learning claim that cannot fool us.

One command runs the whole comparison, resumably, and writes what a reader needs to check it:

0. **Tool builds.** A trained tool (``engine: trained``) is a random draw too: seed ``k`` of every
   row runs with build ``k mod tool_builds`` of each trained tool (its ``seed`` option), so the
   rows' intervals cover the tools' training as well as the policy's, and GRPO seed ``k`` and
   baseline seed ``k`` still share their tools (a paired comparison). Each build is named by the
   SHA-256 of its folder in the report's ``identity`` block, with the data, the warm starts and
   the commit.
1. **Warm start, chosen on val by what RL will use** (issue 42). Per tool build, one SFT run on
   gold trajectories (``train.sft``); every saved checkpoint is probed on the *val* split
   (:mod:`train.probe`): the score with the gold tool call forced as the first turn, the score of
   episodes sampled at the rollout temperature, their tool-call rate and the score of the calling
   and the direct ones. The rule, fixed in advance (:func:`choose_warm_start`): keep the candidates
   within two standard errors of the best forced-call score, of those the ones within two of the
   best sampled score, and take the latest. Greedy accuracy, which cannot see tool use (a greedy
   warm start never calls), is recorded beside them and chooses nothing. Every candidate's figures
   are in ``warm_start_b<k>.json``. The test split is never looked at to choose anything.
2. **GRPO** (``train.grpo``) from that warm start, one run per seed (>= 5), held-out evaluation on
   the test split every few steps, images ablated at the end (``blank``: for the policy and the
   tools; ``blank_policy``: for the policy only, the tools see the real image; ``shuffle``).
3. **Baselines, same protocol, same seeds, same tool builds, same held-out questions**:
   ``more_sft`` (the warm start trained on with its own SFT recipe for as many steps as GRPO took),
   ``tool_sft`` (SFT from scratch, every gold trajectory calling the tool, warm-start + GRPO steps),
   ``notool_sft`` (SFT from scratch with no tools at all, the same steps), ``imperfect_sft`` (SFT
   from scratch on imperfect demonstrations: a share answering without the tool, a share of the
   tool-callers misreading it; the same steps), ``rft`` (online rejection-sampling fine-tuning from
   the warm start: GRPO's sampling, settings and sampled episodes, SFT on the correct ones:
   ``train.grpo --algo rft``), ``question_prior`` (the most common training answer for the
   question's text) and ``constant`` (the best single answer, chosen on the held-out questions
   themselves).
4. **Report** (``protocol.json``): per row and seed the final held-out metric, distinct answers and
   their entropy (a constant answer shows), greedy tool calls, the image-ablation drop and the run's
   CPU seconds; per row the mean, the *sample* SD and a 95% t-interval; for GRPO against each
   baseline the difference of means with a Welch 95% interval and, where the seeds pair up (same
   tool build), the paired one, which decides the verdict. Every held-out answer of every run is
   stored (``heldout_answers.jsonl``), and GRPO's tool calls are the policy's own, sampled.

Each run is a subprocess whose CPU seconds (its own and its children's) are recorded in
``runs.jsonl``; a finished run is skipped on a rerun, so a killed protocol resumes. ``--export DIR``
copies the small run files (args, metrics, answers, no weights) into ``DIR`` for committing::

    python -m train.protocol --out runs/protocol/closed --answer-types CLOSED --tools ground=trained \\
        --export benchmarks/runs/protocol/closed
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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from medvqa_env.cli import run_cli

STAGES = ("warm", "kl", "grpo", "baselines", "report")
TRAINED_BASELINES = ("more_sft", "tool_sft", "notool_sft", "imperfect_sft", "rft")
FROM_WARM_START = ("more_sft", "rft")  # the baselines that start where GRPO starts
ANSWER_BASELINES = ("question_prior", "constant")
NO_TOOL_PROMPT = "You answer questions about medical images. Give the final answer as \\boxed{answer}."
RUN_FILES = ("args.json", "metrics.jsonl", "heldout_answers.jsonl", "resumes.jsonl")


@dataclass
class Args:
    """The learning protocol: val-chosen warm start, GRPO over seeds, same-protocol baselines."""

    out: str = "runs/protocol"
    """working folder (checkpoints, run folders, runs.jsonl, protocol.json)"""
    stages: str = "warm,kl,grpo,baselines,report"
    """which stages to run (comma list of warm, kl, grpo, baselines, report); finished runs are skipped"""
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
    ablations: str = "blank,blank_policy,shuffle"
    """image ablations evaluated on every final policy (``blank_policy``: the tools see the real image)"""
    tool_builds: int = 0
    """0 (the default): every seed its own tool build and warm start (seed k on build k), so seeds are
    independent replicates; k > 0: seed s on build s mod k of each trained tool (records before issue 42
    had 3), and the statistics take the builds as the units"""
    baselines: str = "more_sft,tool_sft,notool_sft,imperfect_sft,rft,question_prior,constant"
    """which baselines to run (records before issue 46 ran the first three trained ones)"""
    imperfect_tool_share: float = 0.75
    """``imperfect_sft``: the share of its gold trajectories that call the tool (fixed in advance)"""
    misread_share: float = 0.25
    """``imperfect_sft``: the share of the tool-calling ones that answer wrongly after it (fixed in advance)"""
    demo_prompt: bool = True
    """the short CPU prompt naming the ``ground`` call (see train.common.SHORT_SYSTEM_PROMPT)"""
    probe_samples: int = 4
    """sampled val episodes per question (at ``temperature``) when probing each warm-start candidate"""
    format_penalty: float = -0.2
    """the env's reward for a turn that neither calls a tool nor answers, in every reward-trained run (GRPO);
    fixed in advance, not tuned (records before issue 42 ran with 0)"""
    kl_coef: float = 0.01
    """GRPO's KL coefficient to the warm start (k3), recorded: the default the ``kl`` stage keeps unless val
    says otherwise"""
    kl_candidates: str = "0,0.01,0.05"
    """the ``kl`` stage: KL coefficients tried on val before GRPO (one GRPO run each from the first seed's
    warm start, evaluated on the val questions); the chosen one goes to every reward-trained run (GRPO,
    rft). Empty: ``kl_coef`` as given, no choice (records before issue 42's KL choice)"""


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


def trained_tools(args: Args) -> dict[str, dict[str, Any]]:
    """The protocol's tools whose engine is ``trained``, with their configs."""
    from tool_backends.config import load_tool_config

    config = load_tool_config(args.tools) or {}
    return {name: dict(spec) for name, spec in config.items() if isinstance(spec, dict) and spec.get("engine") == "trained"}


def build_of(args: Args, seed: int) -> int:
    """The tool build (and warm start) seed ``seed`` runs with: ``seed`` itself with ``tool_builds``
    0 (each seed its own), else ``seed mod tool_builds``, and 0 when no tool is trained.

    >>> [build_of(Args(tool_builds=3), s) for s in range(5)], [build_of(Args(), s) for s in range(5)]
    ([0, 1, 2, 0, 1], [0, 1, 2, 3, 4])
    >>> build_of(Args(tools="ground=oracle", tool_builds=3), 4), build_of(Args(tools="ground=oracle"), 4)
    (0, 4)
    """
    if args.tool_builds <= 0:
        return seed
    return seed % args.tool_builds if trained_tools(args) else 0


def independent(args: Args) -> bool:
    """Every seed has its own tool build and warm start: the seeds are the statistics' units."""
    seeds = seeds_of(args)
    return len({build_of(args, s) for s in seeds}) == len(seeds)


def unit_values(args: Args, by_seed: Mapping[int, float]) -> dict[int, float]:
    """A row's values as independent units: the seeds themselves when each has its own build, else
    one value per tool build (the mean of its seeds), so no build's warm start or tool is counted
    twice in an interval.

    >>> unit_values(Args(tool_builds=3, seeds="0,1,2,3,4"), {0: 0.9, 1: 0.8, 2: 0.5, 3: 0.7, 4: 0.6})
    {0: 0.8, 1: 0.7, 2: 0.5}
    >>> unit_values(Args(seeds="0,1"), {0: 0.9, 1: 0.8})
    {0: 0.9, 1: 0.8}
    """
    if independent(args):
        return dict(by_seed)
    groups: dict[int, list[float]] = {}
    for seed, v in by_seed.items():
        groups.setdefault(build_of(args, seed), []).append(v)
    return {b: round(sum(v) / len(v), 12) for b, v in sorted(groups.items())}


def builds_of(args: Args) -> list[int]:
    return sorted({build_of(args, s) for s in seeds_of(args)})


def _common(args: Args, tools: str | None = None, build: int = 0) -> list[str]:
    argv = ["--dataset", args.dataset, "--answer_types", args.answer_types, "--max_turns", str(args.max_turns),
            "--max_new_tokens", str(args.max_new_tokens), "--tools", args.tools if tools is None else tools]
    if tools is None:  # the protocol's tools: each trained one as this build
        for name in trained_tools(args):
            argv += ["--tool-opt", f"{name}.seed={build}"]
    for opt in args.dataset_opt:
        argv += ["--dataset-opt", opt]
    if args.reward:
        argv += ["--reward", args.reward]
    if args.format_penalty:  # every run's env (rewards of SFT and evaluations are only logged)
        argv += ["--format_penalty", str(args.format_penalty)]
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
def warm_names(out: Path, build: int) -> tuple[str, str, Path]:
    """The warm start's SFT run, its test evaluation and its choice file for tool build ``build``
    (a protocol recorded before tool builds had ``warm_sft``, ``warm_test``, ``warm_start.json``)."""
    if build == 0 and (out / "warm_start.json").is_file() and not (out / "warm_start_b0.json").is_file():
        return "warm_sft", "warm_test", out / "warm_start.json"
    return f"warm_sft_b{build}", f"warm_test_b{build}", out / f"warm_start_b{build}.json"


CHOICE_RULE = ("forced-call score, then sampled score at the rollout temperature, each keeping the candidates "
               "within two standard errors of the best; the latest step left is chosen")
"""How a warm start is chosen among the probed candidates (:func:`choose_warm_start`), fixed in advance."""


def greedy_lead(val_by_step: Mapping[int, float], n_questions: int) -> dict[str, Any]:
    """The greedy val figures' best step and its lead over the runner-up against two binomial
    standard errors -- what the protocol chose by before issue 42, recorded as ``blind_choice``.

    >>> c = greedy_lead({25: 0.50, 50: 0.515, 75: 0.505}, 200)
    >>> c["step"], c["lead"], c["within_noise"]
    (50, 0.01, True)
    """
    best = max(val_by_step, key=lambda s: (val_by_step[s], s))
    others = [v for s, v in val_by_step.items() if s != best]
    p = min(max(val_by_step[best], 0.0), 1.0)
    se = math.sqrt(p * (1 - p) / max(1, n_questions))
    lead = round(val_by_step[best] - max(others), 6) if others else None
    return {"step": best, "lead": lead, "val_se": se, "within_noise": bool(lead is not None and lead < 2 * se)}


def choose_warm_start(candidates: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The warm start among probed checkpoints (``step -> train.probe figures``), by
    :data:`CHOICE_RULE`: the forced-call score keeps the candidates within two standard errors of
    its best, the sampled score does the same among those, and the latest step left wins.
    ``within_noise``: more than one candidate was left, so the fixed rule decided.

    A case like CLOSED build 2 (step 50 answers at chance with the tool's answer in front of it,
    step 150 reads it; greedily both answer without a call, step 50 one question ahead):

    >>> c = choose_warm_start({50: {"greedy": 0.505, "forced": 0.48, "forced_se": 0.05, "sampled": 0.52, "sampled_se": 0.03},
    ...                        150: {"greedy": 0.495, "forced": 0.718, "forced_se": 0.045, "sampled": 0.55, "sampled_se": 0.03}})
    >>> c["chosen_step"], c["within_noise"], [st["kept"] for st in c["stages"]]
    (150, False, [[150], [150]])
    >>> choose_warm_start({25: {"forced": 0.70, "forced_se": 0.03, "sampled": 0.6, "sampled_se": 0.03},
    ...                    50: {"forced": 0.72, "forced_se": 0.03, "sampled": 0.6, "sampled_se": 0.03}})["chosen_step"]
    50
    """
    if not candidates:
        raise ValueError("expected at least one warm-start candidate, got none")
    left = sorted(int(s) for s in candidates)
    stages = []
    for measure in ("forced", "sampled"):
        have = [s for s in left if isinstance(candidates[s].get(measure), (int, float))]
        if not have:
            continue
        best = max(have, key=lambda s: (candidates[s][measure], s))
        floor = candidates[best][measure] - 2 * float(candidates[best].get(f"{measure}_se") or 0.0)
        left = [s for s in have if candidates[s][measure] >= floor - 1e-12]
        stages.append({"measure": measure, "best_step": best, "best": candidates[best][measure],
                       "floor": round(floor, 6), "kept": left})
    return {"chosen_step": max(left), "rule": CHOICE_RULE, "stages": stages, "within_noise": len(left) > 1}


def warm_start(args: Args, out: Path, build: int = 0) -> dict[str, Any]:
    """SFT (seed = the tool build) with a checkpoint every ``sft_save_every`` steps, each probed on
    val (:func:`probe_candidate`); :func:`choose_warm_start` picks the warm start of the runs on tool
    build ``build``, and its test figure is measured once chosen."""
    key = metric_key(args.answer_types)
    sft_name, test_name, choice_file = warm_names(out, build)
    argv = ["--policy", args.policy, "--seed", str(build), "--steps", str(args.sft_steps), "--batch_size",
            str(args.sft_batch_size), "--lr", str(args.sft_lr), "--tool_share", str(args.tool_share),
            "--eval_split", "val", "--eval_size", str(args.val_size), "--eval_every", str(args.sft_save_every),
            "--save_every", str(args.sft_save_every), "--keep", "0", "--out", str(out / sft_name),
            *_common(args, build=build)]
    if args.demo_prompt:
        argv.append("--demo-prompt")
    run(out, sft_name, "train.sft", argv)
    ran = json.loads((out / sft_name / "args.json").read_text())["args"]  # what the run evaluated on, not what we meant
    evals = {r["step"]: r[key] for r in read_jsonl(out / sft_name / "metrics.jsonl") if key in r and r["step"] > 0}
    steps = sorted(s for s in evals if (out / sft_name / "checkpoints" / f"step_{s:06d}").is_dir())
    if not steps:
        raise RuntimeError(f"no SFT checkpoint with a val evaluation under {out / sft_name}")
    probes = {s: probe_candidate(args, out, build, f"{sft_name}/checkpoints/step_{s:06d}", s) for s in steps}
    chosen = choose_warm_start(probes)
    blind = greedy_lead({s: evals[s] for s in steps}, int(ran["eval_size"]))
    choice = {"metric": key, "split": ran["eval_split"], "tool_build": build,
              "val_by_step": {s: evals[s] for s in steps}, "candidates": probes, **chosen,
              "blind_choice": blind, "probe_samples": args.probe_samples, "temperature": args.temperature,
              "checkpoint": f"{sft_name}/checkpoints/step_{chosen['chosen_step']:06d}"}  # relative to the protocol folder
    choice_file.write_text(json.dumps(choice, indent=1) + "\n")
    ev = ["--policy", str(out / choice["checkpoint"]), "--split", "test", "--eval_size", str(args.eval_size),
          "--ablations", args.ablations, "--out", str(out / test_name / "eval.json"), *_common(args, build=build)]
    run(out, test_name, "train.evaluate", ev)
    return choice


def probe_name(build: int, step: int) -> str:
    return f"warm_probe_b{build}_{step:06d}"


def probe_candidate(args: Args, out: Path, build: int, checkpoint: str, step: int) -> dict[str, Any]:
    """:mod:`train.probe`'s figures of one warm-start candidate on val (a ``train.evaluate`` run)."""
    name = probe_name(build, step)
    ev = ["--policy", str(out / checkpoint), "--split", "val", "--eval_size", str(args.val_size),
          "--probe_samples", str(max(1, args.probe_samples)), "--temperature", str(args.temperature),
          "--seed", str(build), "--out", str(out / name / "eval.json"), *_common(args, build=build)]
    run(out, name, "train.evaluate", ev)
    return json.loads((out / name / "eval.json").read_text())["probe"]


def warm_checkpoint(out: Path, choice: dict[str, Any]) -> str:
    """The warm start's folder (choices record it relative to the protocol folder; older ones absolute)."""
    path = Path(choice["checkpoint"])
    return str(path if path.is_absolute() else out / path)


# ==============================================================================================
# Stage 2: GRPO over seeds
# ==============================================================================================
def reward_trained_run(args: Args, out: Path, name: str, algo: str, seed: int, warm: dict[int, dict[str, Any]],
                       split: str = "test", extra: list[str] | tuple[str, ...] = ()) -> None:
    """One ``train.grpo`` run from seed ``seed``'s warm start: GRPO itself, or the ``rft`` baseline
    with every setting, the reward (format penalty included) and the sampled episodes the same. On
    ``split="val"`` (the KL choice, the levers of ``benchmarks/bench_levers.py``) it is evaluated on
    the val questions, without ablations; ``extra``: more ``train.grpo`` flags (a lever's)."""
    build = build_of(args, seed)
    size, ablations = (args.eval_size, args.ablations) if split == "test" else (args.val_size, "")
    argv = ["--policy", warm_checkpoint(out, warm[build]), "--seed", str(seed), "--algo", algo, "--steps", str(args.grpo_steps),
            "--prompts_per_step", str(args.prompts_per_step), "--group_size", str(args.group_size),
            "--lr", str(args.grpo_lr), "--temperature", str(args.temperature), "--micro_batch",
            str(args.micro_batch), "--eval_split", split, "--eval_size", str(size), "--eval_every",
            str(args.eval_every), "--eval_ablations", ablations, "--save_every", str(args.grpo_steps),
            "--keep", "1", "--tensorboard", "false", "--kl_coef", str(args.kl_coef), "--out", str(out / f"{name}_s{seed}"),
            *_common(args, build=build), *extra]
    run(out, f"{name}_s{seed}", "train.grpo", argv)


KL_RULE = ("the default kl_coef stays unless the best candidate's final val figure is above the default's by more "
           "than two standard errors of their difference, paired by question; then the best candidate")
"""How the ``kl`` stage chooses (:func:`choose_kl`), fixed in advance."""


def kl_candidates(args: Args) -> list[float]:
    return [float(c) for c in str(args.kl_candidates).split(",") if c.strip()]


def val_scores(folder: Path, key: str) -> dict[str, float]:
    """Per-question scores of a run's last held-out (here: val) evaluation, from its stored answers:
    1/0 for accuracy, the mean of the four open metrics for the ARMed Avg (unscored answers left out,
    as the run's own figure leaves them)."""
    rows = [r for r in read_jsonl(folder / "heldout_answers.jsonl") if r["tag"] is None]
    if not rows:
        raise ValueError(f"{folder}: no stored held-out answers to choose on")
    last = max(r["step"] for r in rows)
    scores = {}
    for r in rows:
        if r["step"] != last:
            continue
        if key == "eval/accuracy":
            scores[r["record_id"]] = float(bool(r["correct"]))
        elif r.get("open_metrics"):
            scores[r["record_id"]] = sum(r["open_metrics"].values()) / len(r["open_metrics"])
    return scores


def choose_kl(scores: Mapping[float, Mapping[str, float]], default: float) -> dict[str, Any]:
    """The KL coefficient by :data:`KL_RULE` from each candidate's per-question val scores.

    >>> same = {f"q{i}": float(i % 2) for i in range(100)}
    >>> choose_kl({0.0: same, 0.01: same, 0.05: {**same, "q0": 1.0}}, 0.01)["chosen"]  # one question: noise
    0.01
    >>> better = {f"q{i}": 1.0 for i in range(100)}
    >>> choose_kl({0.0: better, 0.01: same}, 0.01)["chosen"]
    0.0
    """
    if not scores:
        raise ValueError("expected at least one KL candidate, got none")
    means = {c: sum(v.values()) / len(v) for c, v in scores.items()}
    best = max(means, key=lambda c: (means[c], c == default))
    chosen = default if default in scores else best
    paired = None
    if best != chosen:
        ids = sorted(set(scores[best]) & set(scores[chosen]))
        diffs = [scores[best][i] - scores[chosen][i] for i in ids]
        mean, sd, _, _ = t_interval(diffs)
        se = sd / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
        paired = {"difference": round(mean, 6), "se": round(se, 6), "questions": len(diffs)}
        if mean > 2 * se:
            chosen = best
    return {"chosen": chosen, "default": default, "best": best, "rule": KL_RULE,
            "val": {f"{c:g}": round(m, 6) for c, m in sorted(means.items())},
            "questions": {f"{c:g}": len(v) for c, v in sorted(scores.items())}, "best_minus_default": paired}


def kl_choice(args: Args, out: Path, warm: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The ``kl`` stage: one GRPO run per candidate from the first seed's warm start, each evaluated
    on the val questions; the choice (:func:`choose_kl`) and every candidate's figure go to
    ``kl_choice.json``. Nothing here sees a test question."""
    seed = seeds_of(args)[0]
    scores = {}
    for coef in kl_candidates(args):
        name = f"kl_val_{coef:g}"
        reward_trained_run(replace(args, kl_coef=coef), out, name, "grpo", seed, warm, split="val")
        scores[coef] = val_scores(out / f"{name}_s{seed}", metric_key(args.answer_types))
    choice = {**choose_kl(scores, args.kl_coef), "seed": seed, "tool_build": build_of(args, seed)}
    (out / "kl_choice.json").write_text(json.dumps(choice, indent=1) + "\n")
    print(f"[protocol] KL on val: {choice['val']} -> {choice['chosen']:g} ({KL_RULE})", flush=True)
    return choice


def chosen_kl(args: Args, out: Path) -> Args:
    """``args`` with the KL coefficient the ``kl`` stage chose (when it ran in this folder)."""
    path = out / "kl_choice.json"
    if kl_candidates(args) and path.is_file():
        return replace(args, kl_coef=float(json.loads(path.read_text())["chosen"]))
    return args


def grpo_runs(args: Args, out: Path, warm: dict[int, dict[str, Any]]) -> None:
    for seed in seeds_of(args):
        reward_trained_run(args, out, "grpo", "grpo", seed, warm)


# ==============================================================================================
# Stage 3: baselines from the same protocol
# ==============================================================================================
def sft_baseline(args: Args, out: Path, name: str, seed: int, warm: dict[int, dict[str, Any]]) -> None:
    """``more_sft``: the warm start, trained on by its recipe for the GRPO steps; ``tool_sft`` /
    ``notool_sft`` / ``imperfect_sft``: from scratch for warm-start + GRPO steps, every trajectory
    calling the tool / no tools in the env / imperfect demonstrations; ``rft``: see
    :func:`reward_trained_run`."""
    if name == "rft":
        reward_trained_run(args, out, "rft", "rft", seed, warm)
        return
    total = args.sft_steps + args.grpo_steps
    checkpoint = warm_checkpoint(out, warm[build_of(args, seed)]) if name == "more_sft" else ""
    recipe = {"more_sft": (checkpoint, args.grpo_steps, args.tool_share, None),
              "tool_sft": (args.policy, total, 1.0, None),
              "notool_sft": (args.policy, total, 0.0, "none"),
              "imperfect_sft": (args.policy, total, args.imperfect_tool_share, None)}
    policy, steps, share, tools = recipe[name]
    argv = ["--policy", policy, "--seed", str(seed), "--steps", str(steps), "--batch_size", str(args.sft_batch_size),
            "--lr", str(args.sft_lr), "--tool_share", str(share), "--eval_split", "test", "--eval_size",
            str(args.eval_size), "--eval_every", "0", "--eval_ablations", args.ablations, "--save_every", str(steps),
            "--keep", "1", "--out", str(out / f"{name}_s{seed}"), *_common(args, tools, build_of(args, seed))]
    if name == "imperfect_sft":
        argv += ["--misread_share", str(args.misread_share)]
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


def tool_outputs_path(out: Path, build: int) -> Path:
    """Where :func:`tool_outputs` records build ``build`` (``tool_outputs.jsonl`` in a protocol
    recorded before tool builds)."""
    legacy = out / "tool_outputs.jsonl"
    return legacy if build == 0 and legacy.is_file() and not (out / "warm_start_b0.json").is_file() \
        else out / f"tool_outputs_b{build}.jsonl"


def tool_outputs(args: Args, out: Path, build: int = 0) -> Path:
    """What the tool (build ``build``) says on each held-out question when called the way the gold
    trajectories call it (``train.sft.gold_tool_call``), recorded once through the env: with the
    stored answers it shows *how* a policy reads its tool (e.g. "yes iff anything was found"
    against "yes iff the asked-about organ was found"), which accuracy alone cannot."""
    path = tool_outputs_path(out, build)
    if path.is_file():
        return path
    from medvqa_env.config import parse_options
    from medvqa_env.env import MedVQAEnv
    from train.common import env_kwargs, select_indices
    from train.sft import gold_tool_call

    options = parse_options(args.dataset_opt, "--dataset-opt")
    env = MedVQAEnv(**env_kwargs(args.dataset, "test", args.tools, max(1, args.max_turns), options, reward="rule",
                                 tool_options=[f"{name}.seed={build}" for name in trained_tools(args)]))
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


def identity(args: Args, out: Path) -> dict[str, Any]:
    """Every artefact the report's figures depend on, named by content: the code (commit, whether
    the tree was clean, package versions), each trained tool build (its cache folder's name and
    content hash, the one its runs record: :func:`tool_backends.identity.describe_tools`), the data (SHA-256 of the train, val and held-out records used) and each warm start
    (:func:`train.checkpoint.policy_sha256`: its weights and settings, so a rerun can match it; records
    before it hold ``sha256``, the whole folder's, which moves with the trainer's wall time). Paths are relative; nothing names this machine."""
    from medvqa_env.config import parse_options
    from medvqa_env.datasets import load_dataset
    from medvqa_env.provenance import provenance, records_sha256
    from tool_backends.identity import describe_tools
    from train.checkpoint import policy_sha256
    from train.common import select_indices

    options = parse_options(args.dataset_opt, "--dataset-opt")
    tools: dict[str, Any] = {}
    for build in builds_of(args):  # the hash every run of this build records as its tool_identity
        described = describe_tools({name: {**spec, "seed": build} for name, spec in trained_tools(args).items()})
        for name, desc in described.items():
            tools.setdefault(name, {})[str(build)] = {"folder": Path(desc["path"] or "").name,
                                                     "content_hash": desc["content_hash"]}
    data = {}
    for split, limit in (("train", None), ("val", args.val_size), ("test", args.eval_size)):
        ds = load_dataset(args.dataset, split=split, **options)
        idx = select_indices(args.dataset, split, args.answer_types, limit=limit, dataset_options=options)
        data[split] = {"records": len(idx), "sha256": records_sha256(ds[i] for i in idx)}
    warm = {}
    for build in builds_of(args):
        choice_file = warm_names(out, build)[2]
        if choice_file.is_file():
            choice = json.loads(choice_file.read_text())
            folder = Path(warm_checkpoint(out, choice))
            if folder.is_dir():
                warm[str(build)] = {"checkpoint": choice["checkpoint"], "policy_sha256": policy_sha256(folder)}
    code = provenance()
    return {"code": {k: code.get(k) for k in ("git_commit", "git_dirty", "package_version", "torch", "transformers", "machine")},
            "tools": tools, "data": data, "warm_starts": warm}


def tool_hash(entry: Mapping[str, Any]) -> str:
    """A tool build's hash in an identity block: its ``content_hash`` (records before it named the
    folder's plain ``sha256``)."""
    return entry.get("content_hash") or entry["sha256"]


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
    for mode in ("blank", "blank_policy", "shuffle"):
        k = key.replace("eval/", f"eval_{mode}/", 1)
        if k in last:
            row[f"{mode}_metric"] = last[k]
            row[f"{mode}_drop"] = last[key] - last[k]
    return row


def _summary(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    values = [r["metric"] for r in per_seed.values()]
    mean, sd, low, high = t_interval(values)
    out = {"seeds": len(values), "mean": mean, "sd": sd, "ci_low": low, "ci_high": high, "per_seed": per_seed}
    builds = {r.get("tool_build") for r in per_seed.values() if r.get("tool_build") is not None}
    if builds:
        out["tool_builds"] = len(builds)
    for field_ in ("distinct_answers", "greedy_tool_calls", "blank_drop", "blank_policy_drop", "shuffle_drop", "cpu_s"):
        vals = sorted(r[field_] for r in per_seed.values() if r.get(field_) is not None)
        if vals:
            out[f"{field_}_mean"] = sum(vals) / len(vals)
            out[f"{field_}_max"] = vals[-1]
            out[f"{field_}_min"] = vals[0]
            out[f"{field_}_median"] = (vals[(len(vals) - 1) // 2] + vals[len(vals) // 2]) / 2
    return out


def paired_difference(a: dict[int, float], b: dict[int, float], level: float = 0.95) -> dict[str, Any] | None:
    """``a - b`` seed by seed (the seeds both have: the same tool build, the same data order) with
    the t-interval of the mean difference; ``None`` with fewer than 2 shared seeds.

    >>> d = paired_difference({0: 0.9, 1: 0.8, 2: 0.85}, {0: 0.8, 1: 0.72, 2: 0.76})
    >>> round(d["difference"], 3), d["pairs"], d["beats"]
    (0.09, 3, True)
    >>> paired_difference({0: 0.9, 1: 0.8, 2: 0.85}, {0: 0.8, 1: 0.75, 2: 0.8})["beats"]  # 0.1, 0.05, 0.05
    False
    """
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    mean, _, low, high = t_interval([a[s] - b[s] for s in seeds], level)
    return {"difference": mean, "ci_low": low, "ci_high": high, "pairs": len(seeds), "beats": low > 0}


def compare(grpo: Mapping[int, float], baseline: Mapping[int, float]) -> dict[str, Any]:
    """GRPO's units against one baseline's (:func:`unit_values`: seeds, or tool builds when seeds
    share them): Welch's interval, and the paired one where the units pair up (a trained baseline,
    or the warm starts, on the same builds); the paired one, when there is one, decides ``beats``
    (it removes the tool build's share of the spread, which both rows have)."""
    out = welch_difference(list(grpo.values()), list(baseline.values()))
    paired = paired_difference(dict(grpo), dict(baseline)) if len(baseline) > 1 else None
    if paired is not None:
        out["paired"] = paired
        out["beats"] = paired["beats"]
    return out


TOOK_OFF_CALL_RATE = 0.5
"""A GRPO seed took off when at least this share of its last step's rollouts called a tool..."""


def answer_bound(rows: Mapping[str, Any], n: int) -> float | None:
    """... and its held-out figure is above the best answer baseline's upper 95% bound: the mean plus
    1.96 binomial standard errors over ``n`` questions (for scores in [0, 1] the variance is at most
    m (1 - m), so this bounds ARMed Avg too). ``None`` without answer baselines.

    >>> round(answer_bound({"constant": {"mean": 0.5}, "question_prior": {"mean": 0.515}}, 200), 3)
    0.584
    """
    means = [rows[b]["mean"] for b in ANSWER_BASELINES if b in rows]
    if not means:
        return None
    m = max(means)
    return m + 1.96 * math.sqrt(max(m * (1 - m), 0.0) / max(1, n))


def took_off(seed_row: Mapping[str, Any], bound: float | None) -> bool:
    """Sampled tool calls on at least :data:`TOOK_OFF_CALL_RATE` of the last step's rollouts, and the
    final held-out figure above ``bound`` (:func:`answer_bound`; not checked when there is none).

    >>> took_off({"sampled_call_rate_last": 0.9, "metric": 0.88}, 0.58), took_off({"sampled_call_rate_last": 0.02, "metric": 0.5}, 0.58)
    (True, False)
    """
    rate = seed_row.get("sampled_call_rate_last")
    return bool(rate is not None and rate >= TOOK_OFF_CALL_RATE and (bound is None or seed_row["metric"] > bound))


def report(args: Args, out: Path) -> dict[str, Any]:
    """The protocol's figures, recomputed from the run files in ``out`` (nothing is written)."""
    key = metric_key(args.answer_types)
    runs = {r["name"]: r for r in read_jsonl(out / "runs.jsonl") if r["rc"] == 0}
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
            row["tool_build"] = build_of(args, seed) if trained_tools(args) or args.tool_builds <= 0 else None
            if name in ("grpo", "rft"):  # trained on its own samples: did they call?
                sampled = [r["tools/calls_per_episode"] for r in metrics if "tools/calls_per_episode" in r and r["step"] > 0]
                row["sampled_tool_calls_first"] = sampled[0] if sampled else None
                row["sampled_tool_calls_last5"] = sum(sampled[-5:]) / len(sampled[-5:]) if sampled else None
                # the share of the last step's rollouts that called a tool (records before issue 42: calls per
                # episode, the same at one tool turn)
                rate = [r.get("rollout/call_rate", r.get("tools/calls_per_episode")) for r in metrics if r["step"] > 0
                        and isinstance(r.get("rollout/call_rate", r.get("tools/calls_per_episode")), (int, float))]
                row["sampled_call_rate_last"] = rate[-1] if rate else None
            per_seed[seed] = row
        if per_seed:
            rows[name] = _summary(per_seed)
    warm, warm_rows = {}, {}
    for build in builds_of(args):
        _, test_name, choice_file = warm_names(out, build)
        if not choice_file.is_file():
            continue
        warm[build] = json.loads(choice_file.read_text())
        warm_test = json.loads((out / test_name / "eval.json").read_text())["metrics"]
        warm_rows[build] = {**final_eval([{"step": warm[build]["chosen_step"], **warm_test}], key),
                            "cpu_s": runs.get(warm_names(out, build)[0], {}).get("cpu_s")}
    if warm_rows:
        rows["warm_start"] = _summary(warm_rows)  # one warm start per tool build
    answers = json.loads((out / "answer_baselines.json").read_text()) if (out / "answer_baselines.json").is_file() else {}
    for name in ANSWER_BASELINES:
        if name in answers:
            m = answers[name]
            rows[name] = {"seeds": 1, "mean": m[key], "per_seed": {0: {"metric": m[key],
                          "distinct_answers": m.get("eval/distinct_answers"), "greedy_tool_calls": 0.0}}}
            if name == "constant":
                rows[name]["answer"] = m["answer"]
    if "grpo" in rows:  # did each seed take off? (issue 42's rule)
        bound = answer_bound(rows, args.eval_size)
        for r in rows["grpo"]["per_seed"].values():
            r["took_off"] = took_off(r, bound)
        rows["grpo"]["took_off_seeds"] = sum(r["took_off"] for r in rows["grpo"]["per_seed"].values())
        rows["grpo"]["answer_bound"] = bound
    comparisons: dict[str, Any] = {}
    by_seed: dict[str, Any] = {}
    unit = "seed" if independent(args) else "tool build"
    for name, row in rows.items():  # the units of every row with more than one value
        if name not in ANSWER_BASELINES and name != "warm_start" and row["seeds"] > 1:
            row["unit"] = unit
            if unit != "seed":
                values = unit_values(args, {s: r["metric"] for s, r in row["per_seed"].items()})
                mean, sd, low, high = t_interval(list(values.values()))
                row["by_build"] = {"builds": len(values), "values": values, "mean": mean, "sd": sd,
                                   "ci_low": low, "ci_high": high}
    if "grpo" in rows:
        grpo_units = unit_values(args, {s: r["metric"] for s, r in rows["grpo"]["per_seed"].items()})
        for name, row in rows.items():
            if name == "grpo":
                continue
            if name == "warm_start":  # one value per warm start, each once
                seeds = rows["grpo"]["per_seed"]
                other = ({s: warm_rows[build_of(args, s)]["metric"] for s in seeds if build_of(args, s) in warm_rows}
                         if unit == "seed" else {b: r["metric"] for b, r in warm_rows.items()})
            elif name in ANSWER_BASELINES:
                other = {0: row["mean"]}
            else:
                other = unit_values(args, {s: r["metric"] for s, r in row["per_seed"].items()})
            comparisons[name] = {**compare(grpo_units, other), "unit": unit, "units": len(grpo_units)}
            if unit != "seed":  # seed against seed as records before issue 42 reported it: not independent
                per_seed = ({s: warm_rows[build_of(args, s)]["metric"] for s in rows["grpo"]["per_seed"]
                             if build_of(args, s) in warm_rows} if name == "warm_start" else
                            {s: r["metric"] for s, r in row["per_seed"].items()})
                by_seed[name] = compare({s: r["metric"] for s, r in rows["grpo"]["per_seed"].items()}, per_seed)
    recorded_args = {k: v for k, v in asdict(args).items() if k not in ("out", "export")}  # no machine's paths
    kl = json.loads((out / "kl_choice.json").read_text()) if (out / "kl_choice.json").is_file() else None
    return {"args": recorded_args, "metric": key, **({"kl_choice": kl} if kl else {}),
            "warm_start": warm.get(0) or next(iter(warm.values()), {}),
            "warm_starts": warm, "tool_builds": len(builds_of(args)) if trained_tools(args) else 0, "rows": rows,
            "unit": unit, "grpo_minus": comparisons, **({"grpo_minus_by_seed": by_seed} if by_seed else {}),
            "beats_every_baseline": bool(comparisons) and all(c["beats"] for c in comparisons.values())}


def recorded_args(saved: dict[str, Any], out: Path) -> Args:
    """The :class:`Args` a ``protocol.json`` was made with, reading its run files from ``out`` (a
    protocol recorded before tool builds ran every seed on one build)."""
    known = {f for f in Args.__dataclass_fields__}
    # settings added later: what the recorded runs had (one build, no format penalty, no probe, KL 0.01)
    before = {"tool_builds": 1, "format_penalty": 0.0, "probe_samples": 0, "kl_coef": 0.01, "kl_candidates": ""}
    return Args(**{**before, **{k: v for k, v in saved.items() if k in known}, "out": str(out)})


def write_report(out: Path, result: dict[str, Any]) -> Path:
    path = out / "protocol.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return path


GZIPPED = ("heldout_answers.jsonl", "eval.answers.jsonl")  # every held-out answer: large, very repetitive


def export(out: Path, dest: Path, only: str = "") -> None:
    """Copy what a reader needs (no weights): each run's args, metrics and held-out answers (the
    answer files gzipped, ~60x smaller), the warm-start choices, the runs' CPU seconds, the answer
    baselines, the tools' outputs and the report -- with every path of this machine made relative
    (to the protocol folder, the repository, or ``$MEDVQA_CACHE``). ``only``: the files and runs
    whose names start with it (``runs.jsonl``: their lines), e.g. ``kl`` for the KL choice alone."""
    import gzip

    dest.mkdir(parents=True, exist_ok=True)
    top = [p for p in out.iterdir() if p.is_file() and (p.name in ("protocol.json", "runs.jsonl", "answer_baselines.json")
                                                         or p.name.startswith(("warm_start", "tool_outputs", "kl_choice", "lever_disagreements", "lever_train_disagreements")))
           and (p.name.startswith(only) or p.name == "runs.jsonl")]
    for path in top:
        text = path.read_text()
        if only and path.name == "runs.jsonl":
            text = "".join(line + "\n" for line in text.splitlines() if json.loads(line)["name"].startswith(only))
        (dest / path.name).write_text(relative_paths(text, out))
    for folder in sorted(p for p in out.iterdir() if (p.is_dir() and (p / "DONE").is_file() or p.name == "answer_baselines")
                         and p.name.startswith(only)):
        target = dest / folder.name
        target.mkdir(exist_ok=True)
        for f in (*RUN_FILES, "DONE", "eval.json", "eval.answers.jsonl"):
            if not (folder / f).is_file():
                continue
            text = relative_paths((folder / f).read_text(), out)
            if f in GZIPPED:  # mtime=0: the same answers give the same bytes
                (target / f"{f}.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
            else:
                (target / f).write_text(text)
    print(f"[protocol] exported run files to {dest}")


def relative_paths(text: str, out: Path) -> str:
    """``text`` with this machine's absolute paths replaced: the protocol folder by nothing (paths
    relative to it), the repository by nothing (relative to it), the tool cache by ``$MEDVQA_CACHE``.

    >>> relative_paths('{"policy": "/w/runs/p/warm_sft/x", "m": "/w/repo/a"}', Path("/w/runs/p"))[:30]
    '{"policy": "warm_sft/x", "m": '
    """
    from medvqa_env.provenance import REPO_ROOT
    from tool_backends.finetune.cache import cache_root

    for prefix, by in ((out.resolve(), ""), (out.absolute(), ""), (cache_root().parent, "$MEDVQA_CACHE/"),
                       (REPO_ROOT, "")):
        text = text.replace(f"{prefix}/", by).replace(f'"{prefix}"', '"."')
    return text


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
    needs_warm = ("grpo" in stages or ("kl" in stages and kl_candidates(args))
                  or ("baselines" in stages and any(b in baselines for b in FROM_WARM_START)))
    warm: dict[int, dict[str, Any]] = {}
    for build in builds_of(args):
        if "warm" in stages:
            warm[build] = warm_start(args, out, build)
        elif needs_warm:
            warm[build] = json.loads(warm_names(out, build)[2].read_text())
    if "kl" in stages and kl_candidates(args):
        kl_choice(args, out, warm)
    args = chosen_kl(args, out)  # every reward-trained run below: the KL val chose
    if "grpo" in stages:
        grpo_runs(args, out, warm)
    if "baselines" in stages:
        for name in TRAINED_BASELINES:
            if name in baselines:
                for seed in seeds_of(args):
                    sft_baseline(args, out, name, seed, warm)
        if any(b in baselines for b in ANSWER_BASELINES):
            answer_baselines(args, out)
    if "report" not in stages and "kl" in stages and args.export:  # the KL choice alone, exported
        export(out, Path(args.export), only="kl")
    if "report" in stages:
        result = report(args, out)
        if "grpo" not in result["rows"]:  # nothing to compare: a report of baselines alone is no result
            print(f"[protocol] no finished GRPO run under {out}: nothing to report", file=sys.stderr)
            return 1
        for build in builds_of(args):
            tool_outputs(args, out, build)
        result["identity"] = identity(args, out)
        write_report(out, result)
        for name, row in result["rows"].items():
            sd = f" ± {row['sd']:.3f} (sample SD)" if row.get("sd") == row.get("sd") and "sd" in row else ""
            print(f"[protocol] {name:15s} {result['metric']} {row['mean']:.3f}{sd} over {row['seeds']} seed(s)")
        grpo = result["rows"]["grpo"]
        print(f"[protocol] GRPO seeds that took off: {grpo.get('took_off_seeds')} of {grpo['seeds']} (sampled calls on >= "
              f"{TOOK_OFF_CALL_RATE:.0%} of the last step's rollouts, above the answer baselines' bound)")
        print(f"[protocol] GRPO beats every baseline: {result['beats_every_baseline']} (units: {result['unit']}s)")
        if result["identity"]["code"]["git_dirty"]:
            print("[protocol] warning: the code has uncommitted changes: this report names no commit that made it",
                  file=sys.stderr)
        if args.export:
            export(out, Path(args.export))
    return 0


if __name__ == "__main__":
    from train.common import parse_args

    _args = parse_args(Args, prog="python -m train.protocol")
    sys.exit(run_cli("python -m train.protocol", lambda: main(_args)))
