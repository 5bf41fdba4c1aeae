"""Nothing silently unscored: ``eval.run`` exits 1 when no episode was scored or too many recorded
an error, the summary and the reports lead with the error count and kinds, and the rows a loader
skipped (``on_invalid=skip``) are listed in the run folder and counted in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

BASE = ["--agent", "scripted", "--workers", "0", "--no-open-metrics", "--no-progress", "--bootstrap", "0"]


def write_manifest(root: Path, n: int) -> Path:
    """``n`` CLOSED questions ``q00``.., one real 32x32 PNG each (``img/<i>.png``)."""
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(n):
        Image.fromarray((np.random.default_rng(i).random((32, 32, 3)) * 255).astype("uint8")).save(root / "img" / f"{i}.png")
        rows.append({"id": f"q{i:02d}", "image_paths": [f"img/{i}.png"], "question": f"Question {i}?",
                     "answer_type": "CLOSED", "answer": "yes"})
    path = root / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _break_images(manifest: Path, ids: set[str]) -> None:
    """Replace the images of ``ids`` with text files under the same (``.png``) name: they exist,
    so the default load check passes, and cannot be decoded, so ``reset`` fails."""
    for line in manifest.read_text().splitlines():
        row = json.loads(line)
        if row["id"] in ids:
            (manifest.parent / row["image_paths"][0]).write_text("this is not a picture\n")


def test_a_run_that_scores_nothing_exits_1(tmp_path, capsys):
    from eval.run import main

    manifest = write_manifest(tmp_path / "data", n=5)
    _break_images(manifest, {f"q{i:02d}" for i in range(5)})
    out = tmp_path / "run"
    assert main(["--dataset", str(manifest), "--out", str(out), *BASE]) == 1
    err = capsys.readouterr().err
    assert "medvqa-eval: no episode was scored: 5 of 5 episodes recorded an error (dataset_error 5)" in err
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary)[:6] == ["schema_version", "n_episodes", "n_scored", "n_errors", "errors_by_kind",
                                 "n_skipped_records"]
    assert (summary["n_episodes"], summary["n_scored"], summary["n_errors"]) == (5, 0, 5)
    assert summary["errors_by_kind"] == {"dataset_error": 5}
    report = (out / "report.md").read_text().splitlines()
    assert report[2] == "**Errors: 5 of 5 episodes (dataset_error 5); 0 scored. Dataset rows skipped by the loader: 0.**"
    assert "Errors: 5 of 5 episodes (dataset_error 5); 0 scored." in (out / "report.html").read_text()
    # the decode check finds them at load instead: a user error (2) naming the first and the count
    assert main(["--dataset", str(manifest), "--out", str(tmp_path / "run2"), "--dataset-opt", "check_images=decode",
                 *BASE]) == 2
    err = capsys.readouterr().err
    assert "line 1: record 'q00': image" in err and "cannot be decoded" in err
    assert "(5 of 5 records have an unreadable image; on_invalid='skip' loads the others" in err


def test_failure_share_over_max_failure_rate_exits_1(tmp_path, capsys):
    from eval.run import main

    manifest = write_manifest(tmp_path / "data", n=6)
    _break_images(manifest, {"q01"})
    args = ["--dataset", str(manifest), *BASE]
    assert main([*args, "--out", str(tmp_path / "a")]) == 1  # 1 of 6 > 0.05
    err = capsys.readouterr().err.splitlines()
    assert f"medvqa-eval: 1 of 6 episodes (16.7%) failed, over --max-failure-rate 0.05 (dataset_error 1); see the " \
           f"failures in {tmp_path / 'a' / 'report.md'}" in err
    # the file is named, on stderr as it happens and at the end
    assert sum(f"dataset_error: file {manifest.parent / 'img' / '1.png'}: " in line for line in err) == 2, err
    assert main([*args, "--out", str(tmp_path / "b"), "--max-failure-rate", "0.2"]) == 0
    assert main([*args, "--out", str(tmp_path / "b2"), "--max-error-rate", "0.2"]) == 0  # the old name
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert (summary["n_episodes"], summary["n_scored"], summary["n_errors"]) == (6, 5, 1)
    assert (tmp_path / "b" / "report.md").read_text().splitlines()[2] == \
        "**Errors: 1 of 6 episodes (dataset_error 1); 5 scored. Dataset rows skipped by the loader: 0.**"
    assert main([*args, "--out", str(tmp_path / "c"), "--limit", "1"]) == 0  # q00 alone: nothing wrong


def test_skipped_dataset_rows_are_listed_in_the_run_folder_and_counted(tmp_path, capsys):
    from eval.run import main

    manifest = write_manifest(tmp_path / "data", n=6)
    _break_images(manifest, {"q02"})
    with manifest.open("a") as f:
        f.write('{"id": "q99", "image_paths": ["img/0.png"], "question": "Empty?", "answer": ""}\n')
    out = tmp_path / "run"
    assert main(["--dataset", str(manifest), "--out", str(out), "--dataset-opt", "on_invalid=skip",
                 "--dataset-opt", "check_images=decode", *BASE]) == 0
    skipped = [json.loads(line) for line in (out / "skipped_records.jsonl").read_text().splitlines()]
    assert [(s["source"], s["where"], s["record_id"]) for s in skipped] == [
        (str(manifest), "line 3", "q02"), (str(manifest), "line 7", "q99")]
    assert "cannot be decoded" in skipped[0]["reason"] and "empty" in skipped[1]["reason"]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["n_episodes"], summary["n_errors"], summary["n_skipped_records"]) == (5, 0, 2)
    assert summary["skipped_by_reason"] == {"image cannot be decoded": 1, "the answer is empty": 1}
    run = json.loads((out / "run.json").read_text())
    assert run["dataset_provenance"]["n_skipped"] == 2 and "skipped" not in run["dataset_provenance"]
    assert run["dataset_provenance"]["n_images_decoded"] == 5
    assert "Dataset rows skipped by the loader: 2" in (out / "report.md").read_text().splitlines()[2]
    # rerun with the rows fixed: the old list goes
    (manifest.parent / "img" / "2.png").write_bytes((manifest.parent / "img" / "0.png").read_bytes())
    manifest.write_text("".join(manifest.read_text().splitlines(True)[:6]))
    assert main(["--dataset", str(manifest), "--out", str(tmp_path / "fixed"), "--dataset-opt", "on_invalid=skip",
                 *BASE]) == 0
    assert (tmp_path / "fixed" / "skipped_records.jsonl").read_text() == ""  # written down: none skipped


def test_a_dataset_whose_every_row_was_skipped_names_itself_and_exits_nonzero(tmp_path, capsys):
    """Issue 27: the loader skipped all rows -> not a bare "no records", but what happened, with the list."""
    from eval.run import main

    manifest = write_manifest(tmp_path / "data", n=3)
    manifest.write_text(manifest.read_text().replace('"answer": "yes"', '"answer": "."'))
    out = tmp_path / "run"
    assert main(["--dataset", str(manifest), "--out", str(out), "--dataset-opt", "on_invalid=skip", *BASE]) == 2
    err = capsys.readouterr().err
    assert "every row of dataset 'data' was skipped (3 of 3 rows, on_invalid='skip'): empty answer once normalised 3" in err
    assert f"every row is listed in {out / 'skipped_records.jsonl'}" in err
    skipped = [json.loads(line) for line in (out / "skipped_records.jsonl").read_text().splitlines()]
    assert [s["record_id"] for s in skipped] == ["q00", "q01", "q02"]


def test_failures_are_named_as_they_happen_at_most_ten_then_counted(tmp_path, capsys):
    from eval.run import main

    manifest = write_manifest(tmp_path / "data", n=12)
    _break_images(manifest, {f"q{i:02d}" for i in range(12)})
    assert main(["--dataset", str(manifest), "--out", str(tmp_path / "run"), *BASE]) == 1
    err = capsys.readouterr().err.splitlines()
    live = [line for line in err if line.startswith("medvqa-eval: failure: dataset_error: file ")]
    assert len(live) == 10 and "medvqa-eval: more than 10 failure sources; the rest are counted and listed at the end" in err
    at_end = [line for line in err if line.startswith("medvqa-eval: dataset_error: file ")]
    assert len(at_end) == 12  # every source named once the run is over
