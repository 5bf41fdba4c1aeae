"""The learning protocol's "verl" row: its task through verl's own trainer, re-derived from the run files.

``benchmarks/runs/protocol/<setting>_verl/run.sh`` ran verl's trainer (vLLM-CPU rollout, FSDP
actor) from the native protocol's val-chosen warm start, one run per seed, and kept per seed verl's
``metrics.jsonl``, every episode the env played (``episodes/episodes.jsonl.gz``: training rollouts
and the greedy validation episodes on the protocol's held-out test questions, each with its answer)
and ``cpu.json`` (the CPU seconds of every process of the run, Ray's included). Nothing here trains:
:func:`verl_setting` recomputes each held-out accuracy from the stored answers (and fails if verl's
own metric says otherwise), counts distinct answers, greedy and sampled tool calls, and sums up the
seeds (mean, *sample* SD, 95% t-interval). ``bench_learning_protocol.py`` calls it for every
``*_verl`` folder and puts the row beside the native rows of the same setting.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

VAL_ACC = "val-core/medvqa/{dataset}/acc/mean@1"


def answers_file(path: Path) -> Path:
    """``path``, or ``path.gz`` where only that exists (``train.protocol.export`` gzips answer files)."""
    zipped = path.with_name(path.name + ".gz")
    return zipped if not path.is_file() and zipped.is_file() else path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    path = answers_file(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def verl_seed(folder: Path) -> dict[str, Any]:
    """One seed's figures; raises if verl's logged held-out accuracy disagrees with its stored answers."""
    from eval.answers import answer_diversity

    metrics = {r["step"]: r["data"] for r in read_jsonl(folder / "metrics.jsonl")}
    episodes = read_jsonl(folder / "episodes" / "episodes.jsonl.gz")
    val: dict[int, list[dict]] = defaultdict(list)
    sampled: dict[int, list[int]] = defaultdict(list)
    for e in episodes:
        if e["validate"]:
            val[int(e["global_steps"])].append(e)
        else:
            sampled[int(e["global_steps"])].append(int(e["num_tool_calls"]))
    curve = []
    for step in sorted(val):
        rows = val[step]
        acc = sum(bool(e["correct"]) for e in rows) / len(rows)
        logged = next((v for k, v in metrics.get(step, {}).items() if k.startswith("val-core/") and "/acc/" in k), None)
        if logged is None or abs(logged - acc) > 1e-3 or len({e["record_id"] for e in rows}) != len(rows):
            raise SystemExit(f"{folder}: step {step}: stored answers give accuracy {acc:.4f} over {len(rows)} "
                             f"episodes; verl's metrics.jsonl says {logged}")
        div = answer_diversity(e["answer"] for e in rows)
        curve.append({"step": step, "accuracy": acc, "questions": len(rows), "distinct": div["distinct"],
                      "top_answer": div["top_answer"], "top_share": div["top_share"], "entropy": div["entropy_bits"],
                      "greedy_tool_calls": sum(e["num_tool_calls"] for e in rows) / len(rows)})
    trained = sorted(s for s in sampled if s > 0)
    per_step = [sum(sampled[s]) / len(sampled[s]) for s in trained]
    cpu = json.loads((folder / "cpu.json").read_text())
    last = curve[-1]
    final = val[last["step"]]
    gold = answer_diversity(e["ground_truth"] for e in final)  # the best constant answer's accuracy
    # a yes/no answer that follows the tool: "yes" exactly when a call's observation brought boxes (an image)
    follows = sum((str(e["answer"]).strip().lower() == "yes") == any(c["new_images"] for c in e["tool_calls"])
                  for e in final) / len(final)
    return {"metric": last["accuracy"], "step": last["step"], "questions": last["questions"],
            "distinct_answers": last["distinct"], "answer_entropy": last["entropy"], "top_answer": last["top_answer"],
            "top_answer_share": last["top_share"], "greedy_tool_calls": last["greedy_tool_calls"],
            "constant_accuracy": gold["top_share"], "answers_follow_tool": follows,
            "start_accuracy": curve[0]["accuracy"], "best_accuracy": max(c["accuracy"] for c in curve),
            "start_greedy_tool_calls": curve[0]["greedy_tool_calls"],
            "trained_steps": len(trained), "episodes_per_step": len(sampled[trained[0]]) if trained else 0,
            "sampled_tool_calls_first": per_step[0] if per_step else None,
            "sampled_tool_calls_last5": sum(per_step[-5:]) / len(per_step[-5:]) if per_step else None,
            "sampled_tool_calls_max": max(per_step) if per_step else None,
            "cpu_s": cpu["cpu_s"], "wall_s": cpu["wall_s"], "curve": curve,
            "step_s": [d["timing_s/step"] for s, d in sorted(metrics.items()) if "timing_s/step" in d]}


def same_answers_as_native(folder: Path, native_answers: Path) -> tuple[int, int]:
    """How many of verl's step-0 held-out answers (the warm start, greedy, through vLLM) equal the
    native evaluation's of the same checkpoint on the same questions, out of how many."""
    native = {r["record_id"]: r["answer"] for r in read_jsonl(native_answers) if r.get("tag") is None}
    rows = [e for e in read_jsonl(folder / "episodes" / "episodes.jsonl.gz") if e["validate"] and e["global_steps"] == 0]
    return sum(native.get(e["record_id"]) == e["answer"] for e in rows), len(rows)


