"""VQA-RAD test-split baselines: the two tables of ``docs/evaluation.md`` ("Results on VQA-RAD"), from real runs.

Runs each baseline with ``python -m eval.run`` on VQA-RAD's test split into a temporary folder -- the
oracle (reads the answer), the answer prior fitted on the train split, zoom-then-answer, random, the
harness's scripted seeded guesser with K = 4, and SmolLM2-135M-Instruct behind the project's
OpenAI-compatible server (``agents/openai_server.py``, offline, first 12 questions, also its judge) --
then puts them side by side with ``python -m eval.compare --ci --detail`` (the checkpoint-selection
view and the OPEN-metrics view). A last short run scores 8 ``prior`` predictions with the SmolLM2
judge (what a too-small judge does). The tables' Markdown and the headline figures are kept in
``benchmarks/results/vqarad_baselines.{md,json}``; ``docs/evaluation.md`` quotes them.

Without VQA-RAD under ``--root`` (``qa.jsonl``) it says so and exits 1, writing nothing.

    python benchmarks/bench_vqarad_baselines.py [--root ../shared/data/vqa_rad] [--no-smollm2] [--quick]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

DEFAULT_ROOT = "../shared/data/vqa_rad"
SMOL_QUESTIONS = 12  # SmolLM2 on CPU: a smoke row, not a benchmark of the model
JUDGE_QUESTIONS = 8


def baselines(root: str) -> list[tuple[str, str, list[str]]]:
    """(run folder, name in the tables, ``eval.run`` arguments) of each offline baseline."""
    train = "fit_on=" + json.dumps({"name": "vqa_rad", "split": "train", "root": root}, separators=(",", ":"))
    return [
        ("oracle", "oracle (reads the answer)", ["--agent", "oracle"]),  # it reads the evaluated dataset
        ("prior", "answer prior (train split)", ["--agent", "prior", "--agent-opt", train]),
        ("zoom-then-answer", "zoom-then-answer", ["--agent", "zoom-then-answer", "--agent-opt", train]),
        ("random", "random", ["--agent", "random"]),
        ("scripted-k4", "scripted seeded guesser (K=4)", ["--agent", "scripted", "--k", "4"]),
    ]


def smollm2_args(url: str, limit: int) -> list[str]:
    """SmolLM2 through the ``openai`` agent: text only, no tools, its own server as the judge."""
    return ["--agent", "openai", "--agent-opt", f"base_url={url}/v1", "--agent-opt", "max_tokens=32",
            "--agent-opt", "tool_protocol=text", "--agent-opt", "temperature=0", "--agent-opt", "api_key_env=null", "--tools", "none",
            "--max-turns", "0", "--limit", str(limit), *judge_args(url)]


def judge_args(url: str) -> list[str]:
    return ["--judge-url", url, "--judge-model", "smollm2", "--judge-api-key-env", ""]


def eval_run(out: Path, args: list[str], root: str, limit: int | None) -> float:
    """``python -m eval.run`` into ``out``; returns its wall seconds (a failure ends the benchmark)."""
    cmd = [sys.executable, "-m", "eval.run", *args, "--dataset", "vqa_rad", "--dataset-opt", f"root={root}",
           "--out", str(out), "--no-progress"]
    if limit is not None and "--limit" not in args:
        cmd += ["--limit", str(limit)]
    print(f"[vqarad_baselines] {out.name} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
        raise SystemExit(f"eval.run for {out.name} failed (exit {proc.returncode}):\n{tail}")
    return time.perf_counter() - t0


def compare(folders: list[Path], names: list[str]) -> tuple[str, str]:
    """The two tables exactly as ``python -m eval.compare RUNS --ci --detail --names ...`` prints them."""
    cmd = [sys.executable, "-m", "eval.compare", *map(str, folders), "--ci", "--detail", "--names", ",".join(names)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    selection, _, detail = proc.stdout.strip().partition("\n\n| Run")  # the selection table may end with a tie line
    detail = "| Run" + detail
    if not selection.startswith("| Run") or not detail.startswith("| Run"):
        raise SystemExit(f"unexpected eval.compare output:\n{proc.stdout}")
    return selection.strip(), detail.strip()


METRICS = ("closed_accuracy", "armed_open_avg", "open_exact_match", "judge_accuracy", "pass_at_1", "pass_at_k",
           "format_error_rate", "tool_calls_per_episode", "unique_answers_at_k", "bleu1", "rouge1", "bertscore",
           "cossim")


def run_figures(slug: str, summary) -> dict:
    """A run's headline figures (values and 95% interval bounds) under ``<slug>.``."""
    name = slug.replace("-", "_")
    fig: dict = {f"{name}.episodes": summary.n_episodes, f"{name}.questions": summary.n_questions,
                 f"{name}.k": summary.k}
    for metric in METRICS:
        value = getattr(summary.overall, metric)
        fig[f"{name}.{metric}"] = value.value
        if value.ci_low is not None:
            fig[f"{name}.{metric}.ci_low"], fig[f"{name}.{metric}.ci_high"] = value.ci_low, value.ci_high
    for kind, count in (summary.errors_by_kind or {}).items():
        fig[f"{name}.errors.{kind}"] = count
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=DEFAULT_ROOT, help="VQA-RAD folder (qa.jsonl, images/)")
    ap.add_argument("--no-smollm2", action="store_true", help="leave out the SmolLM2 rows (no model server)")
    ap.add_argument("--quick", action="store_true", help="first 20 questions, SmolLM2 on 2; print, write nothing")
    ap.add_argument("--keep", default=None, help="keep the run folders here (default: a temporary folder)")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = ap.parse_args(argv)
    if not (Path(args.root) / "qa.jsonl").is_file():
        print(f"VQA-RAD is not under {args.root!r} (no qa.jsonl): nothing measured, no results written. "
              "Put the dataset there (docs/datasets.md) or pass --root.", file=sys.stderr)
        return 1
    from eval.report import load_summary

    limit = 20 if args.quick else None
    runs = baselines(args.root)
    tmp = tempfile.TemporaryDirectory(prefix="vqarad_baselines_")
    base = Path(args.keep) if args.keep else Path(tmp.name)
    folders, names, walls = [], [], {}
    for slug, name, run_args in runs:
        walls[slug] = eval_run(base / slug, run_args, args.root, limit)
        folders.append(base / slug)
        names.append(name)
    smol = not args.no_smollm2
    if smol:
        from agents.openai_server import ServerProcess

        smol_name = f"SmolLM2-135M via openai endpoint ({SMOL_QUESTIONS if not args.quick else 2} q)"
        with ServerProcess(torch_threads=1, env={"HF_HUB_OFFLINE": "1"}) as server:
            walls["smollm2-openai"] = eval_run(base / "smollm2-openai",
                                               smollm2_args(server.url, 2 if args.quick else SMOL_QUESTIONS),
                                               args.root, None)
            walls["prior-smollm2-judge"] = eval_run(
                base / "prior-smollm2-judge", [*runs[1][2], *judge_args(server.url)], args.root,
                2 if args.quick else JUDGE_QUESTIONS)
        folders.append(base / "smollm2-openai")
        names.append(smol_name)
    selection, detail = compare(folders, names)

    figures: dict = {"table.selection": selection, "table.detail": detail, "smollm2": smol,
                     "smollm2.questions": SMOL_QUESTIONS if smol and not args.quick else None}
    for slug, _, _ in runs + ([("smollm2-openai", "", []), ("prior-smollm2-judge", "", [])] if smol else []):
        summary = load_summary(base / slug)
        figures.update(run_figures(slug, summary))
        figures[f"{slug.replace('-', '_')}.wall_s"] = walls[slug]
        if slug == "oracle":
            by_type = summary.by_answer_type
            figures["test.questions"] = summary.n_questions
            for t in ("CLOSED", "OPEN"):
                figures[f"test.{t.lower()}"] = by_type[t].n_questions if t in by_type else 0
    tmp.cleanup()

    lines = ["## VQA-RAD baselines (test split)", "",
             f"Each row is one `python -m eval.run` on VQA-RAD's test split ({figures['test.questions']} questions, "
             f"{figures['test.closed']} CLOSED / {figures['test.open']} OPEN as the loader types them); the tables "
             "are `python -m eval.compare RUNS --ci --detail` (95% bootstrap intervals over questions). "
             "Commands and discussion: `docs/evaluation.md`.", "",
             "Checkpoint-selection view:", "", selection, "", "OPEN answers, tool use, sampling:", "", detail, ""]
    if smol:
        judged = figures.get("prior_smollm2_judge.errors.judge_error", 0)
        lines += [f"SmolLM2 as the judge of {figures['prior_smollm2_judge.episodes']} `prior` predictions: "
                  f"{judged} `judge_error` episodes.", ""]
    else:
        lines += ["SmolLM2 rows left out (`--no-smollm2`).", ""]
    record("vqarad_baselines", "\n".join(lines), figures, command_line("bench_vqarad_baselines.py", argv),
           results_dir_arg(args.quick, args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
