"""Rerun a small learning protocol from scratch and compare it with the committed reference.

``python -m train.protocol`` with the flags below -- two seeds, each with its own build of a trained
``ground`` tool (built here, in a fresh tool cache) and its own warm start chosen on val by what
RL will use (:mod:`train.probe`), GRPO long enough to take off, the warm start and the answer
baselines -- in a temporary folder, then each row's held-out mean, its seeds and tool builds, the
held-out question count, the verdict and **how many GRPO seeds took off** (sampled tool calls on
at least half of the last step's rollouts, held-out accuracy above the best answer baseline's upper
bound) are compared with ``benchmarks/results/protocol_small.json``. Every mean must land within
``TOLERANCE`` of the reference, counts exactly; the script prints the table and exits 1 when one
does not. CI runs it, so a clean clone shows that the protocol's numbers come back *and that GRPO
still learns*: a warm start chosen blind, a reward or an update that stops GRPO from taking off
fails it -- and a rerun in which any GRPO seed does not take off exits 1 with one ``FAIL: GRPO did not
take off ...`` line whatever the reference says (``benchmarks/protocol_small_red.py`` shows it red with
the warm start chosen blind). GRPO's learning rate is 1e-3 here: in exploratory runs (not committed)
from these 100-step warm starts, the full protocol's 5e-4 had not taken off after 14 steps (sampled
call rate about 0.2) while 1e-3 took off within 8. Groups are 16 rollouts (the full protocol: 8): with
8, seed 1's warm start sampled a tool call in 1.6% of its val episodes, its GRPO's sampled calls
were right 0.53 of the time against 0.49 for direct answers (seed 0: 0.67 against 0.47; means over
24 steps of rollouts, not
the test split), and its call rate wandered (0.05 -> 0.44 at step 17 -> 0.17) without taking off;
twice the rollouts per question give twice the calls to compare within each group. The warm starts
train on gold trajectories of which 0.75 call the tool (the full protocol: 0.5): on an Intel Xeon with
0.5, seed 1's warm start sampled a call in 1 of 64 val episodes and its GRPO's calls died out (0.00 at
the last step), so no reference could be recorded; with 0.75 the warm starts sample calls in 0.22-0.36
of val episodes and both seeds take off (a trial with 150 warm-start steps instead took off too, from
a warm start calling in 0.016 of them: 0.75 leaves less to luck on another CPU). The SFT
baselines are left to the full protocol's records: at this size they would double the CPU time.

    python benchmarks/reproduce_protocol.py              # rerun and compare (CI)
    python benchmarks/reproduce_protocol.py --record     # rerun and keep the result as the reference

On one machine the rerun is bit-identical (tool builds and trainers run on one torch thread with
fixed seeds); across machines floating-point differences can flip a few held-out answers, which is
what the tolerance allows: 0.1 on a mean over 32 questions is three answers.
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

from figures import ROOT, command_line, machine, record, results_dir_arg

TOPIC = "protocol_small"
TOLERANCE = 0.1
"""Largest accepted |rerun - reference| of a held-out mean (accuracy over 32 questions)."""
TOOLS = {"ground": {"engine": "trained", "steps": 120, "dataset_options": {"n": 400}, "val_options": {"n": 100}}}
FLAGS = ["--seeds", "0,1", "--tools", json.dumps(TOOLS), "--sft-steps", "100", "--sft-save-every", "50",
         "--sft-batch-size", "16", "--val-size", "32", "--eval-size", "32", "--grpo-steps", "24",
         "--grpo-lr", "1e-3", "--prompts-per-step", "8", "--group-size", "16", "--eval-every", "12", "--micro-batch", "64",
         "--ablations", "blank_policy", "--probe-samples", "2", "--baselines", "question_prior,constant",
         "--tool-share", "0.75", "--kl-candidates", ""]
ROWS = ("grpo", "warm_start", "more_sft", "tool_sft", "notool_sft", "question_prior", "constant")


def rerun(out: Path) -> dict:
    """Run the small protocol in ``out`` with a tool cache of its own; its ``protocol.json``."""
    env = {**os.environ, "MEDVQA_CACHE": str(out / "cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "train.protocol", "--out", str(out / "protocol"), *FLAGS]
    print("$ " + " ".join(cmd[1:]), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT, env=env)
    if rc != 0:
        raise SystemExit(f"the small protocol failed (exit {rc}); its run logs are under {out / 'protocol'}")
    return json.loads((out / "protocol" / "protocol.json").read_text())


def figures_of(result: dict) -> dict:
    """The compared figures of a ``protocol.json``."""
    from train.protocol import tool_hash

    fig: dict = {"beats_every_baseline": int(result["beats_every_baseline"]), "tool_builds": result["tool_builds"],
                 "questions": result["args"]["eval_size"]}
    for name in ROWS:
        row = result["rows"].get(name)
        if row is not None:
            fig[f"{name}.mean"] = row["mean"]
            fig[f"{name}.seeds"] = row["seeds"]
    if "took_off_seeds" in result["rows"].get("grpo", {}):  # a reference recorded before issue 42 has none
        fig["grpo.took_off_seeds"] = result["rows"]["grpo"]["took_off_seeds"]
    fig["tools_sha256"] = ",".join(tool_hash(t)[:12] for builds in result["identity"]["tools"].values()
                                   for _, t in sorted(builds.items()))
    return fig


def took_off_failure(result: dict) -> str | None:
    """One line naming the GRPO seeds that did not take off (``train.protocol.took_off``: sampled tool
    calls on at least half of the last step's rollouts and held-out accuracy above the answer
    baselines' bound), or ``None`` when every seed the protocol ran did. Checked on its own, not
    only against the reference: a reference in which a seed did not take off guards nothing."""
    grpo = result["rows"].get("grpo")
    seeds = [s for s in str(result["args"]["seeds"]).split(",") if s.strip()]
    if not grpo:
        return f"FAIL: GRPO did not take off: no GRPO row (0 of {len(seeds)} seeds finished)"
    per_seed = {str(k): v for k, v in grpo["per_seed"].items()}
    bound = grpo.get("answer_bound")
    missed = [s for s in seeds if not per_seed.get(s, {}).get("took_off")]
    if not missed:
        return None

    def why(seed: str) -> str:
        row = per_seed.get(seed)
        if row is None:
            return f"seed {seed}: no finished run"
        rate = row.get("sampled_call_rate_last")
        held = f"held-out {row['metric']:.3f}" + (f" vs bound {bound:.3f}" if bound is not None else "")
        return f"seed {seed}: sampled calls {'none logged' if rate is None else f'{rate:.2f}'} at the last step, {held}"
    return (f"FAIL: GRPO did not take off on {len(missed)} of {len(seeds)} seeds ({'; '.join(map(why, missed))}): "
            "the small protocol no longer shows learning")


def compare(got: dict, reference: dict) -> list[tuple[str, object, object, bool | None]]:
    """One ``(name, reference, rerun, within tolerance)`` per reference figure; ``None`` for the
    tools' hashes, shown and not compared: bit-identical builds are only expected on one machine
    (an Intel Xeon with AMX and an AMD EPYC train the same recipe to different bits)."""
    rows: list[tuple[str, object, object, bool | None]] = []
    for name, ref in reference.items():
        value = got.get(name)
        if name == "tools_sha256":
            ok = None
        elif isinstance(ref, float) and isinstance(value, (int, float)):
            ok = abs(value - ref) <= TOLERANCE + 1e-9
        else:
            ok = value == ref
        rows.append((name, ref, value, ok))
    return rows


def shown_only(name: str) -> bool:
    """A reference figure kept for the reader, not compared: cost, commit, each GRPO seed's figures.

    >>> [shown_only(k) for k in ("wall_min", "grpo.seed1.heldout", "grpo.seeds", "grpo.mean")]
    [True, True, False, False]
    """
    return name in ("wall_min", "cpu_min", "git_commit", "git_dirty", "grpo.answer_bound") or name.startswith("grpo.seed") \
        and name != "grpo.seeds"


def cpu_minutes(folder: Path | None) -> float | None:
    """The CPU minutes of a protocol folder's runs (``runs.jsonl``: each run with its children)."""
    path = folder / "runs.jsonl" if folder is not None else None
    if path is None or not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return round(sum(r.get("cpu_s") or 0.0 for r in rows) / 60, 1)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", action="store_true", help="keep this rerun as the reference")
    ap.add_argument("--out", default=None, help="run folder (default: a temporary folder, removed afterwards)")
    ap.add_argument("--results", default=None, help="where the reference is kept (default benchmarks/results)")
    args = ap.parse_args(argv)
    results = results_dir_arg(False, args.results)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="medvqa-protocol-") as tmp:
        folder = Path(args.out) if args.out else Path(tmp)
        result = rerun(folder)
        cpu = cpu_minutes(folder / "protocol")
    wall = time.perf_counter() - t0
    got = figures_of(result)
    failure = took_off_failure(result)
    if args.record:
        if failure:  # a reference in which GRPO did not take off cannot guard learning
            print(f"\n{failure}; not recorded ({wall / 60:.1f} min wall)")
            return 1
        code = result["identity"]["code"]
        if code.get("git_dirty") or not code.get("git_commit"):  # a reference names the commit that made it
            print(f"\nnot recorded: the code that ran has uncommitted changes or no commit ({code.get('git_commit')}); "
                  "record from a clean checkout (git worktree add DIR HEAD, PYTHONPATH=DIR)")
            return 1
        lines = ["## Small learning protocol (reference for `benchmarks/reproduce_protocol.py`)", "",
                 "`python benchmarks/reproduce_protocol.py`: the protocol with `" + " ".join(FLAGS) + "` from scratch "
                 f"(tool builds included): {cpu} CPU minutes over its runs (`runs.jsonl`), {wall / 60:.1f} min wall "
                 f"for this invocation on this machine; a rerun must land within {TOLERANCE} of each mean, and "
                 "as many GRPO seeds must take off.", "", "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in got.items()]
        for seed, row in sorted(result["rows"]["grpo"]["per_seed"].items()):  # shown, not compared
            got[f"grpo.seed{seed}.call_rate_last"] = row.get("sampled_call_rate_last")
            got[f"grpo.seed{seed}.heldout"] = row["metric"]
        got["grpo.answer_bound"] = result["rows"]["grpo"].get("answer_bound")
        got.update({"wall_min": round(wall / 60, 1), "cpu_min": cpu,
                    "git_commit": result["identity"]["code"]["git_commit"],
                    "git_dirty": int(bool(result["identity"]["code"]["git_dirty"]))})
        record(TOPIC, "\n".join(lines) + "\n", got, command_line("reproduce_protocol.py", argv), results)
        return 0
    recorded = json.loads((results / f"{TOPIC}.json").read_text())
    reference = {k: v for k, v in recorded["figures"].items() if not shown_only(k)}
    rows = compare(got, reference)
    print(f"\nreference: {recorded['meta'].get('machine')}; this rerun: {machine()}")
    print(f"\n| figure | reference | rerun | within {TOLERANCE} |\n|---|---|---|---|")
    for name, ref, value, ok in rows:
        verdict = "yes" if ok else "NO" if ok is False else f"not compared ({'same' if ref == value else 'another build'})"
        print(f"| {name} | {ref} | {value} | {verdict} |")
    bad = [r for r in rows if r[3] is False]
    compared = [r for r in rows if r[3] is not None]
    print(f"\nfigures within tolerance: {len(compared) - len(bad)}; outside: {len(bad)} (rerun in {wall / 60:.1f} min wall, "
          f"{cpu} CPU min)")
    if failure:
        print(failure)
    return 1 if bad or failure else 0


if __name__ == "__main__":
    sys.exit(main())
