"""How far a rerun of the learning protocol lands from the record it replaces, run by run.

``python -m train.protocol`` rerun from a clean commit (docs/training.md) replaces a committed
record (``benchmarks/runs/protocol/<setting>``). This compares the two: the earlier one read from a
git revision that holds it (``--old-rev``), or another record in the working tree (``--against``:
the same protocol run on another machine, committed beside it), the new one from the working tree.
For every run folder (warm starts, GRPO seeds, baselines): whether its stored held-out answers are
the same, whether its logged trajectory is the same (timings and tool latencies left out), and its
final held-out figure in each; for every tool build, whether its content hash is the same and on
how many held-out questions its recorded observation is.

    python benchmarks/protocol_rerun.py --old-rev 41f55e8 --setting closed
    python benchmarks/protocol_rerun.py --against closed --setting closed_machine2
"""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project (medvqa_env.cli) when run as a script

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library

from bench_learning_protocol import FOUND_LABEL  # noqa: E402  (a box's label in a ground observation)
from figures import ROOT, command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)

VARIES = ("time/", "tools/latency")  # measured, not learned: a rerun's own


def read(rev: str | None, path: str) -> bytes | None:
    """``path`` (repository-relative) at git revision ``rev``, or in the working tree (``rev`` None)."""
    if rev is None:
        file = ROOT / path
        return file.read_bytes() if file.is_file() else None
    done = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True)
    return done.stdout if done.returncode == 0 else None


def answers(blob: bytes | None) -> list[str] | None:
    return None if blob is None else gzip.decompress(blob).decode().splitlines()


def trajectory(blob: bytes | None) -> list[dict] | None:
    if blob is None:
        return None
    rows = [json.loads(line) for line in blob.decode().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(VARIES)} for r in rows]


def final(rows: list[dict] | None, eval_file: bytes | None, metric: str) -> float | None:
    if eval_file is not None:
        return json.loads(eval_file)["metrics"].get(metric)
    held = [r[metric] for r in rows or () if metric in r]
    return held[-1] if held else None


def compare(earlier: tuple[str | None, str], new_folder: str, metric: str) -> dict[str, dict]:
    """Run by run: ``earlier`` is (git revision or None for the working tree, record folder)."""
    runs = sorted(p.name for p in (ROOT / new_folder).iterdir() if p.is_dir())
    out = {}
    for run in runs:
        sides = {}
        for side, (rev, folder) in (("old", earlier), ("new", (None, new_folder))):
            base = f"{folder}/{run}"
            stored = read(rev, f"{base}/heldout_answers.jsonl.gz") or read(rev, f"{base}/eval.answers.jsonl.gz")
            rows = trajectory(read(rev, f"{base}/metrics.jsonl"))
            sides[side] = {"answers": answers(stored), "rows": rows,
                           "final": final(rows, read(rev, f"{base}/eval.json"), metric)}
        old, new = sides["old"], sides["new"]
        if old["answers"] is None and old["final"] is None:
            continue  # a folder the earlier record did not have
        changed = sum(a != b for a, b in zip(old["answers"] or [], new["answers"] or []))
        out[run] = {"old": old["final"], "new": new["final"], "same_answers": old["answers"] == new["answers"],
                    "answer_rows_changed": changed, "same_trajectory": old["rows"] == new["rows"]}
    return out