def final_agreement(folder: Path, native_answers: Path) -> tuple[int, int]:
    """On how many held-out questions a verl run's last evaluation and a native run's last evaluation
    gave the same answer, out of how many they share."""
    native_rows = [r for r in read_jsonl(native_answers) if r.get("tag") is None]
    last = max(r["step"] for r in native_rows)
    native = {r["record_id"]: r["answer"] for r in native_rows if r["step"] == last}
    val = [e for e in read_jsonl(folder / "episodes" / "episodes.jsonl.gz") if e["validate"]]
    final = max(e["global_steps"] for e in val)
    rows = [e for e in val if e["global_steps"] == final and e["record_id"] in native]
    return sum(native[e["record_id"]] == e["answer"] for e in rows), len(rows)


def warm_test_answers(native: Path, seed: int) -> Path:
    """The native test evaluation of seed ``seed``'s warm start: ``warm_test_b<seed mod builds>``
    in a record with tool builds, ``warm_test`` in one recorded before them."""
    record = native / "protocol.json"
    builds = json.loads(record.read_text()).get("args", {}).get("tool_builds") if record.is_file() else None
    if builds:
        return native / f"warm_test_b{seed % builds}" / "eval.answers.jsonl"
    return native / "warm_test" / "eval.answers.jsonl"


def native_grpo_by_seed(native: Path) -> dict[int, float]:
    """The native protocol's GRPO final held-out metric per seed (empty where it is not exported)."""
    record = native / "protocol.json"
    if not record.is_file():
        return {}
    per_seed = json.loads(record.read_text())["rows"].get("grpo", {}).get("per_seed", {})
    return {int(seed): float(row["metric"]) for seed, row in per_seed.items()}


