"""Issue 46's levers on the CLOSED protocol task, each measured on val with and without (nothing on test).

GRPO from the protocol's own probe-chosen warm starts, seed k on build k, every setting the protocol's
(format penalty, KL, steps, groups), evaluated on the val split's first ``val_size`` CLOSED
questions. Each lever changes one thing:

* ``none``: the protocol's GRPO as it is (the "without");
* ``group16``: 16 rollouts per group instead of 8 (the same questions per step);
* ``steps60``: 60 steps instead of 30;
* ``guidance2``: 2 of each group's 8 rollouts are train.sft's gold demonstrations (LUFFY-like);
* ``bonus``: a reward bonus of 0.2 for a tool call paid only when the answer is right (DeepEyes);
* ``oversample4``: the train split's disagreement questions (found the same way, on train, from the
  seed's own build) drawn 4 times as often as the rest (``train.grpo --oversample``; the factor fixed
  in advance, not tuned).

Each run's val answers are stored; the figures are recomputed from them: val accuracy, accuracy on
the **disagreement questions** (val presence questions where the tool's two readings -- "a box
means yes" and "a box in the organ asked about means yes" -- disagree, found from the build's own
tool outputs when the runs were made and stored with them), and the paired difference of each
lever from ``none`` over the seeds.

    python benchmarks/bench_levers.py --run runs/protocol/closed    # train the levers (resumable), export, derive
    python benchmarks/bench_levers.py                               # derive from the committed run files
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
import sys
from dataclasses import replace
from pathlib import Path

from figures import ROOT, command_line, record, results_dir_arg

RUNS = ROOT / "benchmarks" / "runs" / "protocol" / "closed_independent_levers"
BONUS = json.dumps({"name": "rule+tools", "tool_shaping": {"bonus": 0.2, "redundancy_penalty": 0.0,
                                                           "grounding_weight": 0.0}})
LEVERS = {  # name -> (protocol settings changed, extra train.grpo flags)
    "none": ({}, []),
    "group16": ({"group_size": 16}, []),
    "steps60": ({"grpo_steps": 60}, []),
    "guidance2": ({}, ["--guidance", "2"]),
    "bonus": ({}, ["--reward", BONUS]),
    "oversample4": ({}, ["--oversample", "{run}/lever_train_disagreements_b{build}.json:4"]),
}
"""Extra flags may name ``{run}`` (the protocol folder) and ``{build}`` (the seed's tool build)."""


def train_levers(run: Path, levers: list[str], seeds: list[int], dest: Path) -> None:
    """Train every lever x seed in the protocol folder ``run`` (finished runs skipped), store each
    build's disagreement questions, and export the lever runs to ``dest``."""
    from bench_headroom import disagreements
    from train.protocol import build_of, export, recorded_args, reward_trained_run, warm_names

    saved = json.loads((run / "protocol_args.json").read_text())
    args = recorded_args(saved, run)
    warm = {build_of(args, s): json.loads(warm_names(run, build_of(args, s))[2].read_text()) for s in seeds}
    for seed in seeds:
        build = build_of(args, seed)
        for split, name in (("val", "lever_disagreements"), ("train", "lever_train_disagreements")):
            path = run / f"{name}_b{build}.json"
            if not path.is_file() and (split == "val" or any("{build}" in f for lv in levers for f in LEVERS[lv][1])):
                path.write_text(json.dumps(sorted(r.id for r in disagreements(args, build, split))) + "\n")
    for lever in levers:
        changed, extra = LEVERS[lever]
        for seed in seeds:
            flags = [f.replace("{run}", str(run)).replace("{build}", str(build_of(args, seed))) for f in extra]
            reward_trained_run(replace(args, **changed), run, f"lever_{lever}", "grpo", seed, warm,
                               split="val", extra=flags)
    export(run, dest, only="lever")


def val_answers(folder: Path) -> dict[str, bool]:
    """The last val evaluation of a run, from its stored answers: record id -> right."""
    from train.protocol import read_jsonl

    rows = [r for r in read_jsonl(folder / "heldout_answers.jsonl") if r["tag"] is None]
    last = max(r["step"] for r in rows)
    return {r["record_id"]: bool(r["correct"]) for r in rows if r["step"] == last}


def derive(runs: Path) -> tuple[dict, str]:
    """Figures and a table from exported lever runs."""
    from train.protocol import paired_difference, read_jsonl, t_interval

    folders = sorted(p for p in runs.iterdir() if p.is_dir() and p.name.startswith("lever_"))
    by_lever: dict[str, dict[int, dict]] = {}
    for folder in folders:
        lever, seed = folder.name.removeprefix("lever_").rsplit("_s", 1)
        args = json.loads((folder / "args.json").read_text())["args"]
        build = int(next(o.split("=")[1] for o in args["tool_opt"] if o.startswith("ground.seed=")))
        hard = set(json.loads((runs / f"lever_disagreements_b{build}.json").read_text()))
        right = val_answers(folder)
        metrics = read_jsonl(folder / "metrics.jsonl")
        rates = [r["rollout/call_rate"] for r in metrics if isinstance(r.get("rollout/call_rate"), (int, float))]
        on_hard = [right[i] for i in right if i in hard]
        by_lever.setdefault(lever, {})[int(seed)] = {
            "val": sum(right.values()) / len(right), "hard": sum(on_hard) / len(on_hard) if on_hard else float("nan"),
            "hard_questions": len(on_hard), "call_rate_last": rates[-1] if rates else None, "build": build,
            "right": right, "hard_ids": hard}
    fig: dict = {}
    lines = ["| lever | seeds | val accuracy, mean [95% CI] | − none, paired [95% CI] | accuracy on the disagreement "
             "questions | − none, paired [95% CI] | sampled call rate, last step |", "|---|---:|---|---|---|---|---:|"]
    base = by_lever.get("none", {})
    for lever in LEVERS:
        seeds = by_lever.get(lever)
        if not seeds:
            continue
        row = [lever, str(len(seeds))]
        for key in ("val", "hard"):
            values = [v[key] for v in seeds.values()]
            mean, _, low, high = t_interval(values)
            fig[f"{lever}.{key}.mean"] = mean
            fig[f"{lever}.{key}.per_seed"] = ", ".join(f"{v[key]:.3f}" for _, v in sorted(seeds.items()))
            row.append(f"{mean:.3f} [{low:.3f}, {high:.3f}]" if len(values) > 1 else f"{mean:.3f}")
            diff = (paired_difference({s: v[key] for s, v in seeds.items()}, {s: v[key] for s, v in base.items()})
                    if lever != "none" else None)
            if diff:
                for k in ("difference", "ci_low", "ci_high"):
                    fig[f"{lever}.{key}.minus_none.{k}"] = diff[k]
                row.append(f"{diff['difference']:+.3f} [{diff['ci_low']:+.3f}, {diff['ci_high']:+.3f}]")
            else:
                row.append("–")
        if lever != "none":  # answers turned right / wrong against none, per seed: reading the organ would gain on the
            for part in ("hard", "easy"):  # disagreement questions and lose nothing elsewhere; a shift of prior loses there
                gained, lost = [], []
                for s, v in sorted(seeds.items()):
                    if s not in base:
                        continue
                    was = base[s]["right"]
                    ids = [i for i in v["right"] if i in was and ((i in v["hard_ids"]) == (part == "hard"))]
                    gained.append(sum(v["right"][i] and not was[i] for i in ids))
                    lost.append(sum(was[i] and not v["right"][i] for i in ids))
                fig[f"{lever}.{part}.turned_right_per_seed"] = ", ".join(map(str, gained))
                fig[f"{lever}.{part}.turned_wrong_per_seed"] = ", ".join(map(str, lost))
        rates = [v["call_rate_last"] for v in seeds.values() if v["call_rate_last"] is not None]
        fig[f"{lever}.call_rate_last"] = sum(rates) / len(rates) if rates else None
        fig[f"{lever}.seeds"] = len(seeds)
        row.append(f"{fig[f'{lever}.call_rate_last']:.2f}" if rates else "–")
        lines.append("| " + " | ".join(row) + " |")
    hard_counts = sorted({v["hard_questions"] for seeds in by_lever.values() for v in seeds.values()})
    fig["hard_questions_min"], fig["hard_questions_max"] = hard_counts[0], hard_counts[-1]
    fig["table"] = "\n".join(lines)
    return fig, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="", help="a train.protocol CLOSED folder with its checkpoints: train the levers there first")
    ap.add_argument("--levers", default=",".join(LEVERS), help="comma list of levers to train")
    ap.add_argument("--seeds", default="0,1,2", help="seeds (seed k on the protocol's build k)")
    ap.add_argument("--quick", action="store_true", help="print only, keep nothing")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    a = ap.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if a.run:
        train_levers(Path(a.run), [x for x in a.levers.split(",") if x], [int(s) for s in a.seeds.split(",")], RUNS)
    if not RUNS.is_dir():
        print(f"no lever runs under {RUNS}: python benchmarks/bench_levers.py --run runs/protocol/closed", file=sys.stderr)
        return 1
    fig, table = derive(RUNS)
    kl = RUNS.parent / "closed_independent_kl"  # the same GRPO on val, run before by the protocol's kl stage
    if (kl / "kl_choice.json").is_file() and (RUNS / "lever_none_s0").is_dir():
        chosen = json.loads((kl / "kl_choice.json").read_text())["chosen"]
        again, first = val_answers(RUNS / "lever_none_s0"), val_answers(kl / f"kl_val_{chosen:g}_s0")
        fig["none_s0.same_as_kl_run"] = sum(first.get(i) == v for i, v in again.items())
        fig["none_s0.questions"] = len(again)
    lines = ["## Issue 46's levers on the CLOSED task, measured on val (from the committed run files)", "",
             "GRPO from the protocol's warm starts, one lever changed at a time; val accuracy and accuracy on the "
             "disagreement questions, recomputed from the stored val answers.", "", table, ""]
    record("levers", "\n".join(lines), fig, command_line("bench_levers.py", argv), results_dir_arg(a.quick, a.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
