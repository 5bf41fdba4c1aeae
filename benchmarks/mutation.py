"""Mutation testing of the modules that decide a number: do the tests notice a one-token change?

    python benchmarks/mutation.py [--only rewards/normalize.py,...] [--max-children 2] [--update] [--results DIR]

mutmut (the ``dev`` extra) makes every small mutant of each module below (an operator flipped, a
constant changed, a call argument dropped, ...) and runs, for each mutant, the module's *own* fast test
files -- only those of them that reach the mutated function. A mutant is *killed* when a test fails,
*survives* when they all pass, and has *no tests* when none reaches it. Each module runs in its own
scratch copy of the checkout (mutmut writes ``mutants/`` beside the code it copies), so the checkout
is never touched. The score is (killed + timeout) / (killed + survived + no tests + timeout + suspicious);
survivors are printed as diffs and kept in the results with their names. A big module listed in
``FUNCTIONS`` is mutated only in the named functions (its mutants elsewhere are neither run nor
counted; the row says which functions).

Not run by CI or by ``run_all.py`` (minutes of CPU); run it after changing a listed module or its tests
and look at the new survivors: each is either an equivalent mutant (no behaviour can tell) or a
missing test. RELIABILITY.md quotes the recorded score and survivors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project (medvqa_env.cli) when run as a script
from figures import command_line, record  # noqa: E402  (benchmarks/figures.py)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["medvqa_env", "agents", "tool_backends", "rewards", "train", "eval"]

# module -> its own fast test files (no subprocess, no server, no model download: mutmut runs them
# in forked workers, and a mutant reached only through a subprocess would pass unseen)
TARGETS: dict[str, list[str]] = {
    "rewards/normalize.py": ["tests/rewards/test_rule.py", "tests/rewards/test_mcq_two_options.py",
                             "tests/rewards/test_normalize_edges.py", "tests/rewards/test_rule_teeth.py",
                             "tests/rewards/test_closed_vocabularies.py"],
    "rewards/matching.py": ["tests/rewards/test_rule.py", "tests/rewards/test_rule_teeth.py",
                            "tests/rewards/test_closed_vocabularies.py"],
    "rewards/rule.py": ["tests/rewards/test_rule.py", "tests/rewards/test_rule_edges.py"],
    "rewards/adaptive.py": ["tests/rewards/test_adaptive.py"],
    "rewards/text_metrics.py": ["tests/rewards/test_text_metrics.py"],
    "rewards/shaping.py": ["tests/rewards/test_shaping.py", "tests/rewards/test_shaping_edges.py"],
    "medvqa_env/parser.py": ["tests/medvqa_env/test_parser.py", "tests/medvqa_env/test_tool_call_names.py"],
    "eval/metrics.py": ["tests/eval/test_eval_metrics.py", "tests/eval/test_bootstrap_interval.py"],
    "eval/scoring.py": ["tests/eval/test_scoring.py"],
    "train/algorithms.py": ["tests/train/test_algorithms.py"],
    "train/protocol.py": ["tests/train/test_protocol.py", "tests/train/test_protocol_verdict.py",
                          "tests/train/test_protocol_teeth.py"],
    # issue 40: the tool server's request path
    "tool_backends/limits.py": ["tests/hardening/test_server_files.py", "tests/tool_backends/test_limits_teeth.py"],
    "tool_backends/single_flight.py": ["tests/tool_backends/test_single_flight.py",
                                       "tests/tool_backends/test_single_flight_teeth.py"],
    "tool_backends/http_client.py": ["tests/tool_backends/test_client_hostile.py",
                                    "tests/tool_backends/test_http_connection.py",
                                    "tests/tool_backends/test_http_client_teeth.py"],
    # the gate in front of every endpoint (its head checks, body limits and deadlines), by raw ASGI
    # calls (tests/hardening/test_request_path.py drives it through servers on threads: ~20 s a
    # mutant, so the "before" run only: benchmarks/results/mutation_before_teeth_server.md)
    "tool_backends/server.py": ["tests/tool_backends/test_gate_teeth.py", "tests/hardening/test_gate_fuzz.py"],
    # issue 42: tool identity, checkpoints, resume checks
    # (test_tool_identity.py builds real tools: ~13 CPU min per run of this module, so only the teeth run here)
    "tool_backends/identity.py": ["tests/tool_backends/test_identity_teeth.py"],
    # (the trainers' own resume tests run whole training runs, 30 s+ each: only the teeth run here)
    "train/checkpoint.py": ["tests/hardening/test_checkpoint_pickle.py", "tests/train/test_resume_teeth.py"],
    "train/common.py": ["tests/train/test_resume_teeth.py"],
}

# big modules: only these functions are mutated ("name" a function, "Class.name" a method,
# "Class.*" every method of a class); the rest of the module is neither run nor counted
FUNCTIONS: dict[str, list[str]] = {
    # issue 42: the warm-start choice, "took off", the units and the verdict's intervals
    "train/protocol.py": ["choose_warm_start", "greedy_lead", "took_off", "answer_bound", "compare", "paired_difference",
                          "welch_difference", "t_interval", "unit_values", "independent", "builds_of", "build_of"],
    # what a checkpoint is and what resuming restores (not the HF save/load paths, which need a model)
    "train/checkpoint.py": ["checkpoint_step", "rng_state_to_json", "rng_state_from_json", "load_rng_state",
                            "save_checkpoint", "list_checkpoints", "latest_checkpoint", "load_checkpoint",
                            "policy_sha256", "_atomic_write_text"],
    # the resume checks: what --allow-changed may and may not skip
    "train/common.py": ["config_differences", "check_resume", "other_trainer"],
    # the connection's framing and deadline, the pool's reuse, the token header
    "tool_backends/http_client.py": ["Connection.*", "ConnectionPool.*", "HTTPToolBackend._request",
                                     "HTTPToolBackend._headers", "HTTPToolBackend.__getstate__"],
    # the request path before any endpoint runs; create_app's own closures (check_images, guarded,
    # answer_call, ...) are mutated by mutmut as the one function create_app (hundreds of mutants,
    # each needing a whole app): not targeted
    "tool_backends/server.py": ["is_loopback", "check_settings", "_host_name", "refuse_head", "refuse_media",
                                "RequestGate.*", "_plain", "_within"],
}

# tests left out of a module's runs (``pytest -k``): slow ones that reach none of its functions, or
# Hypothesis searches that would rerun hundreds of examples for every mutant
DESELECT: dict[str, str] = {
    "medvqa_env/parser.py": "not random and not megabyte",
    "train/protocol.py": "not training_run and not answer_baselines",
}

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", None: "not checked"}


@dataclasses.dataclass
class Args:
    only: str = ""
    """comma list of modules (keys of TARGETS) to run; empty = all"""
    max_children: int = 2
    """mutmut's parallel workers"""
    keep: bool = False
    """keep each module's scratch copy (its mutants/ folder) and print where it is"""
    update: bool = False
    """rerun only the --only modules and merge them into the recorded results (the others keep theirs)"""
    results: str | None = None
    """results folder (default benchmarks/results); a run is recorded when every module has a row"""


