"""The learning protocol's figures (issue 19), re-derived from its committed run files.

Nothing trains here. ``python -m train.protocol ... --export benchmarks/runs/protocol/<setting>``
made the runs and copied their small files (each run's ``args.json``, ``metrics.jsonl``,
``heldout_answers.jsonl``, the warm-start choice, the runs' CPU seconds, the answer baselines).
This script recomputes the protocol's report from those files (:func:`train.protocol.report`),
checks every final figure against the stored answers (the accuracy, the ARMed Avg and the number of
distinct answers of each run's last held-out evaluation are recomputed from its answer rows), and
records the figures (``benchmarks/results/learning_protocol.json``) and one table per setting, which
``docs/training.md`` and the README quote through generated markers.

    python benchmarks/bench_learning_protocol.py            # derive, check, keep in benchmarks/results/
    python benchmarks/bench_learning_protocol.py --quick    # derive and print only
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
import re
import sys
from pathlib import Path

from figures import ROOT, command_line, record, results_dir_arg

RUNS = ROOT / "benchmarks" / "runs" / "protocol"
ROWS = [  # (row name in protocol.json, what the table calls it)
    ("grpo", "**GRPO** from the val-chosen warm start"),
    ("warm_start", "warm start alone (SFT checkpoint chosen on val)"),
    ("more_sft", "more SFT: the warm start + as many SFT steps as GRPO took"),
    ("tool_sft", "tool SFT from scratch: every gold trajectory calls the tool, same total steps"),
    ("notool_sft", "no-tool SFT from scratch: no tools in the env, same total steps"),
    ("imperfect_sft", "imperfect-demonstration SFT from scratch: 0.25 answer without the tool, 0.25 of the callers misread it"),
    ("rft", "rejection-sampling FT from the warm start: GRPO's sampled episodes, SFT on the right ones"),
    ("question_prior", "question text only: most common training answer for the question"),
    ("constant", "best constant answer (chosen on the held-out questions)"),
]


def check_answers(folder: Path, key: str) -> dict[str, float]:
    """The last held-out evaluation of a run recomputed from its stored answers; raises if the
    metrics file says otherwise."""
    from eval.answers import answer_diversity
    from train.protocol import read_jsonl

    metrics = [r for r in read_jsonl(folder / "metrics.jsonl") if key in r]
    step = metrics[-1]["step"]
    rows = [r for r in read_jsonl(folder / "heldout_answers.jsonl") if r["step"] == step and r["tag"] is None]
    if key == "eval/accuracy":
        value = sum(bool(r["correct"]) for r in rows) / len(rows)
    else:
        scored = [r["open_metrics"] for r in rows if "open_metrics" in r]
        value = sum(sum(m.values()) / len(m) for m in scored) / len(scored)
    distinct = answer_diversity(r["answer"] for r in rows)["distinct"]
    if abs(value - metrics[-1][key]) > 1e-3 or distinct != metrics[-1]["eval/distinct_answers"]:
        raise SystemExit(f"{folder}: stored answers give {key} {value:.4f} and {distinct} distinct answers at step "
                         f"{step}; metrics.jsonl says {metrics[-1][key]:.4f} and {metrics[-1]['eval/distinct_answers']}")
    return {"questions": len(rows), "value": value, "distinct": distinct}


PRESENCE = re.compile(r"Is there a lesion in the (.+)\?")
FOUND_LABEL = re.compile(r"\(([^(),]+), score [0-9.]+\)")


def reading_rules(folder: Path, runs: list[str], args) -> dict[str, float]:
    """How the final policies read the tool on presence questions ("Is there a lesion in the X?"),
    from the stored answers and the tool's recorded outputs (``tool_outputs_b<build>.jsonl``: what
    each tool build said): the accuracy of two readings -- *any*: yes iff the tool found anything;
    *host*: yes iff a box names the organ asked about -- per build and averaged over the builds, and
    how often each run's answers agree with each reading of its own build's outputs."""
    from train.protocol import build_of, builds_of, read_jsonl, tool_outputs_path

    rules_of: dict[int, dict] = {}
    for build in builds_of(args):
        tool = {r["record_id"]: r for r in read_jsonl(tool_outputs_path(folder, build)) if PRESENCE.match(r["question"])}
        rules = {}
        for rid, r in tool.items():
            labels = FOUND_LABEL.findall(r["observation"])
            host = PRESENCE.match(r["question"]).group(1)
            rules[rid] = {"any": "yes" if labels else "no", "host": "yes" if f"{host} lesion" in labels else "no",
                          "gold": r["gold"]}
        if rules:
            rules_of[build] = rules
    if not rules_of:
        return {}
    fig: dict[str, float] = {"questions": len(next(iter(rules_of.values())))}
    for rule in ("any", "host"):
        per_build = {b: sum(v[rule] == v["gold"] for v in rules.values()) / len(rules) for b, rules in rules_of.items()}
        fig[f"{rule}.accuracy"] = sum(per_build.values()) / len(per_build)
        if len(per_build) > 1:
            fig.update({f"b{b}.{rule}.accuracy": acc for b, acc in per_build.items()})
    for run in runs:
        rules = rules_of.get(build_of(args, int(run.rsplit("_s", 1)[1])))
        if rules is None:
            continue
        metrics = [r for r in read_jsonl(folder / run / "metrics.jsonl") if "eval/accuracy" in r]
        last = metrics[-1]["step"]
        answers = {r["record_id"]: (r["answer"] or "").strip().lower()
                   for r in read_jsonl(folder / run / "heldout_answers.jsonl") if r["step"] == last and r["tag"] is None}
        for rule in ("any", "host"):
            fig[f"{run}.agrees_{rule}"] = sum(answers.get(rid) == v[rule] for rid, v in rules.items()) / len(rules)
    return fig


def ablation_answered(folder: Path, mode: str) -> float | None:
    """The share of a run's last held-out evaluation under the ablation ``mode`` that ended with an
    answer, from its stored answers (None where the run has no such evaluation). An ablated image can
    break a tiny policy's format as well as take away what it sees: a "drop" on episodes that never
    answered measures the first."""
    from train.protocol import read_jsonl

    rows = read_jsonl(folder / "heldout_answers.jsonl")
    steps = [r["step"] for r in rows if r["tag"] == mode]
    if not steps:
        return None
    last = [r for r in rows if r["tag"] == mode and r["step"] == max(steps)]
    return sum(r["answer"] is not None for r in last) / len(last)


def kl_figures(folder: Path, choice: dict) -> tuple[dict, str]:
    """The ``kl`` stage's choice (``kl_choice.json``), each candidate's val figure recomputed from its
    run's stored answers (``train.protocol.val_scores``) and checked against the record; a table."""
    from train.protocol import choose_kl, metric_key, read_jsonl, val_scores

    args = json.loads((folder / f"kl_val_{choice['chosen']:g}_s{choice['seed']}" / "args.json").read_text())["args"]
    key = metric_key(args.get("answer_types"))
    scores = {float(c): val_scores(folder / f"kl_val_{c}_s{choice['seed']}", key) for c in choice["val"]}
    again = choose_kl(scores, float(choice["default"]))
    if again["chosen"] != choice["chosen"] or again["val"] != choice["val"]:
        raise SystemExit(f"{folder}: the stored val answers give {again['val']} -> {again['chosen']}; "
                         f"kl_choice.json says {choice['val']} -> {choice['chosen']}")
    runs = {r["name"]: r for r in read_jsonl(folder / "runs.jsonl")}
    answers = []  # each candidate's final val answers: can the val set tell the candidates apart at all?
    for c in choice["val"]:
        rows = [r for r in read_jsonl(folder / f"kl_val_{c}_s{choice['seed']}" / "heldout_answers.jsonl") if r["tag"] is None]
        last = max(r["step"] for r in rows)
        answers.append({r["record_id"]: r["answer"] for r in rows if r["step"] == last})
    same = sum(all(a.get(rid) == answers[0][rid] for a in answers[1:]) for rid in answers[0])
    fig: dict = {"kl.same_answers": same, "kl.chosen": choice["chosen"], "kl.default": choice["default"], "kl.best": choice["best"],
                 "kl.seed": choice["seed"], "kl.tool_build": choice["tool_build"],
                 "kl.questions": min(choice["questions"].values())}
    lines = ["| GRPO KL coefficient | val " + ("accuracy" if key == "eval/accuracy" else "ARMed Avg")
             + " (seed " + str(choice["seed"]) + ", its warm start) | CPU min |", "|---:|---:|---:|"]
    for c, v in choice["val"].items():
        fig[f"kl.val.{c}"] = v
        cpu = runs.get(f"kl_val_{c}_s{choice['seed']}", {}).get("cpu_s")
        mark = " (chosen)" if float(c) == choice["chosen"] else ""
        lines.append(f"| {c}{mark} | {v:.3f} | {cpu / 60:.1f} |" if cpu else f"| {c}{mark} | {v:.3f} | – |")
    if choice.get("best_minus_default"):
        fig["kl.best_minus_default"] = choice["best_minus_default"]["difference"]
        fig["kl.best_minus_default_se"] = choice["best_minus_default"]["se"]
    fig["kl.table"] = "\n".join(lines)
    return fig, "\n".join(lines)


