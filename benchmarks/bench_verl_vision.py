"""verl's trainer with the vision policy on CPU: the figures ``docs/verl.md`` quotes, read from the
committed run files (``benchmarks/runs/verl_cpu/vision/``).

Nothing trains here, as in ``bench_learning.py``: the runs are the two of the CI test
``tests/train/test_verl_trainer_cpu.py`` (a prompted-zoom run on OPEN questions with ARMed, and a run
where the tiny Qwen2-VL writes its own tool calls on CLOSED ones), kept by
``benchmarks/runs/verl_cpu/vision/run.sh`` with verl's ``metrics.jsonl``, the env's episode log and
the vision trace (``train/verl_integration/vision_trace.py``: the pixel digests each vision tower
read, in vLLM and in verl's FSDP actor). This script turns them into named figures
(``benchmarks/results/verl_vision.json``) so that ``tests/test_doc_figures.py`` catches drift.

    python benchmarks/bench_verl_vision.py            # derive, print, keep in benchmarks/results/
    python benchmarks/bench_verl_vision.py --quick    # derive and print only (run_all's smoke run)
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
import re
from pathlib import Path

from figures import ROOT, command_line, record, results_dir_arg

RUNS = ROOT / "benchmarks" / "runs" / "verl_cpu" / "vision"
KINDS = {"scripted": "prompted zoom, OPEN, ARMed", "own_calls": "the policy's own, CLOSED, rule reward"}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_figures(run: Path) -> dict[str, float | int]:
    """One run: steps, updates (grad norm, KL), the rollout/actor probability gap, step times; the
    images the env handed out and those each vision tower read (pixel digests), image tokens per
    trajectory; the tool calls (prompted or the policy's own, successful, returning an image) per
    step; the rollout's vision-tower weight versions; the sampled mean score."""
    data = {r["step"]: r["data"] for r in read_jsonl(run / "metrics.jsonl")}
    eps = [e for p in sorted((run / "episodes").glob("*.jsonl")) for e in read_jsonl(p) if not e["validate"]]
    trace = [r for p in sorted((run / "vision").glob("*.jsonl")) for r in read_jsonl(p)]
    if not data or not eps or not trace:
        raise SystemExit(f"{run}: expected metrics.jsonl, episodes/ and vision/ from run.sh")
    f: dict[str, float | int] = {"steps": max(data), "episodes": len(eps), "episodes_per_step": len(eps) // max(data)}
    grad = [v["actor/grad_norm"] for v in data.values()]
    f["grad_norm.min"], f["grad_norm.max"] = min(grad), max(grad)
    f["kl_loss.last"] = data[max(data)]["actor/kl_loss"]
    # vLLM's sampling probability vs the FSDP actor's for the same token, per token over a step
    f["probs_diff.max"] = max(v["training/rollout_probs_diff_max"] for v in data.values())
    f["probs_diff.mean_max"] = max(v["training/rollout_probs_diff_mean"] for v in data.values())
    f["log_ppl_diff.abs_max"] = max(abs(v["rollout_corr/log_ppl_diff"]) for v in data.values())
    step_s = [v["timing_s/step"] for v in data.values()]
    f["step_s.min"], f["step_s.max"] = min(step_s), max(step_s)
    env_images = {s for e in eps for s in e["image_sha1"]}
    rollout = {i["sha1"] for r in trace if r["side"] == "vllm" for i in r["images"]}
    actor = {i["sha1"] for r in trace if r["side"] == "hf" for i in r["images"]}
    f["images.env"], f["images.rollout"], f["images.actor"] = len(env_images), len(rollout), len(actor)
    f["images.all_three"] = len(env_images & rollout & actor)
    f["images.only_one_side"] = len((env_images | rollout | actor) - (env_images & rollout & actor))
    f["vision_calls.rollout"] = sum(r["side"] == "vllm" for r in trace)
    f["vision_calls.actor_update"] = sum(r["side"] == "hf" and r["grad"] for r in trace)
    f["vision_calls.actor_no_grad"] = sum(r["side"] == "hf" and not r["grad"] for r in trace)
    tokens = [e["num_image_tokens"] for e in eps]
    f["image_tokens.min"], f["image_tokens.max"] = min(tokens), max(tokens)
    f["images_per_episode.min"] = min(e["num_images"] for e in eps)
    f["images_per_episode.max"] = max(e["num_images"] for e in eps)
    calls = [c for e in eps for c in e["tool_calls"]]
    f["tool_calls"], f["tool_calls.ok"] = len(calls), sum(c["ok"] for c in calls)
    f["tool_calls.prompted"] = sum(c["scripted"] for c in calls)
    f["tool_calls.with_image"] = sum(c["ok"] and c["new_images"] > 0 for c in calls)
    for step in sorted(data):
        f[f"tool_calls.step{step}"] = sum(len(e["tool_calls"]) for e in eps if e["global_steps"] == step)
    versions: list[list[str]] = []
    for r in trace:
        if r["side"] == "vllm" and r.get("weights") and r["weights"] not in versions:
            versions.append(r["weights"])
    f["rollout_vision_weights.versions"] = len(versions)
    f["score.first"], f["score.last"] = data[min(data)]["critic/score/mean"], data[max(data)]["critic/score/mean"]
    return f


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="derive and print the figures, keep nothing (run_all's "
                    "smoke run)")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = ap.parse_args(argv)
    figures: dict = {"sft.steps": read_jsonl(RUNS / "sft" / "metrics.jsonl")[-1]["step"]}
    passed = re.search(r"(\d+) passed in ([\d.]+)s", (RUNS / "pytest.log").read_text())
    if passed is None:
        raise SystemExit(f"{RUNS / 'pytest.log'}: no 'N passed in S s' line (run.sh keeps pytest's output there)")
    figures["tests_passed"], figures["test_file_s"] = int(passed.group(1)), float(passed.group(2))
    rows = ["| run | steps x trajectories | tool calls: all (successful; prompted) | images: env / rollout's "
            "tower / actor's tower / all three | image tokens per trajectory | probability gap per token: "
            "mean (max) | step time |",
            "|---|---|---|---|---|---|---|"]
    for run, kind in KINDS.items():
        f = run_figures(RUNS / run)
        figures.update({f"{run}.{k}": v for k, v in f.items()})
        rows.append(f"| `{run}` ({kind}) | {f['steps']} x {f['episodes_per_step']} | {f['tool_calls']} "
                    f"({f['tool_calls.ok']}; {f['tool_calls.prompted']}) | {f['images.env']} / {f['images.rollout']}"
                    f" / {f['images.actor']} / {f['images.all_three']} | {f['image_tokens.min']}-"
                    f"{f['image_tokens.max']} | {f['probs_diff.mean_max']:.1e} ({f['probs_diff.max']:.1e}) | "
                    f"{f['step_s.min']:.0f}-{f['step_s.max']:.0f} s |")
    figures["table"] = "\n".join(rows)
    section = "\n".join([
        "## verl's trainer with the vision policy (from the committed run data)", "",
        "The CI test's two runs (`tests/train/test_verl_trainer_cpu.py`), kept by",
        "`benchmarks/runs/verl_cpu/vision/run.sh`; discussion in `docs/verl.md`.", "", *rows, ""])
    record("verl_vision", section, figures, command_line("bench_verl_vision.py", argv),
           results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
