"""The VQA-Med loader on small copies of the published 2019 / 2021 layouts, and dataset mixtures."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from medvqa_env.datasets import load_dataset
from medvqa_env.datasets.mixture import mix
from medvqa_env.errors import ConfigError, DatasetError
from medvqa_env.records import AnswerType, VQADataset, VQARecord


def _jpg(path: Path, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(path)


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# -- VQA-Med 2019 ----------------------------------------------------------------------------------
@pytest.fixture
def vqamed2019(tmp_path) -> Path:
    root = tmp_path / "VQA-Med-2019"
    train = root / "ImageClef-2019-VQA-Med-Training"
    for img in ("synpic100", "synpic101"):
        _jpg(train / "Train_images" / f"{img}.jpg")
    _write(train / "All_QA_Pairs_train.txt", ["synpic100|what modality is shown?|ct w/contrast (iv)",
                                              "synpic100|is this an mri image?|no",
                                              "synpic101|in what plane is this image taken?|axial"])
    _write(train / "QAPairsByCategory" / "C1_Modality_train.txt",
           ["synpic100|what modality is shown?|ct w/contrast (iv)", "synpic100|is this an mri image?|no"])
    _write(train / "QAPairsByCategory" / "C2_Plane_train.txt", ["synpic101|in what plane is this image taken?|axial"])
    val = root / "ImageClef-2019-VQA-Med-Validation"
    _jpg(val / "Val_images" / "synpic200.jpg")
    _write(val / "All_QA_Pairs_val.txt", ["synpic200|what organ system is shown?|skull and contents"])
    test = root / "VQAMed2019Test"
    for img in ("synpic54143", "synpic35171"):
        _jpg(test / "VQAMed2019_Test_Images" / f"{img}.jpg")
    _write(test / "VQAMed2019_Test_Questions_w_Ref_Answers.txt", [
        "synpic54143|abnormality|what is the primary abnormality in this image?|anaplastic oligodendroglioma#multi-cystic complex mass",
        "synpic35171|abnormality|what is abnormal in the ct scan?|(angioinvasive aspergillosis with) septic cerebral emboli",
    ])
    return root


def test_vqamed_2019_layout(vqamed2019):
    train = load_dataset("vqamed", split="train", root=vqamed2019)
    assert [r.id for r in train] == ["vqamed2019_train_synpic100_0", "vqamed2019_train_synpic100_1",
                                     "vqamed2019_train_synpic101_0"]
    assert [r.question_type for r in train] == ["modality", "modality", "plane"]
    assert [r.answer_type for r in train] == [AnswerType.OPEN, AnswerType.CLOSED, AnswerType.OPEN]
    assert train[0].answer == "ct w/contrast (iv)" and train.name == "vqamed2019" and train[0].dataset == "vqamed2019"
    assert train[0].image_paths[0].endswith("Train_images/synpic100.jpg")
    val = load_dataset("vqamed", split="validation", root=vqamed2019)
    assert [(r.split, r.answer) for r in val] == [("val", "skull and contents")]
    test = load_dataset("vqamed", split="test", root=vqamed2019)
    assert test[0].answer == "anaplastic oligodendroglioma" and test[0].question_type == "abnormality"
    assert test[0].metadata["answer_alternatives"] == ["anaplastic oligodendroglioma", "multi-cystic complex mass"]
    assert test[1].answer == "(angioinvasive aspergillosis with) septic cerebral emboli"  # as published
    assert test[1].metadata["answer_alternatives"][1:] == ["angioinvasive aspergillosis with septic cerebral emboli",
                                                          "septic cerebral emboli"]


def test_vqamed_errors_name_file_line_and_record(vqamed2019):
    (vqamed2019 / "VQAMed2019Test" / "VQAMed2019_Test_Images" / "synpic35171.jpg").unlink()
    with pytest.raises(DatasetError, match=r"Ref_Answers\.txt: line 2: record 'vqamed2019_test_synpic35171_0': "
                                           r"image .*synpic35171\.jpg' does not exist"):
        load_dataset("vqamed", split="test", root=vqamed2019)
    _write(vqamed2019 / "ImageClef-2019-VQA-Med-Validation" / "All_QA_Pairs_val.txt", ["synpic200|no answer"])
    with pytest.raises(DatasetError, match=r"All_QA_Pairs_val\.txt: line 1: expected 3 fields"):
        load_dataset("vqamed", split="val", root=vqamed2019)
    skipped = load_dataset("vqamed", split="val", root=vqamed2019, on_invalid="skip")
    assert len(skipped) == 0 and skipped.provenance.skipped[0]["where"] == "line 1"
    assert skipped.provenance.skipped[0]["source"].endswith("All_QA_Pairs_val.txt")
    test = load_dataset("vqamed", split="test", root=vqamed2019, on_invalid="skip")
    assert [r.id for r in test] == ["vqamed2019_test_synpic54143_0"]
    assert test.provenance.skipped[0]["record_id"] == "vqamed2019_test_synpic35171_0"
    with pytest.raises(DatasetError, match="VQA-Med 2021 train: 'VQAnswering_2020_Train_QA_pairs.txt' not found"):
        load_dataset("vqamed", split="train", root=vqamed2019, edition=2021)
    with pytest.raises(DatasetError, match=r"editions are \[2019, 2021\]"):
        load_dataset("vqamed", root=vqamed2019, edition=2020)


# -- VQA-Med 2021 ----------------------------------------------------------------------------------
def test_vqamed_2021_layout(tmp_path):
    root = tmp_path / "vqamed21"
    tv = root / "VQA-Med-2020-Task1-VQAnswering-TrainVal-Sets"
    _jpg(tv / "VQAMed2020-VQAnswering-TrainingSet" / "VQAnswering_2020_Train_images" / "synpic1.jpg")
    _write(tv / "VQAMed2020-VQAnswering-TrainingSet" / "VQAnswering_2020_Train_QA_pairs.txt",
           ["synpic1|what is abnormal in the x-ray?|pneumothorax"])
    _jpg(tv / "VQAMed2020-VQAnswering-ValidationSet" / "VQAnswering_2020_Val_images" / "synpic2.jpg")
    _write(tv / "VQAMed2020-VQAnswering-ValidationSet" / "VQAnswering_2020_Val_QA_Pairs.txt",
           ["synpic2|is this image abnormal?|yes"])
    val = root / "VQA-Med-2021-Tasks-1-2-NewValidationSets"
    _jpg(val / "ImageCLEF-2021-VQA-Med-New-Validation-Images" / "synpic3.jpg")
    _write(val / "VQA-Med-2021-VQAnswering-Task1-New-ValidationSet.txt", ["synpic3|what is the primary abnormality?|lipoma"])
    test = root / "Task1-VQA-2021-TestSet-w-GroundTruth"
    _jpg(test / "images" / "VQA-500-Images" / "synpic42072.jpg")
    _write(test / "Task1-VQA-2021-TestSet-Questions.txt", ["synpic42072|what is most alarming about this image?"])
    _write(test / "Task1-VQA-2021-TestSet-ReferenceAnswers.txt",
           ['synpic42072|avascular necrosis|"a ""drowned"" lobe"'])
    train = load_dataset("vqamed", split="train", root=root, edition=2021)
    assert [r.answer for r in train] == ["pneumothorax", "yes"]  # 2020 train + val
    assert [r.answer for r in load_dataset("vqamed", split="val", root=root, edition=2021)] == ["lipoma"]
    t = load_dataset("vqamed", split="test", root=root, edition=2021)[0]
    assert (t.id, t.answer, t.answer_type) == ("vqamed2021_test_synpic42072_0", "avascular necrosis", AnswerType.OPEN)
    assert t.metadata["answer_alternatives"] == ["avascular necrosis", 'a "drowned" lobe']


# -- mixtures --------------------------------------------------------------------------------------
def _ds(name: str, n: int, tmp_path: Path, kind: str = "CLOSED") -> VQADataset:
    _jpg(tmp_path / "m.png")
    return VQADataset([VQARecord(f"{name}_{i}", (str(tmp_path / "m.png"),), "q?", "yes" if kind == "CLOSED" else "lung",
                                 kind, name) for i in range(n)], name=name)


def test_combined_mixture_keeps_every_record_in_order(tmp_path):
    a, b = _ds("a", 3, tmp_path), _ds("b", 2, tmp_path)
    m = mix([a, b], name="both")
    assert [r.id for r in m] == ["a_0", "a_1", "a_2", "b_0", "b_1"] and m.name == "both"


def test_weighted_mixture_draws_by_weight_interleaved_and_seeded(tmp_path):
    a, b = _ds("a", 50, tmp_path), _ds("b", 10, tmp_path)
    m = mix([a, b], weights=[2, 1], size=30, seed=1)
    assert Counter(r.dataset for r in m) == {"a": 20, "b": 10}
    assert all(Counter(r.dataset for r in m[:n])["a"] in (2 * n // 3, 2 * n // 3 + 1) for n in range(1, 31))
    assert [r.id for r in m] == [r.id for r in mix([a, b], weights=[2, 1], size=30, seed=1)]
    assert [r.id for r in m] != [r.id for r in mix([a, b], weights=[2, 1], size=30, seed=2)]
    assert len(mix([a, b], weights=[1, 1])) == 20  # as large as possible without repeating b


def test_weighted_mixture_repeats_a_small_component_with_new_ids(tmp_path):
    m = mix([_ds("a", 10, tmp_path), _ds("b", 3, tmp_path)], weights=[1, 1], size=20)
    b = [r for r in m if r.dataset == "b"]
    assert len(b) == 10 and len({r.id for r in b}) == 10
    assert sorted(r.metadata.get("mixture_repeat", 1) for r in b) == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]
    assert {r.id.split("~")[0] for r in b} == {"b_0", "b_1", "b_2"}


def test_mixture_errors(tmp_path):
    a = _ds("a", 2, tmp_path)
    with pytest.raises(DatasetError, match="record id 'a_0' is in both 'a' and 'again'"):
        mix([a, VQADataset(list(a), name="again")])
    with pytest.raises(ConfigError, match="expected weights >= 0"):
        mix([a], weights=[-1])
    with pytest.raises(ConfigError, match="non-empty list"):
        load_dataset("mixture", components="embedded")


def test_mixture_loader_from_plain_options(tmp_path):
    path = tmp_path / "rad" / "qa.jsonl"
    _jpg(tmp_path / "rad" / "a.png")
    path.write_text("".join(json.dumps({"id": f"r{i}", "image": "a.png", "question": "q?", "answer": "yes",
                                        "split": "val"}) + "\n" for i in range(6)))
    options = {"components": [{"name": str(path), "weight": 1}, {"name": "embedded", "weight": 2, "limit": 12}],
               "size": 9, "seed": 0}
    m = load_dataset("mixture", split="validation", **json.loads(json.dumps(options)))
    assert Counter(r.dataset for r in m) == {"rad": 3, "embedded": 6} and {r.split for r in m} == {"val"}
    combined = load_dataset("mixture", split="val", components=[str(path), {"name": "embedded", "limit": 4}])
    assert [r.dataset for r in combined] == ["rad"] * 6 + ["embedded"] * 4
    with pytest.raises(DatasetError, match=r"mixture 'mixture': component 0 \('vqa_rad'\)"):
        load_dataset("mixture", components=[{"name": "vqa_rad", "root": str(tmp_path / "nowhere")}])