def _cell(row: dict, name: str, fmt: str = ".3f") -> str:
    v = row.get(name)
    return "–" if v is None else format(v, fmt)


def _drop_cell(fig: dict, name: str, mode: str) -> str:
    """A row's mean drop under an ablation, and the seeds whose ablated episodes mostly never answered."""
    cell = _cell(fig, f"{name}.{mode}_drop", "+.3f")
    if fig.get(f"{name}.{mode}_broken_seeds"):
        cell += f" (seeds {fig[f'{name}.{mode}_broken_which']}: no answer)"
    return cell


def setting(folder: Path) -> tuple[dict, str]:
    """Figures and the Markdown table of one protocol run folder."""
    from train.protocol import greedy_lead, recorded_args, report, tool_hash

    saved = json.loads((folder / "protocol.json").read_text())
    args = recorded_args(saved["args"], folder)
    result = report(args, folder)  # recomputed from the run files, not read back
    key = result["metric"]
    checked, questions = 0, set()
    for name in ("grpo", "more_sft", "tool_sft", "notool_sft", "imperfect_sft", "rft"):  # the last two: issue 46 on
        for seed in result["rows"].get(name, {}).get("per_seed", {}):
            questions.add(check_answers(folder / f"{name}_s{seed}", key)["questions"])
            checked += 1
    if len(questions) > 1:
        raise SystemExit(f"{folder}: the runs' last held-out evaluations hold different numbers of questions: {questions}")
    warm = result["warm_start"]
    val = {int(step): v for step, v in warm["val_by_step"].items()}  # JSON keys are strings
    fig: dict = {"metric": key, "beats_every_baseline": int(result["beats_every_baseline"]), "unit": result["unit"],
                 "checked_runs": checked, "questions": questions.pop() if questions else 0,
                 "tool_builds": result["tool_builds"], "warm_start.step": warm["chosen_step"],
                 "warm_start.val": val[warm["chosen_step"]],
                 "warm_start.val_steps": ", ".join(f"{s}: {v:.3f}" for s, v in sorted(val.items()))}
    for build, choice in sorted(result["warm_starts"].items()):
        if "candidates" in choice:  # chosen by what RL will use (issue 42): the record's own choice
            picked = {"chosen_step": choice["chosen_step"], "within_noise": choice["within_noise"]}
            fig[f"warm_start.b{build}.blind_step"] = choice["blind_choice"]["step"]
            probe = choice["candidates"][str(choice["chosen_step"])]  # the chosen candidate's val probe
            for k in ("forced", "sampled", "call_rate", "calling", "direct", "invalid_turn_rate"):
                if isinstance(probe.get(k), (int, float)):
                    fig[f"warm_start.b{build}.{k}"] = probe[k]
        else:  # chosen by greedy val accuracy before issue 42: recomputed from the val figures
            lead = greedy_lead({int(s): v for s, v in choice["val_by_step"].items()}, args.val_size)
            picked = {"chosen_step": lead["step"], "within_noise": lead["within_noise"]}
        fig[f"warm_start.b{build}.step"] = picked["chosen_step"]
        fig[f"warm_start.b{build}.within_noise"] = int(picked["within_noise"])
    fig["warm_start.within_noise_all"] = int(all(fig[f"warm_start.b{b}.within_noise"] for b in result["warm_starts"]))
    blind = [b for b in result["warm_starts"] if f"warm_start.b{b}.blind_step" in fig]
    if blind:  # builds whose greedy val accuracy would have chosen another step than the probe did
        fig["warm_start.blind_differs"] = sum(fig[f"warm_start.b{b}.blind_step"] != fig[f"warm_start.b{b}.step"]
                                              for b in blind)
        fig["warm_start.steps"] = ", ".join(f"b{b}: {fig[f'warm_start.b{b}.step']}" for b in sorted(blind))
        fig["warm_start.blind_steps"] = ", ".join(f"b{b}: {fig[f'warm_start.b{b}.blind_step']}" for b in sorted(blind))
    identity = saved.get("identity") or {}
    if identity:  # what the figures depend on, by content (recorded by the protocol's report stage)
        fig["identity.git_commit"] = identity["code"]["git_commit"]
        fig["identity.git_dirty"] = int(bool(identity["code"]["git_dirty"]))
        for name, builds in identity["tools"].items():
            for build, tool in builds.items():
                fig[f"identity.tools.{name}.b{build}"] = tool_hash(tool)[:12]
    lines = ["| run | seeds (tool builds) | held-out " + ("accuracy" if key == "eval/accuracy" else "ARMed Avg")
             + ": mean ± sample SD [95% CI] | per seed | distinct answers min / median / max | greedy tool calls / ep | "
             "drop, blank image (policy and tools) | drop, blank for the policy only | drop, shuffled image | "
             "CPU min / run |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, label in ROWS:
        row = result["rows"].get(name)
        if row is None:
            continue
        per = list(row["per_seed"].values())
        for k in ("mean", "sd", "ci_low", "ci_high", "seeds"):
            if k in row and row[k] == row[k]:  # one seed (or one build) has no SD: nothing is recorded
                fig[f"{name}.{k}"] = row[k]
        for k, v in (row.get("by_build") or {}).items():  # seeds sharing builds: one value per build
            if k != "values" and v == v:
                fig[f"{name}.by_build.{k}"] = v
        distinct = sorted(p.get("distinct_answers") or 0 for p in per)
        fig[f"{name}.distinct"] = distinct[-1]  # the most over seeds; min and median beside it
        fig[f"{name}.distinct_min"], fig[f"{name}.distinct_median"] = distinct[0], row.get(
            "distinct_answers_median", distinct[len(distinct) // 2])
        fig[f"{name}.constant_seeds"] = sum(d == 1 for d in distinct)  # seeds that end on one answer for every question
        fig[f"{name}.calls"] = sum(p.get("greedy_tool_calls") or 0 for p in per) / len(per)
        shares = [p["top_answer_share"] for p in per if p.get("top_answer_share") is not None]
        if shares:  # how much of the held-out set the most common answer takes (1.0: a constant)
            fig[f"{name}.top_share_max"] = max(shares)
        for mode in ("blank", "blank_policy", "shuffle"):
            drops = [p[f"{mode}_drop"] for p in per if p.get(f"{mode}_drop") is not None]
            if drops:
                fig[f"{name}.{mode}_drop"] = sum(drops) / len(drops)
            answered = {seed: ablation_answered(folder / f"{name}_s{seed}", mode) for seed in row["per_seed"]}
            answered = {seed: a for seed, a in answered.items() if a is not None}
            if answered:  # seeds whose ablated episodes mostly ended without an answer: the format broke
                broken = sorted(seed for seed, a in answered.items() if a < 0.5)
                fig[f"{name}.{mode}_answered_min"] = min(answered.values())
                fig[f"{name}.{mode}_broken_seeds"] = len(broken)
                fig[f"{name}.{mode}_broken_which"] = ", ".join(map(str, broken)) or "none"
                kept = [row["per_seed"][seed][f"{mode}_drop"] for seed in answered if seed not in broken
                        and row["per_seed"][seed].get(f"{mode}_drop") is not None]
                if kept:  # the drop over the seeds that still answered
                    fig[f"{name}.{mode}_drop_answered"] = sum(kept) / len(kept)
        cpu = [p["cpu_s"] for p in per if p.get("cpu_s")] or ([row["cpu_s"]] if row.get("cpu_s") else [])
        if cpu:
            fig[f"{name}.cpu_min_max"] = max(cpu) / 60
        if name == "grpo":
            fig["grpo.took_off_seeds"] = row.get("took_off_seeds")  # sampled calls >= 0.5 at the end, above the answers
            fig["grpo.answer_bound"] = row.get("answer_bound")
            fig["grpo.sampled_calls_first"] = sum(p["sampled_tool_calls_first"] for p in per) / len(per)
            fig["grpo.sampled_calls_last5"] = sum(p["sampled_tool_calls_last5"] for p in per) / len(per)
        if name == "constant":
            fig["constant.answer"] = row["answer"]
        spread = (f"{row['mean']:.3f} ± {row['sd']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
                  if row.get("sd") == row.get("sd") and "sd" in row else f"{row['mean']:.3f}")
        seeds = ", ".join(f"{p['metric']:.3f}" for p in per) if len(per) > 1 else "–"
        builds = f" ({row['tool_builds']})" if row.get("tool_builds") else ""
        lines.append(f"| {label} | {row['seeds']}{builds} | {spread} | {seeds} | "
                     f"{fig[f'{name}.distinct_min']:.0f} / {fig[f'{name}.distinct_median']:.0f} / {fig[f'{name}.distinct']:.0f} | "
                     f"{fig[f'{name}.calls']:.2f} | {_drop_cell(fig, name, 'blank')} | "
                     f"{_drop_cell(fig, name, 'blank_policy')} | "
                     f"{_drop_cell(fig, name, 'shuffle')} | {_cell(fig, f'{name}.cpu_min_max', '.1f')} |")
    # grpo_minus.*: seed against seed (as recorded before issue 42; where seeds share tool builds and warm
    # starts they are not independent); grpo_minus_units.*: the verdict's units (seeds, or one value per build)
    seed_level = result.get("grpo_minus_by_seed") or result["grpo_minus"]
    for prefix, comparisons in (("grpo_minus", seed_level), ("grpo_minus_units", result["grpo_minus"])):
        for name, diff in comparisons.items():
            for k in ("difference", "ci_low", "ci_high"):
                fig[f"{prefix}.{name}.{k}"] = diff[k]
            fig[f"{prefix}.{name}.beats"] = int(diff["beats"])
            if "paired" in diff:  # unit against unit: seed k against seed k, or build against build
                for k in ("difference", "ci_low", "ci_high", "pairs"):
                    fig[f"{prefix}.{name}.paired.{k}"] = diff["paired"][k]
    fig["units"] = next(iter(result["grpo_minus"].values()), {}).get("units")  # how many independent units
    grpo, tool = result["rows"].get("grpo", {}), result["rows"].get("tool_sft", {})
    if grpo.get("sd") == grpo.get("sd") and tool.get("sd") == tool.get("sd") and "sd" in grpo and "sd" in tool:
        # issue 42's bar: GRPO's SD over seeds at most twice tool SFT's, or 0.02, whichever is larger
        fig["grpo.sd_bound"] = max(2 * tool["sd"], 0.02)
        fig["grpo.sd_within_bound"] = int(grpo["sd"] <= fig["grpo.sd_bound"])
    if grpo.get("took_off_seeds") is not None:
        fig["grpo.all_took_off"] = int(grpo["took_off_seeds"] == grpo["seeds"])
    read_by = {name: [f"{name}_s{seed}" for seed in result["rows"].get(name, {}).get("per_seed", {})]
               for name in ("grpo", "tool_sft")}  # the rows whose policies call the tool
    reading = reading_rules(folder, [run for runs in read_by.values() for run in runs], args)
    fig.update({f"reading.{k}": v for k, v in reading.items()})
    for name, runs in read_by.items():
        if not (reading and runs):
            continue
        for rule in ("any", "host"):
            agree = [reading[f"{run}.agrees_{rule}"] for run in runs]
            fig[f"reading.{name}.agrees_{rule}_min"], fig[f"reading.{name}.agrees_{rule}_max"] = min(agree), max(agree)
    fig["table"] = "\n".join(lines)
    return fig, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="derive and print the figures, keep nothing")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = ap.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from learning_protocol_verl import verl_setting

    folders = sorted(p.parent for p in RUNS.glob("*/protocol.json"))
    verl_runs = {p.name.removesuffix("_verl"): p for p in sorted(RUNS.glob("*_verl")) if any(p.glob("verl_s*/cpu.json"))}
    if not folders and not verl_runs:
        print(f"no protocol runs under {RUNS}: run python -m train.protocol ... --export {RUNS}/<setting>",
              file=sys.stderr)
        return 1
    figures: dict = {}
    sections = ["## Learning protocol (from the committed run files)", "",
                "Each table: `python -m train.protocol` (docs/training.md), re-derived from the run files and "
                "checked against the stored held-out answers.", ""]
    for folder in folders:
        fig, table = setting(folder)
        if folder.name in verl_runs:  # the same task through verl's trainer: one more row (learning_protocol_verl)
            verl_fig, cells, _ = verl_setting(verl_runs.pop(folder.name))
            fig.update(verl_fig)
            table = fig["table"] = table + "\n| " + " | ".join(cells) + " |"
        figures.update({f"{folder.name}.{k}": v for k, v in fig.items()})
        sections += [f"### {folder.name}", "", table, ""]
    for folder in sorted(p.parent for p in RUNS.glob("*/kl_choice.json")):  # the KL chosen on val (issue 42)
        fig, table = kl_figures(folder, json.loads((folder / "kl_choice.json").read_text()))
        figures.update({f"{folder.name}.{k}": v for k, v in fig.items()})
        sections += [f"### {folder.name}: the GRPO KL coefficient chosen on val", "", table, ""]
    for name, folder in verl_runs.items():  # verl's runs of a setting whose native runs are not exported yet
        fig, _, table = verl_setting(folder)
        figures.update({f"{name}.{k}": v for k, v in fig.items()})
        sections += [f"### {name}: verl's trainer only", "", table, ""]
    record("learning_protocol", "\n".join(sections), figures, command_line("bench_learning_protocol.py", argv),
           results_dir_arg(args.quick, args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
