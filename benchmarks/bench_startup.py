"""What users wait for before the first step: ``import``, ``gym.make`` + ``reset``, and loading a trained tool.

Two parts, each against a baseline measured in the same run:

* **import and make** -- fresh interpreters, one per measurement, variants taking turns: a bare
  ``import gymnasium`` (the baseline), ``import medvqa_env`` after it, and a cold
  ``gym.make("MedVQA-v0")`` + ``reset`` of the default env; and, as the path was before issue 31,
  the same make + reset with the text-metric libraries imported up front (``rewards.armed``
  imported rouge-score, and with it nltk, scipy and scikit-learn). Each interpreter times its own
  code (its start-up is the same for every variant); reported: medians and each variant's extra
  seconds over the bare import of the same round (median over rounds).
* **trained engines** -- for each trained tool (``classify``: CLIP, ``segment``: SAM, ``ground``:
  the CenterNet grounder), a folder built by ``python -m tool_backends.finetune`` (2 steps: the
  same architecture, files and size as a full training), then in a fresh interpreter per tool:
  importing the model libraries (torch, transformers: paid once by any process using a model),
  building the tool for the first env copy (the load), and for 7 more env copies, against 8 copies
  each loading the folder themselves (the engine class built directly, as before issue 31).

    python benchmarks/bench_startup.py [--quick] [--rounds 7]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

HEAVY = ("rouge_score", "nltk", "bert_score", "sentence_transformers", "torch", "transformers", "scipy", "sklearn")
TIMED = """
import time
t0, c0 = time.perf_counter(), time.process_time()
{code}
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
import json, sys
print(json.dumps({{"s": elapsed, "cpu": cpu, "heavy": sorted(m for m in {heavy!r} if m in sys.modules)}}))
"""
VARIANTS = {
    "bare": "import gymnasium",
    "import": "import gymnasium\nimport medvqa_env",
    "make": "import gymnasium as gym\nimport medvqa_env\nenv = gym.make('MedVQA-v0')\nenv.reset(seed=0)",
    "make_eager": "import gymnasium as gym\nimport medvqa_env\nimport rouge_score.rouge_scorer\n"
                  "env = gym.make('MedVQA-v0')\nenv.reset(seed=0)",
}
LABELS = {"bare": "`import gymnasium` (**baseline**)", "import": "+ `import medvqa_env`",
          "make": "+ `gym.make('MedVQA-v0')` + `reset` (default env)",
          "make_eager": "same, metric libraries imported up front (the path before issue 31)"}
GOALS = {"import": 0.3, "make": 1.0}

ENGINE_LOAD = """
import json, time
t0 = time.perf_counter()
import torch, transformers
from transformers import CLIPModel, SamModel
t_import = time.perf_counter() - t0
from tool_backends.registry import build_tool
from tool_backends.engines.loaded import loaded_count
from tool_backends.engines import ENGINES
kind, engine, folder = {kind!r}, {engine!r}, {folder!r}
t0, c0 = time.perf_counter(), time.process_time()
tools = [build_tool(kind, engine=engine, model=folder)]
t_first, c_first = time.perf_counter() - t0, time.process_time() - c0
t0 = time.perf_counter()
tools += [build_tool(kind, engine=engine, model=folder) for _ in range(7)]
t_more = time.perf_counter() - t0
shared = len({{id(t.engine) for t in tools}}) == 1 and loaded_count() == 1
cls = ENGINES[{kind_table!r}].get(engine)
t0 = time.perf_counter()
own = [cls(model=folder) for _ in range(8)]
t_own = time.perf_counter() - t0
print(json.dumps({{"import_s": t_import, "first_s": t_first, "first_cpu_s": c_first, "more_s": t_more, "own8_s": t_own, "shared": shared}}))
"""
TRAINED = {"classify": ("clip", "classify"), "segment": ("sam", "segment"), "ground": ("centernet", "ground")}


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def run_child(code: str, timeout: int = 300) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def import_rounds(rounds: int) -> dict:
    """Median wall and CPU seconds of each variant, and of its extra over the same round's bare import."""
    samples: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    heavy: dict[str, list[str]] = {}
    keys = list(VARIANTS)
    for i in range(rounds + 1):  # round 0 warms the file cache
        got = {}
        for key in keys[i % len(keys):] + keys[:i % len(keys)]:
            got[key] = run_child(TIMED.format(code=VARIANTS[key], heavy=HEAVY))
            heavy[key] = got[key]["heavy"]
        if i:
            for key, r in got.items():
                samples[key].append({"s": r["s"], "cpu_s": r["cpu"], "extra_s": r["s"] - got["bare"]["s"],
                                     "extra_cpu_s": r["cpu"] - got["bare"]["cpu"]})
    out: dict = {"heavy": heavy}
    for key, rows in samples.items():
        for field in ("s", "cpu_s") + (("extra_s", "extra_cpu_s") if key != "bare" else ()):
            out[f"{key}_{field}"] = statistics.median(r[field] for r in rows)
    return out