def verl_setting(folder: Path) -> tuple[dict[str, Any], list[str], str]:
    """Figures (names relative to the setting, ``verl.*``), the native table's row cells and the
    per-seed Markdown table for one ``<setting>_verl`` folder. Where the native record of the
    setting is beside it, each verl seed is paired with the native seed of the same number (the
    same tool build and warm start), and the means are compared too (Welch 95% interval)."""
    from train.protocol import t_interval, welch_difference

    seeds = {int(p.name.split("_s")[-1]): verl_seed(p) for p in sorted(folder.glob("verl_s*"))
             if (p / "cpu.json").is_file() and (p / "metrics.jsonl").is_file()}
    if not seeds:
        raise SystemExit(f"no finished verl runs (verl_s*/cpu.json) under {folder}")
    values = [r["metric"] for r in seeds.values()]
    mean, sd, low, high = t_interval(values)
    fig: dict[str, Any] = {"verl.seeds": len(seeds), "verl.mean": mean, "verl.sd": sd, "verl.ci_low": low,
                           "verl.ci_high": high}
    for name in ("distinct_answers", "greedy_tool_calls", "sampled_tool_calls_first", "sampled_tool_calls_last5",
                 "start_accuracy", "start_greedy_tool_calls", "trained_steps", "questions", "episodes_per_step", "constant_accuracy",
                 "top_answer_share", "answers_follow_tool"):
        vals = [r[name] for r in seeds.values()]
        fig[f"verl.{name}.mean"] = sum(vals) / len(vals)
        fig[f"verl.{name}.min"], fig[f"verl.{name}.max"] = min(vals), max(vals)
    cpu_min = [r["cpu_s"] / 60 for r in seeds.values()]
    wall_min = [r["wall_s"] / 60 for r in seeds.values()]
    step_s = [s for r in seeds.values() for s in r["step_s"]]
    fig.update({"verl.cpu_min.mean": sum(cpu_min) / len(cpu_min), "verl.cpu_min.max": max(cpu_min),
                "verl.wall_min.max": max(wall_min), "verl.step_s.min": min(step_s), "verl.step_s.max": max(step_s),
                "verl.step_s.median": sorted(step_s)[len(step_s) // 2]})
    for seed, r in seeds.items():
        for name in ("metric", "distinct_answers", "greedy_tool_calls", "sampled_tool_calls_first",
                     "sampled_tool_calls_last5", "start_accuracy", "best_accuracy", "top_answer", "top_answer_share"):
            fig[f"verl.s{seed}.{name}"] = r[name]
        fig[f"verl.s{seed}.cpu_min"] = r["cpu_s"] / 60
    widened = [json.loads(p.read_text()) for p in sorted(folder.glob("medvqa_widened*.json"))]  # one, or one a build
    if widened:  # the warm starts as vLLM-CPU serves them: the same logits?
        fig["verl.widened.max_logit_difference"] = max(w["max_logit_difference"] for w in widened)
        fig["verl.widened.positions"] = min(w["positions_compared"] for w in widened)
        fig["verl.widened.checkpoints"] = len(widened)
    native = folder.parent / folder.name.removesuffix("_verl")
    agree = [final_agreement(folder / f"verl_s{seed}", native / f"grpo_s{seed}" / "heldout_answers.jsonl")
             for seed in seeds if answers_file(native / f"grpo_s{seed}" / "heldout_answers.jsonl").is_file()]
    if agree:  # verl's seed k and the native seed k: the same final answer on how many held-out questions
        fig["verl.final_same_as_native.min"] = min(a for a, _ in agree)
        fig["verl.final_same_as_native.max"] = max(a for a, _ in agree)
        fig["verl.final_same_as_native.questions"] = max(n for _, n in agree)
    same = [same_answers_as_native(folder / f"verl_s{seed}", warm) for seed in seeds
            if answers_file(warm := warm_test_answers(native, seed)).is_file()]
    if same:  # each seed's step 0 against the native evaluation of its own warm start
        fig["verl.step0_same_answers"], fig["verl.step0_questions"] = min(s for s, _ in same), max(n for _, n in same)
    native_seeds = native_grpo_by_seed(native)
    paired = {seed: seeds[seed]["metric"] - native_seeds[seed] for seed in seeds if seed in native_seeds}
    for seed, difference in paired.items():  # seed k of both ran on tool build k mod builds: a paired comparison
        fig[f"verl.s{seed}.native_metric"], fig[f"verl.s{seed}.minus_native"] = native_seeds[seed], difference
    if paired:
        fig["verl_minus_grpo_paired.seeds"] = len(paired)
        fig["verl_minus_grpo_paired.mean"] = sum(paired.values()) / len(paired)
        fig["verl_minus_grpo_paired.min"], fig["verl_minus_grpo_paired.max"] = min(paired.values()), max(paired.values())
    if len(native_seeds) > 1 and len(values) > 1:
        diff = welch_difference(values, list(native_seeds.values()))
        for k in ("difference", "ci_low", "ci_high"):
            fig[f"verl_minus_grpo.{k}"] = diff[k]
    spread = f"{mean:.3f} ± {sd:.3f} [{low:.3f}, {high:.3f}]" if len(values) > 1 else f"{mean:.3f}"
    per = ", ".join(f"{v:.3f}" for v in values) if len(values) > 1 else "–"
    cells = ["**GRPO through verl's trainer** (same warm start; vLLM-CPU rollout, FSDP actor)",
             f"{len(seeds)} of {len(native_seeds)}" if len(native_seeds) > len(seeds) else str(len(seeds)),
             spread, per, f"{fig['verl.distinct_answers.max']:.0f}", f"{fig['verl.greedy_tool_calls.mean']:.2f}",
             "–", "–", "–", f"{max(cpu_min):.1f}"]
    lines = ["| seed | held-out accuracy by evaluation step | native GRPO, same seed and tool build | distinct answers "
             "(most common, share) | greedy tool calls / ep | sampled tool calls / ep: step 1 -> last 5 steps | CPU min "
             "| wall min |",
             "|---:|---|---:|---|---:|---|---:|---:|"]
    for seed, r in seeds.items():
        curve = " -> ".join(f"{c['accuracy']:.3f}" for c in r["curve"])
        steps = "/".join(str(c["step"]) for c in r["curve"])
        native_cell = f"{native_seeds[seed]:.3f}" if seed in native_seeds else "–"
        lines.append(f"| {seed} | {curve} (steps {steps}) | {native_cell} | {r['distinct_answers']} ({r['top_answer']}, "
                     f"{r['top_answer_share']:.2f}) | {r['greedy_tool_calls']:.2f} | {r['sampled_tool_calls_first']:.2f}"
                     f" -> {r['sampled_tool_calls_last5']:.2f} | {r['cpu_s'] / 60:.1f} | {r['wall_s'] / 60:.1f} |")
    fig["verl.table"] = "\n".join(lines)
    return fig, cells, "\n".join(lines)
