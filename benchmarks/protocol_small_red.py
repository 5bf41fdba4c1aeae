"""Show CI's small-protocol check red: the same check with the warm start chosen blind.

Issue 42: the protocol used to choose its warm start by greedy val accuracy, which cannot see tool use
(a greedy warm start never calls the tool, so every candidate answers one constant and scores alike).
This script copies the committed tree (``git archive HEAD``) into a scratch folder, puts the blind
criterion back into that copy's ``train/protocol.py`` -- the warm start is the checkpoint with the best
greedy val accuracy, ties to the earliest step (the probes still run and are recorded, they just do not
decide) -- and runs that copy's ``benchmarks/reproduce_protocol.py``, exactly as ``.ci/run`` does. The
check must exit non-zero with its one ``FAIL: GRPO did not take off ...`` line. The command, its exit
code, its last lines, and each build's blind and probe-chosen steps go to
``benchmarks/results/protocol_small_red.{md,json}``. The checkout itself is never changed.

Why ties to the earliest: at the small protocol's size every candidate's greedy val accuracy is the
same (one constant answer, 0.500 on the balanced val questions), so a greedy criterion cannot tell them
apart at all, and the pre-issue-42 tie-break (the later step) lands on the latest checkpoint by luck of
the tie-break, not by seeing anything -- the same one the probe rule takes there. Breaking the tie the
other way is what a one-question greedy lead did on CLOSED build 2 (step 50 of 150).

    python benchmarks/protocol_small_red.py           # ~10 min of CPU, one small protocol from scratch
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
from figures import ROOT, command_line, record, results_dir_arg  # noqa: E402

TOPIC = "protocol_small_red"
CHOICE = "    chosen = choose_warm_start(probes)\n"
BLIND = ('    chosen = {"chosen_step": min(steps, key=lambda s: (-evals[s], s)), "stages": [], "within_noise": True,\n'
         '              "rule": "BLIND (protocol_small_red.py): the best greedy val accuracy, ties to the earliest step"}\n')


def blind_copy(dest: Path, rev: str = "HEAD") -> str:
    """``rev``'s tree in ``dest`` with the blind warm-start choice; the commit it came from."""
    commit = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    path = dest / "train" / "protocol.py"
    text = path.read_text()
    if text.count(CHOICE) != 1:
        raise SystemExit(f"expected one line {CHOICE.strip()!r} in {rev}'s train/protocol.py to replace")
    path.write_text(text.replace(CHOICE, BLIND))
    return commit


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD", help="the commit whose tree is copied")
    ap.add_argument("--results", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--reference", default=str(ROOT / "benchmarks" / "results"),
                    help="the folder whose protocol_small.json the check compares with (read when the rerun ends; "
                         "default: this checkout's)")
    args = ap.parse_args(argv)
    results = results_dir_arg(False, args.results)
    from train.protocol import choose_warm_start

    with tempfile.TemporaryDirectory(prefix="medvqa-red-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "run"
        tree.mkdir()
        commit = blind_copy(tree, args.rev)
        cmd = [sys.executable, "benchmarks/reproduce_protocol.py", "--out", str(out), "--results", args.reference]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(tree)}
        print(f"$ (in a copy of {commit[:12]} with the blind choice) {' '.join(['python', *cmd[1:]])}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        output = (proc.stdout + proc.stderr).replace(tmp, "<scratch>")
        builds = {}
        for path in sorted((out / "protocol").glob("warm_start_b*.json")):
            choice = json.loads(path.read_text())
            candidates = {int(s): c for s, c in choice["candidates"].items()}
            builds[path.stem.removeprefix("warm_start_b")] = {
                "blind_step": choice["chosen_step"], "probe_rule_step": choose_warm_start(candidates)["chosen_step"],
                "greedy_val": choice["val_by_step"],
                "forced": {s: c.get("forced") for s, c in sorted(candidates.items())}}
    lines = output.strip().splitlines()
    fail = next((line for line in lines if line.startswith("FAIL:")), None)
    reference = json.loads((Path(args.reference) / "protocol_small.json").read_text())["figures"]
    figures = {"exit_code": proc.returncode, "reference_commit": reference.get("git_commit"), "red": int(proc.returncode != 0 and fail is not None), "fail_line": fail or "",
               "source_commit": commit, "wall_min": round(wall / 60, 1)}
    for b, c in builds.items():
        figures[f"b{b}.blind_step"] = c["blind_step"]
        figures[f"b{b}.probe_rule_step"] = c["probe_rule_step"]
    shown = [line for line in lines if not line.startswith("[protocol] ") or "took off" in line][-24:]
    md = ["## The small protocol's check, red with the warm start chosen blind", "",
          f"`python benchmarks/protocol_small_red.py`: a copy of commit `{commit[:12]}` (`git archive`) in which "
          "`train/protocol.py` chooses the warm start by the best greedy val accuracy (ties to the earliest step; the "
          "probes still run), then in that copy `python benchmarks/reproduce_protocol.py --out <scratch>/run` as `.ci/run` "
          f"runs it, against the reference recorded at `{str(reference.get('git_commit'))[:12]}`: exit code "
          f"**{proc.returncode}** after {wall / 60:.1f} min wall.", "",
          "| tool build | greedy val by step | forced-call val by step | blind choice | the probe rule's choice |",
          "|---|---|---|---|---|"]
    for b, c in builds.items():
        md.append(f"| {b} | {c['greedy_val']} | { {s: round(v, 3) for s, v in c['forced'].items() if v is not None} } | "
                  f"{c['blind_step']} | {c['probe_rule_step']} |")
    md += ["", "Its last lines:", "", "```", *shown, "```"]
    record(TOPIC, "\n".join(md) + "\n", figures, command_line("protocol_small_red.py", argv), results)
    return 0 if figures["red"] else 1


if __name__ == "__main__":
    sys.exit(main())