def build_folders(root: Path, quick: bool) -> dict[str, str]:
    folders = {}
    for kind in TRAINED:
        out = root / kind
        subprocess.run([sys.executable, "-m", "tool_backends.finetune", kind, "--out", str(out), "--steps", "2",
                        "--max-images", "16" if quick else "32", "--torch-threads", "1"],
                       cwd=REPO, env=child_env(), check=True, capture_output=True, timeout=900)
        folders[kind] = str(out)
    return folders


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="2 rounds, one trained tool, nothing recorded")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = p.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    imports = import_rounds(rounds)
    with tempfile.TemporaryDirectory(prefix="medvqa-startup-") as tmp:
        kinds = ["classify"] if args.quick else list(TRAINED)
        folders = build_folders(Path(tmp), args.quick)
        engines = {k: run_child(ENGINE_LOAD.format(kind=k, engine=TRAINED[k][0], folder=folders[k],
                                                   kind_table=TRAINED[k][1])) for k in kinds}

    figures: dict = {}
    lines = ["## Start-up: import, `gym.make` + `reset`, loading a trained tool (`benchmarks/bench_startup.py`)", "",
             f"`{command_line('bench_startup.py', argv)}` -- fresh interpreters, one per measurement, variants taking "
             f"turns; median of {rounds} rounds. *Extra* is a variant's time minus the bare `import gymnasium` of the "
             "same round (median over rounds); each interpreter times its own code. CPU seconds are the "
             "process's own (steadier than wall time when other jobs share the cores).", "",
             "| what | wall s | CPU s | extra over bare `import gymnasium`, wall (s) | extra, CPU (s) | goal | "
             "metric/model libraries loaded |",
             "|---|---:|---:|---:|---:|---|---|"]
    for key in VARIANTS:
        extra, extra_cpu = imports.get(f"{key}_extra_s"), imports.get(f"{key}_extra_cpu_s")
        goal = f"< {GOALS[key]:g} s" if key in GOALS else ""
        loaded = ", ".join(imports["heavy"][key]) or "none"
        lines.append(f"| {LABELS[key]} | {imports[f'{key}_s']:.3f} | {imports[f'{key}_cpu_s']:.3f} | "
                     f"{'' if extra is None else f'{extra:+.3f}'} | {'' if extra is None else f'{extra_cpu:+.3f}'} | "
                     f"{goal} | {loaded} |")
        figures.update({k: v for k, v in imports.items() if k.startswith(f"{key}_") and k != "heavy"})
        figures[f"{key}_heavy_modules"] = len(imports["heavy"][key])
    lines += ["", "Trained tools, one fresh interpreter each (folders from `python -m tool_backends.finetune KIND "
              "--steps 2`: a full training's architecture, files and size):", "",
              "| tool (engine) | import torch + transformers (s) | first env copy: load (s) | load, CPU (s) | "
              "7 more copies (s) | engines loaded | 8 copies each loading it (s) | ratio |",
              "|---|---:|---:|---:|---:|---|---:|---:|"]
    for kind, r in engines.items():
        both = r["first_s"] + r["more_s"]
        lines.append(f"| {kind} ({TRAINED[kind][0]}) | {r['import_s']:.2f} | {r['first_s']:.3f} | "
                     f"{r['first_cpu_s']:.3f} | {r['more_s']:.4f} | "
                     f"{'1 (shared)' if r['shared'] else '**several**'} | {r['own8_s']:.3f} | "
                     f"{r['own8_s'] / both:.1f}× |")
        figures.update({f"engine.{kind}.{k}": v for k, v in r.items()})
    if engines:
        figures["engine.load_max_s"] = max(r["first_s"] for r in engines.values())
        figures["engine.all_shared"] = all(r["shared"] for r in engines.values())
    lines += ["", "A model engine is loaded once per process and shared by every env copy asking for the same "
              "checkpoint (`tool_backends.engines.loaded`: keyed by the folder and its files' sizes and times); "
              "the model libraries' import is paid once by any process that uses a model, and is not part of "
              "the load. Loading prints no progress bars unless `MEDVQA_PROGRESS_BARS=1`.", ""]
    record("startup", "\n".join(lines), figures, command_line("bench_startup.py", argv),
           results_dir_arg(args.quick, args.results))


if __name__ == "__main__":
    main()
