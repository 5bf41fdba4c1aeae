"""Issue 12: records are validated strictly and loudly (file, line, record), split names have
aliases everywhere, paths survive a ``chdir``, and the JSONL loader speaks like the others."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from medvqa_env.datasets import load_dataset
from medvqa_env.errors import ConfigError, DatasetError
from medvqa_env.records import Annotations, AnswerType, VQADataset, VQARecord


def _png(path: Path, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(path)


def _manifest(folder: Path, rows: list[dict], name: str = "qa.jsonl") -> Path:
    _png(folder / "a.png")
    path = folder / name
    path.write_text("".join(json.dumps({"image": "a.png", **r}) + "\n" for r in rows))
    return path


# -- split names -----------------------------------------------------------------------------------
@pytest.mark.parametrize("alias", ["val", "validation", "validate", "valid", "dev", "Validation"])
def test_jsonl_split_aliases_are_one_split(tmp_path, alias):
    rows = [{"id": "v1", "question": "q?", "answer": "yes", "split": "validation"},
            {"id": "v2", "question": "q?", "answer": "no", "split": "dev"},
            {"id": "t1", "question": "q?", "answer": "no", "split": "test"}]
    ds = load_dataset(str(_manifest(tmp_path, rows)), split=alias)
    assert [r.id for r in ds] == ["v1", "v2"] and {r.split for r in ds} == {"val"}


def test_a_split_no_row_has_is_an_error_naming_the_splits(tmp_path):
    path = _manifest(tmp_path, [{"id": "a", "question": "q?", "answer": "yes", "split": "train"}])
    with pytest.raises(DatasetError, match=r"no row has split 'test'; the manifest's splits are \['train'\]"):
        load_dataset(str(path), split="test")


@pytest.mark.data
def test_vqa_rad_refuses_an_unknown_split_and_accepts_case(vqa_rad_root):
    with pytest.raises(DatasetError, match=r"VQA-RAD splits are \['test', 'train'\], got 'val'"):
        load_dataset("vqa_rad", split="val", root=vqa_rad_root)
    assert len(load_dataset("vqa_rad", split="TEST", root=vqa_rad_root, limit=3)) == 3


def test_hf_parquet_validation_folder_answers_to_dev(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    _png(tmp_path / "hf" / "x.png")
    (tmp_path / "hf" / "validation").mkdir()
    pq.write_table(pa.table({"image": ["x.png"], "question": ["Is it?"], "answer": ["yes"]}),
                   tmp_path / "hf" / "validation" / "data.parquet")
    ds = load_dataset("hf", path=tmp_path / "hf", split="dev", cache_dir=tmp_path / "c")
    assert len(ds) == 1 and ds[0].split == "val"


# -- strict records, each message naming file, line and record --------------------------------------
@pytest.mark.parametrize("row, message", [
    ({"id": "m1", "question": "Which?", "options": ["CT", "MRI"], "answer": "E"},
     r"line 2: record 'm1': MCQ answer 'E' is not one of its options \['A', 'B'\]"),
    ({"id": "m2", "question": "Which?", "answer_type": "MCQ", "answer": "A"},
     r"line 2: record 'm2': answer_type is MCQ but the row has no options"),
    ({"id": "m3", "question": "Which?", "options": ["CT"], "answer": "A"},
     r"line 2: record 'm3' is MCQ but has 1 option"),
    ({"id": "l1", "question": "Which side?", "answer": ["left", "right"]},
     r"line 2: record 'l1': answer is a list of 2 values \['left', 'right'\]"),
    ({"id": "e1", "question": "  ", "answer": "yes"}, r"line 2: record 'e1' has an empty question"),
    ({"id": "e2", "question": "Is it?", "answer": ""}, r"line 2: record 'e2': the answer is empty"),
    ({"id": "e3", "question": None, "answer": "yes"}, r"line 2: record 'e3': expected a question string"),
    ({"id": "ok", "question": "q?", "answer": "no"}, r"line 2: record 'ok': duplicate id \(first used on line 1\)"),
    ({"id": "b1", "question": "q?", "answer": "yes", "annotations": {"boxes": [{"label": "x", "bbox": [1, 2]}]}},
     r"line 2: record 'b1': annotations.boxes\[0\]: box 'x': expected bbox \[x0, y0, x1, y1\]"),
])
def test_bad_rows_are_refused_naming_file_line_and_record(tmp_path, row, message):
    path = _manifest(tmp_path, [{"id": "ok", "question": "q?", "answer": "yes"}, row])
    with pytest.raises(DatasetError, match=message) as info:
        load_dataset(str(path))
    assert str(path) in str(info.value)


def test_mcq_answers_given_as_letter_or_option_text_become_the_letter(tmp_path):
    path = _manifest(tmp_path, [{"id": "a", "question": "Which?", "options": ["CT", "MRI"], "answer": "mri"},
                                {"id": "b", "question": "Which?", "options": {"a": "CT", "b": "MRI"}, "answer": "a"},
                                {"id": "c", "question": "Side?", "answer": ["left"]}])
    ds = load_dataset(str(path))
    assert [r.answer for r in ds] == ["B", "A", "left"]
    assert ds[0].answer_type is AnswerType.MCQ and ds[2].answer_type is AnswerType.OPEN


def test_record_checks_hold_outside_loaders_too():
    with pytest.raises(DatasetError, match=r"record 'x': MCQ answer 'C' is not one of its options \['A', 'B'\]"):
        VQARecord("x", ("a.png",), "q?", "C", "MCQ", "d", options={"A": "1", "B": "2"})
    with pytest.raises(DatasetError, match="record 'x' has an empty answer"):
        VQARecord("x", ("a.png",), "q?", " ", "OPEN", "d")
    r = VQARecord("x", ("a.png",), "q?", "yes", "CLOSED", "d")
    with pytest.raises(DatasetError, match=r"duplicate record id 'x' \(records 0 and 2\)"):
        VQADataset([r, VQARecord("y", ("a.png",), "q?", "no", "CLOSED", "d"), r])


def test_a_directory_given_as_the_image_is_called_a_directory(tmp_path):
    (tmp_path / "scans").mkdir()
    path = _manifest(tmp_path, [{"id": "d1", "image": "scans", "question": "q?", "answer": "yes"}])
    with pytest.raises(DatasetError, match=r"line 1: record 'd1': image '.*scans' is a directory, not an image file"):
        load_dataset(str(path))


def test_image_fragments_pass_through_the_loader(tmp_path):
    path = _manifest(tmp_path, [{"id": "f", "image": "a.png#window=40,400", "question": "q?", "answer": "yes"}])
    assert load_dataset(str(path))[0].image_paths == (str(tmp_path / "a.png") + "#window=40,400",)
    bad = _manifest(tmp_path, [{"id": "g", "image": "a.png#windw=40,400", "question": "q?", "answer": "yes"}], "b.jsonl")
    with pytest.raises(DatasetError, match=r"b\.jsonl: line 1: record 'g': image '.*a\.png#windw=40,400' has a bad "
                                           r"fragment: unknown image option 'windw'"):
        load_dataset(str(bad))


# -- paths, names, options -----------------------------------------------------------------------
def test_loaded_paths_survive_a_chdir(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    _manifest(folder, [{"id": "a", "question": "q?", "answer": "yes",
                        "annotations": {"masks": [{"label": "m", "path": "a.png"}]}}])
    monkeypatch.chdir(tmp_path)
    ds = load_dataset("data/qa.jsonl", root="data")  # both relative to the cwd
    monkeypatch.chdir(tmp_path.parent)  # a notebook's %cd
    assert os.path.isfile(ds[0].image_paths[0]) and os.path.isfile(ds[0].annotations.masks[0].path)


@pytest.mark.data
def test_vqa_rad_paths_survive_a_chdir(vqa_rad_root, monkeypatch):
    monkeypatch.chdir(vqa_rad_root.parent)
    ds = load_dataset("vqa_rad", split="test", root=vqa_rad_root.name, limit=2)
    monkeypatch.chdir("/")
    assert all(os.path.isfile(r.image_paths[0]) for r in ds)


def test_dataset_name_is_never_the_file_name(tmp_path):
    path = _manifest(tmp_path / "vqa_rad", [{"id": "a", "question": "q?", "answer": "yes"}])
    assert load_dataset(str(path)).name == "vqa_rad" and load_dataset(str(path))[0].dataset == "vqa_rad"
    assert load_dataset(str(path), dataset="rad").name == "rad"
    tagged = _manifest(tmp_path / "x", [{"id": "a", "question": "q?", "answer": "yes", "dataset": "slake"}])
    assert load_dataset(str(tagged)).name == "slake"


def test_jsonl_root_option_and_its_deprecated_alias(tmp_path):
    _png(tmp_path / "imgs" / "a.png")
    (tmp_path / "m").mkdir()
    path = tmp_path / "m" / "qa.jsonl"
    path.write_text(json.dumps({"id": "a", "image": "a.png", "question": "q?", "answer": "yes"}) + "\n")
    assert load_dataset(str(path), root=tmp_path / "imgs")[0].image_paths == (str(tmp_path / "imgs" / "a.png"),)
    with pytest.warns(DeprecationWarning, match="use root="):
        assert len(load_dataset(str(path), image_root=tmp_path / "imgs")) == 1
    with pytest.raises(ConfigError, match="image_root is the old name of root"):
        load_dataset(str(path), root=tmp_path, image_root=tmp_path / "imgs")


def test_any_record_round_trips_through_a_jsonl_line(tmp_path):
    _png(tmp_path / "a.png")
    rec = VQARecord("r1", (str(tmp_path / "a.png"),), "How many?", "B", "MCQ", "mine", split="val",
                    options={"A": "1", "B": "2"}, modality="CT", organ="ABD", question_type="COUNT",
                    annotations=Annotations.from_dict({"boxes": [{"label": "lesion", "bbox": [1, 2, 3, 4]}],
                                                       "labels": ["lesion"]}),
                    metadata={"source": "x"})
    (tmp_path / "qa.jsonl").write_text(json.dumps(rec.to_dict()) + "\n")
    assert load_dataset(str(tmp_path / "qa.jsonl"), split="val")[0] == rec


def test_docs_datasets_examples_load_as_documented(tmp_path):
    """The example JSONL lines in docs/datasets.md load, one per answer type, with their annotations."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "datasets.md").read_text()
    block = doc.split("```jsonl\n", 1)[1].split("```", 1)[0]
    rows = [json.loads(line) for line in block.splitlines() if line.strip()]
    for row in rows:  # the loader checks that files exist; these stand in for real scans
        for ref in row["image_paths"] + [m["path"] for m in row.get("annotations", {}).get("masks", [])]:
            (tmp_path / ref.split("#")[0]).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / ref.split("#")[0]).write_bytes(b"stand-in")
    (tmp_path / "qa.jsonl").write_text(block)
    ds = load_dataset(str(tmp_path / "qa.jsonl"), split=None)
    assert sorted(r.answer_type.value for r in ds) == ["CLOSED", "MCQ", "OPEN"]
    assert ds[1].image_paths[0].endswith("case42.dcm#window=40,400") and ds[1].annotations.masks[0].path.startswith("/")
    assert ds[0].annotations.boxes[0].label == "pneumothorax" and ds[2].options["B"] == "MRI" and ds[2].split == "val"