def tool_builds(earlier: tuple[str | None, str], new_folder: str) -> dict[str, dict]:
    """Per tool build: the same content hash in both records? The same recorded observation
    (``tool_outputs_b<k>.jsonl``) on how many of the held-out questions?"""
    idents = {side: json.loads(read(rev, f"{folder}/protocol.json")).get("identity", {}).get("tools", {})
              for side, (rev, folder) in (("old", earlier), ("new", (None, new_folder)))}
    out = {}
    for tool, builds in idents["new"].items():
        for build, entry in builds.items():
            before = idents["old"].get(tool, {}).get(build, {})
            rows = {}
            for side, (rev, folder) in (("old", earlier), ("new", (None, new_folder))):
                blob = read(rev, f"{folder}/tool_outputs_b{build}.jsonl")
                rows[side] = {r["record_id"]: r["observation"] for r in map(json.loads, (blob or b"").decode().splitlines())}
            shared = rows["old"].keys() & rows["new"].keys()
            labels = {side: {q: sorted(FOUND_LABEL.findall(rows[side][q])) for q in shared} for side in rows}
            known = before.get("content_hash") is not None and entry.get("content_hash") is not None
            out[f"{tool}.b{build}"] = {"same_hash": before["content_hash"] == entry["content_hash"] if known else None,
                                       "old_hash": before.get("content_hash"), "new_hash": entry.get("content_hash"),
                                       "questions": len(shared),
                                       "same_observations": sum(rows["old"][q] == rows["new"][q] for q in shared),
                                       # what a policy can read off: the labels of the boxes found, and whether any was
                                       "same_labels": sum(labels["old"][q] == labels["new"][q] for q in shared),
                                       "same_found": sum(bool(labels["old"][q]) == bool(labels["new"][q]) for q in shared)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    earlier = p.add_mutually_exclusive_group(required=True)
    earlier.add_argument("--old-rev", default=None, help="a git revision holding the earlier record")
    earlier.add_argument("--against", default=None,
                         help="another setting in the working tree to compare with (benchmarks/runs/protocol/<against>)")
    p.add_argument("--setting", default="closed", help="benchmarks/runs/protocol/<setting>")
    p.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    a = p.parse_args(argv)
    folder = f"benchmarks/runs/protocol/{a.setting}"
    old = (a.old_rev, folder) if a.old_rev else (None, f"benchmarks/runs/protocol/{a.against}")
    identity = {side: json.loads(read(rev, f"{f}/protocol.json"))["identity"]["code"]
                for side, (rev, f) in (("old", old), ("new", (None, folder)))}
    metric = json.loads(read(None, f"{folder}/protocol.json"))["metric"]
    runs = compare(old, folder, metric)
    builds = tool_builds(old, folder)
    grpo = {side: [r[side] for name, r in runs.items() if name.startswith("grpo_s")] for side in ("old", "new")}
    fig = {"old_commit": identity["old"]["git_commit"], "new_commit": identity["new"]["git_commit"],
           "runs": len(runs), "same_answers": sum(r["same_answers"] for r in runs.values()),
           "same_trajectory": sum(r["same_trajectory"] for r in runs.values()),
           "same_final": sum(r["old"] == r["new"] for r in runs.values()),
           "grpo.runs": len(grpo["new"]), "grpo.same_final": sum(o == n for o, n in zip(grpo["old"], grpo["new"])),
           "grpo.same_trajectory": sum(r["same_trajectory"] for n, r in runs.items() if n.startswith("grpo_s")),
           "grpo.old_mean": statistics.mean(grpo["old"]), "grpo.new_mean": statistics.mean(grpo["new"]),
           "grpo.mean_shift": statistics.mean(grpo["new"]) - statistics.mean(grpo["old"]),
           "grpo.largest_shift": max(abs(n - o) for o, n in zip(grpo["old"], grpo["new"]))}
    fig.update({f"run.{name}.{k}": r[k] for name, r in runs.items() for k in ("old", "new", "answer_rows_changed")
                if r[k] is not None})
    fig.update({f"tool.{name}.{k}": v for name, b in builds.items() for k, v in b.items()})
    fig["tools.builds"] = len(builds)
    fig["tools.same_hash"] = sum(b["same_hash"] is True for b in builds.values())
    for side in ("old", "new"):  # flat figures: a list joined by spaces, a mapping as JSON
        for k, v in (identity[side].get("machine") or {}).items():
            fig[f"machine.{side}.{k}"] = " ".join(v) if isinstance(v, list) else json.dumps(v) if isinstance(v, dict) else v
    shown_machine = {side: ", ".join(f"{k} {v}" for k, v in fig.items() if k.startswith(f"machine.{side}.")
                                     ).replace(f"machine.{side}.", "") or "not recorded" for side in ("old", "new")}
    earlier_text = (f"read from git `{a.old_rev}`" if a.old_rev else f"`benchmarks/runs/protocol/{a.against}`")
    title = (f"## The `{a.setting}` protocol record against `{a.against}` (`benchmarks/protocol_rerun.py --against`)"
             if a.against else f"## A rerun of the {a.setting.upper()} protocol against the record it replaces "
             "(`benchmarks/protocol_rerun.py`)")
    lines = [title, "",
             f"Earlier record: commit `{fig['old_commit'][:10]}` ({earlier_text}); rerun: commit "
             f"`{fig['new_commit'][:10]}`. Same answers: every stored held-out answer row identical; same "
             "trajectory: every logged figure identical but timings.", "",
             f"| run | {metric} before | after | same answers | answer rows changed | same trajectory |",
             "|---|---:|---:|---|---:|---|"]
    shown = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731  (answer_baselines: answers, no figure)
    for name, r in runs.items():
        lines.append(f"| {name} | {shown(r['old'])} | {shown(r['new'])} | {'yes' if r['same_answers'] else 'no'} | "
                     f"{r['answer_rows_changed']} | {'yes' if r['same_trajectory'] else 'no'} |")
    lines += ["", "| tool build | content hash before | after | held-out questions | same observation text | "
              "same labels found | same found / nothing |", "|---|---|---|---:|---:|---:|---:|"]
    for name, b in builds.items():
        hashes = [f"`{h[:12]}`" if h else "not recorded" for h in (b["old_hash"], b["new_hash"])]
        lines.append(f"| {name} | {hashes[0]} | {hashes[1]} | "
                     f"{b['questions']} | {b['same_observations']} | {b['same_labels']} | {b['same_found']} |")
    for side in ("old", "new"):
        lines.append(f"\nMachine, {'before' if side == 'old' else 'after'}: {shown_machine[side]}.")
    lines += ["", f"{fig['same_answers']} of {fig['runs']} runs give the same answers; GRPO's mean moves "
              f"{fig['grpo.mean_shift']:+.3f} ({fig['grpo.old_mean']:.3f} → {fig['grpo.new_mean']:.3f}).", ""]
    record(f"protocol_rerun_{a.setting}", "\n".join(lines), fig, command_line("protocol_rerun.py", argv),
           results_dir_arg(False, a.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
