"""The learning protocol's figures (``benchmarks/bench_learning_protocol.py``) are re-derived from the
committed run files (``benchmarks/runs/protocol/<setting>``), checked against the stored held-out
answers, and are what the results file records."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from train.common import select_indices

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "runs" / "protocol"
SETTINGS = sorted(p.parent for p in RUNS.glob("*/protocol.json"))


@pytest.fixture()
def bench(load_benchmark):
    return load_benchmark("bench_learning_protocol")


def answers(folder: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.open(folder / "heldout_answers.jsonl.gz", "rt")]


def test_settings_are_committed():
    assert {p.name for p in SETTINGS} >= {"closed"}


@pytest.mark.parametrize("folder", SETTINGS, ids=lambda p: p.name)
def test_the_recorded_figures_are_what_the_run_files_say(bench, folder):
    fig, _ = bench.setting(folder)
    recorded = json.loads((ROOT / "benchmarks" / "results" / "learning_protocol.json").read_text())["figures"]
    native = {k: v for k, v in fig.items() if not k.startswith("verl") and k != "table"}
    for key, value in native.items():
        got = recorded[f"{folder.name}.{key}"]
        assert got == (pytest.approx(value) if isinstance(value, float) else value), key


@pytest.mark.parametrize("folder", SETTINGS, ids=lambda p: p.name)
def test_each_grpo_seed_is_5_seeds_of_stored_answers_independently_counted(folder):
    """Without the bench's helpers: the last held-out evaluation of every GRPO seed, from its stored
    answers, is the metric protocol.json reports, over as many questions as the protocol asked."""
    report = json.loads((folder / "protocol.json").read_text())
    per_seed = report["rows"]["grpo"]["per_seed"]
    assert len(per_seed) >= 5
    a = report["args"]
    heldout = select_indices(a["dataset"], "test", a["answer_types"], limit=a["eval_size"],
                             dataset_options=a["dataset_opt"])
    for seed, row in per_seed.items():
        rows = answers(folder / f"grpo_s{seed}")
        last = max(r["step"] for r in rows)
        final = [r for r in rows if r["step"] == last and r["tag"] is None]
        assert len(final) == len(heldout)  # every held-out question the protocol asked, once
        assert len({r["record_id"] for r in final}) == len(final)
        if report["metric"] == "eval/accuracy":
            assert row["metric"] == pytest.approx(sum(bool(r["correct"]) for r in final) / len(final))
        else:  # ARMed Avg: the mean over answers of the mean of their four open metrics
            scored = [r["open_metrics"] for r in final]
            assert row["metric"] == pytest.approx(sum(sum(m.values()) / len(m) for m in scored) / len(scored), abs=1e-3)
        assert row["distinct_answers"] == len({(r["answer"] or "").strip().lower() for r in final})


def test_a_stored_answer_that_disagrees_with_the_metrics_fails_the_check(bench, tmp_path):
    """Flip one stored verdict of a GRPO run's last evaluation: the accuracy recomputed from the answers
    no longer matches metrics.jsonl, and the check says so instead of recording it."""
    run = RUNS / "closed" / "grpo_s0"
    copy = tmp_path / "grpo_s0"
    shutil.copytree(run, copy)
    rows = answers(copy)
    last = max(r["step"] for r in rows)
    victim = next(r for r in rows if r["step"] == last and r["tag"] is None)
    victim["correct"] = not victim["correct"]
    (copy / "heldout_answers.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    bench.check_answers(run, "eval/accuracy")  # the committed files agree
    with pytest.raises(SystemExit, match="stored answers give eval/accuracy"):
        bench.check_answers(copy, "eval/accuracy")


def test_the_any_box_reading_is_counted_from_the_tools_recorded_outputs(bench):
    """The reading "yes iff the tool found anything", recounted here from tool_outputs.jsonl with a
    different parse (any "score" in the observation), is the accuracy the results record."""
    folder = RUNS / "closed_v1"  # one tool build: one tool_outputs.jsonl
    rows = [json.loads(line) for line in (folder / "tool_outputs.jsonl").read_text().splitlines()]
    presence = [r for r in rows if re.match(r"Is there a lesion in the .+\?", r["question"])]
    found = [("yes" if "score" in r["observation"] else "no") == r["gold"] for r in presence]
    recorded = json.loads((ROOT / "benchmarks" / "results" / "learning_protocol.json").read_text())["figures"]
    assert recorded["closed_v1.reading.questions"] == len(presence)
    assert recorded["closed_v1.reading.any.accuracy"] == pytest.approx(sum(found) / len(found))


def test_an_ablation_whose_episodes_never_answered_is_marked_not_counted_as_a_lost_image(bench, tmp_path):
    """A blank image can break a tiny policy's tool-call format (closed_independent seeds 3 and 4: every
    blank episode ends at the turn limit). The bench counts the share of ablated episodes that answered,
    from the stored answers, marks such seeds and gives the drop over the seeds that still answered."""
    folder = RUNS / "closed_independent"
    rows = answers(folder / "grpo_s3")
    last = max(r["step"] for r in rows if r["tag"] == "blank")
    blank = [r for r in rows if r["tag"] == "blank" and r["step"] == last]
    assert blank and all(r["answer"] is None for r in blank)  # what the committed answers hold
    assert bench.ablation_answered(folder / "grpo_s3", "blank") == 0.0
    assert bench.ablation_answered(folder / "grpo_s0", "blank") == 1.0
    assert bench.ablation_answered(folder / "more_sft_s0", "nonexistent") is None
    recorded = json.loads((ROOT / "benchmarks" / "results" / "learning_protocol.json").read_text())["figures"]
    assert recorded["closed_independent.grpo.blank_broken_which"] == "3, 4"
    report = json.loads((folder / "protocol.json").read_text())["rows"]["grpo"]["per_seed"]
    kept = [report[s]["blank_drop"] for s in ("0", "1", "2")]
    assert recorded["closed_independent.grpo.blank_drop_answered"] == pytest.approx(sum(kept) / len(kept))
    # one answered episode more than half on a copy of seed 3: no longer marked
    copy = tmp_path / "grpo_s3"
    shutil.copytree(folder / "grpo_s3", copy)
    for r in blank[: len(blank) // 2 + 1]:
        r["answer"] = "no"
    kept_rows = [r for r in rows if not (r["tag"] == "blank" and r["step"] == last)] + blank
    (copy / "heldout_answers.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in kept_rows).encode()))
    assert bench.ablation_answered(copy, "blank") > 0.5


def test_the_kl_choice_is_recomputed_from_its_stored_val_answers(bench, tmp_path):
    """The committed KL choice (closed_independent_kl) comes back from the candidates' stored val
    answers; a record that names another choice than its answers give fails the bench."""
    folder = RUNS / "closed_independent_kl"
    choice = json.loads((folder / "kl_choice.json").read_text())
    fig, _ = bench.kl_figures(folder, choice)
    recorded = json.loads((ROOT / "benchmarks" / "results" / "learning_protocol.json").read_text())["figures"]
    for key, value in fig.items():
        assert recorded[f"closed_independent_kl.{key}"] == value, key
    assert fig["kl.chosen"] == choice["chosen"] and fig["kl.questions"] == 200
    copy = tmp_path / "kl"
    shutil.copytree(folder, copy)
    (copy / "kl_choice.json").write_text(json.dumps({**choice, "chosen": 0.05}))
    with pytest.raises((SystemExit, FileNotFoundError)):
        bench.kl_figures(copy, {**choice, "chosen": 0.05})
    tampered = {**choice, "val": {**choice["val"], "0.05": 0.9}}
    with pytest.raises(SystemExit, match="stored val answers give"):
        bench.kl_figures(copy, tampered)