def scratch_copy(module: str, tests: list[str]) -> Path:
    """The checkout's packages and tests in a temp folder, with a ``[mutmut]`` section for ``module``."""
    root = Path(tempfile.mkdtemp(prefix="medvqa-mutation-"))
    for name in PACKAGES + ["tests"]:
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # the benchmark scripts some tests import (tests/hardening loads bench_load.py), not their records
    shutil.copytree(ROOT / "benchmarks", root / "benchmarks",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results", "runs"))
    for name in ("setup.cfg", "pyproject.toml"):
        shutil.copy2(ROOT / name, root / name)
    package = module.split("/", 1)[0]
    others = [p for p in PACKAGES if p != package]
    section = ["[mutmut]", f"source_paths = {package}", f"only_mutate = {module}", "also_copy ="]
    section += [f"    {p}" for p in others + ["benchmarks"]] + ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in tests]
    section += ["pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -q"]
    if module in DESELECT:
        section += ["    -k", f"    {DESELECT[module]}"]
    with open(root / "setup.cfg", "a") as f:
        f.write("\n" + "\n".join(section) + "\n")
    return root


def mutmut(root: Path, *argv: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy, not the checkout
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", RAY_AUTH_MODE="disabled", MEDVQA_CACHE=str(root / ".cache"),
               HYPOTHESIS_STORAGE_DIRECTORY=str(root / ".hypothesis"))
    exe = Path(sys.executable).with_name("mutmut")
    return subprocess.run([str(exe), *argv], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def diff_line(root: Path, name: str) -> str:
    """The mutant's change as ``-old`` / ``+new`` (first changed line of each), from ``mutmut show``."""
    shown = mutmut(root, "show", name).stdout.splitlines()
    old = next((line[1:].strip() for line in shown if line.startswith("-") and not line.startswith("---")), "")
    new = next((line[1:].strip() for line in shown if line.startswith("+") and not line.startswith("+++")), "")
    return f"{old}  ->  {new}"


def mutant_patterns(module: str, functions: list[str]) -> list[str]:
    """mutmut's names (fnmatch globs) for the mutants of ``functions`` in ``module``."""
    dotted = module.removesuffix(".py").replace("/", ".")
    out = []
    for name in functions:
        if "." in name:
            cls, _, method = name.partition(".")
            out.append(f"{dotted}.x\u01c1{cls}\u01c1{method}__mutmut_*")
        else:
            out.append(f"{dotted}.x_{name}__mutmut_*")
    return out


def run_module(module: str, tests: list[str], args: Args) -> dict:
    import fnmatch

    root = scratch_copy(module, tests)
    start, cpu0 = time.monotonic(), os.times()
    patterns = mutant_patterns(module, FUNCTIONS.get(module, []))
    done = mutmut(root, "run", "--max-children", str(args.max_children), *patterns)
    cpu1 = os.times()
    meta = root / "mutants" / (module + ".meta")
    if not meta.is_file():
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"mutmut made no results for {module} (exit {done.returncode}):\n{tail}")
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    if patterns:
        codes = {k: c for k, c in codes.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}
    status = {name: STATUS.get(code, "suspicious") for name, code in codes.items()}
    if done.returncode != 0 and all(s == "not checked" for s in status.values()):
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"mutmut checked no mutant of {module} (exit {done.returncode}):\n{tail}")
    counts = Counter(status.values())
    survivors = {name: diff_line(root, name) for name, s in sorted(status.items()) if s in ("survived", "no tests")}
    row = {"module": module, "tests": tests, "mutants": len(status), **{k: counts.get(k, 0) for k in
           ("killed", "survived", "no tests", "timeout", "suspicious", "skipped", "not checked")},
           "wall_s": time.monotonic() - start, "date": time.strftime("%Y-%m-%d"),
           "cpu_s": (cpu1.children_user + cpu1.children_system) - (cpu0.children_user + cpu0.children_system),
           "survivors": {n: (status[n], d) for n, d in survivors.items()},
           "functions": FUNCTIONS.get(module, [])}
    scored = row["killed"] + row["survived"] + row["no tests"] + row["suspicious"] + row["timeout"]
    row["score"] = (row["killed"] + row["timeout"]) / scored if scored else None
    if args.keep:
        print(f"[mutation] {module}: scratch copy kept at {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    from medvqa_env.cli import parse_dataclass, run_cli
    from medvqa_env.errors import ConfigError, unknown_name_message

    prog = "python benchmarks/mutation.py"
    args = parse_dataclass(Args, argv, prog=prog, description=__doc__.split("\n\n")[0])

    def run() -> int:
        modules = [m.strip() for m in args.only.split(",") if m.strip()] or list(TARGETS)
        for name in modules:
            if name not in TARGETS:
                raise ConfigError(unknown_name_message("module", name, TARGETS))
        return measure(modules, args, list(sys.argv[1:] if argv is None else argv))

    return run_cli(prog, run)


COUNTS = ("mutants", "killed", "survived", "no tests", "timeout", "suspicious")


def key_of(module: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", module.removesuffix(".py"))


def module_figures(row: dict) -> dict:
    """One module's row as named figures (enough to rebuild the row: ``--update`` reruns a few modules)."""
    key = key_of(row["module"])
    out = {f"{key}.{name.replace(' ', '_')}": row[name] for name in COUNTS}
    out.update({f"{key}.score_pct": None if row["score"] is None else 100.0 * row["score"],
                f"{key}.cpu_s": row["cpu_s"], f"{key}.date": row["date"],
                f"{key}.functions": ", ".join(row.get("functions") or []),
                f"{key}.survivors": "\n".join(f"{state}: {name}: {change}"
                                               for name, (state, change) in row["survivors"].items())})
    return out


def row_from_figures(module: str, figures: dict) -> dict | None:
    key = key_of(module)
    if f"{key}.mutants" not in figures:
        return None
    row = {"module": module, **{name: figures[f"{key}.{name.replace(' ', '_')}"] for name in COUNTS},
           "cpu_s": figures[f"{key}.cpu_s"], "date": figures[f"{key}.date"], "survivors": {},
           "functions": [f for f in figures.get(f"{key}.functions", "").split(", ") if f]}
    pct = figures[f"{key}.score_pct"]
    row["score"] = None if pct is None else pct / 100.0
    for line in filter(None, figures[f"{key}.survivors"].split("\n")):
        state, name, change = line.split(": ", 2)
        row["survivors"][name] = (state, change)
    return row


def measure(modules: list[str], args: Args, argv: list[str]) -> int:
    results = Path(args.results) if args.results else (ROOT / "benchmarks" / "results")
    previous = {}
    if args.update and (results / "mutation.json").is_file():
        previous = json.loads((results / "mutation.json").read_text())["figures"]
    fresh = {}
    for module in modules:
        print(f"[mutation] {module} against {', '.join(TARGETS[module])} ...", flush=True)
        row = run_module(module, TARGETS[module], args)
        print(f"[mutation] {module}: {row['killed']}/{row['mutants']} killed, {row['survived']} survived, "
              f"{row['no tests']} without tests ({row['cpu_s']:.0f} CPU s)", flush=True)
        for name, (state, change) in row["survivors"].items():
            print(f"    {state:9s} {name}: {change}")
        fresh[module] = row
    rows = [fresh.get(m) or row_from_figures(m, previous) for m in TARGETS]
    rows = [r for r in rows if r is not None]

    total = Counter()
    for row in rows:
        total.update({k: row[k] for k in COUNTS})
    scored = total["killed"] + total["survived"] + total["no tests"] + total["suspicious"] + total["timeout"]
    figures = {"mutants": total["mutants"], "killed": total["killed"], "survived": total["survived"],
               "no_tests": total["no tests"], "timeout": total["timeout"], "suspicious": total["suspicious"],
               "score_pct": 100.0 * (total["killed"] + total["timeout"]) / scored if scored else None,
               "cpu_s": sum(r["cpu_s"] for r in rows), "modules": len(rows)}
    command = "python benchmarks/mutation.py" if args.update else command_line("mutation.py", argv)
    lines = ["## Mutation testing", "", f"`{command}` (mutmut; each module against its own test files; "
             "score = killed / (killed + survived + no tests))", "",
             "| module | mutants | killed | survived | no tests | score | CPU s | run |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        figures.update(module_figures(row))
        score = "n/a" if row["score"] is None else f"{100 * row['score']:.0f} %"
        only = f" ({len(row['functions'])} functions)" if row.get("functions") else ""
        lines.append(f"| `{row['module']}`{only} | {row['mutants']} | {row['killed']} | {row['survived']} | "
                     f"{row['no tests']} | {score} | {row['cpu_s']:.0f} | {row['date']} |")
    figures["table"] = "\n".join(lines[4:])
    lines += ["", f"Total: {total['killed']} of {total['mutants']} killed ({figures['score_pct'] or 0:.1f} %), "
              f"{total['survived']} survived, {total['no tests']} reached by no test.", "",
              *[f"`{r['module']}` mutated only in: {', '.join(r['functions'])}." for r in rows if r.get("functions")],
              "", "Survivors (`mutmut show <name>` in a `--keep` copy gives the whole diff):", "", "```"]
    for row in rows:
        for name, (state, change) in row["survivors"].items():
            lines.append(f"{state:9s} {name}: {change}")
    lines.append("```")
    full = {r["module"] for r in rows} == set(TARGETS)
    keep = full or bool(args.results) or args.update  # --update merges into the recorded run
    record("mutation", "\n".join(lines), figures, command, results if keep else None)
    if not keep:
        print("[mutation] a subset of the modules: nothing recorded (--update merges it into the recorded run; "
              "--results DIR keeps it elsewhere)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
