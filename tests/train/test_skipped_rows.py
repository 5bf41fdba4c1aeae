"""A training run folder lists the rows its datasets skipped (issue 27): ``skipped_records.jsonl``
(empty when none) and the counts per split in ``args.json``; a split with every row skipped is an
error naming it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest
from PIL import Image

from medvqa_env.errors import DatasetError
from train.common import write_run_record


@dataclass
class _Args:
    dataset: str
    dataset_opt: list = field(default_factory=list)
    split: str = "train"
    eval_split: str = "test"


def _manifest(root, answers):
    root.mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), "uint8")).save(root / "i.png")
    rows = [{"id": f"{split}{i}", "split": split, "image": "i.png", "question": "Q?", "answer": a}
            for split, values in answers.items() for i, a in enumerate(values)]
    (root / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(root / "qa.jsonl")


def test_the_run_folder_lists_and_counts_each_splits_skipped_rows(tmp_path):
    path = _manifest(tmp_path / "data", {"train": ["yes", ".", "no"], "test": ["liver"]})
    out = tmp_path / "run"
    out.mkdir()
    record = write_run_record(out, _Args(path, ["on_invalid=skip"]), resumed_at=None)
    skipped = [json.loads(line) for line in (out / "skipped_records.jsonl").read_text().splitlines()]
    assert [(s["split"], s["record_id"], s["where"]) for s in skipped] == [("train", "train1", "line 2")]
    counts = json.loads((out / "args.json").read_text())["dataset_skipped"]
    assert counts == record["dataset_skipped"]
    assert counts["train"] == {"n_records": 2, "n_skipped": 1, "skipped_by_reason": {"empty answer once normalised": 1}}
    assert counts["test"]["n_skipped"] == 0


def test_a_split_with_every_row_skipped_is_an_error_naming_it(tmp_path):
    path = _manifest(tmp_path / "data", {"train": ["yes"], "test": ["。", "?"]})
    out = tmp_path / "run"
    out.mkdir()
    with pytest.raises(DatasetError, match=r"every row of dataset 'data' was skipped \(2 of 2 rows"):
        write_run_record(out, _Args(path, ["on_invalid=skip"]), resumed_at=None)
    assert len((out / "skipped_records.jsonl").read_text().splitlines()) == 2
