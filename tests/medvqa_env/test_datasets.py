"""Loaders of published layouts, each against a small copy of that layout built in ``tmp_path``
(real JPEG/PNG files, real JSON / CSV / pickle / parquet / arrow), plus the real VQA-RAD copy."""

from __future__ import annotations

import csv
import io
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from medvqa_env.datasets import available_datasets, load_dataset
from medvqa_env.errors import ConfigError, DatasetError
from medvqa_env.records import AnswerType


def _image(path: Path, seed: int = 0, size: int = 32, fmt: str | None = None) -> bytes:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format=fmt or ("PNG" if path.suffix == ".png" else "JPEG"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def test_registry_names_and_helpful_error():
    assert {"embedded", "vqa_rad", "slake", "pathvqa", "pmcvqa", "hf", "jsonl"} <= set(available_datasets())
    with pytest.raises(ConfigError, match="Did you mean 'slake'"):
        load_dataset("slak")


# -- SLAKE -----------------------------------------------------------------------------------------
def _slake_row(qid, img, question, answer, kind, lang="en", **extra):
    return {"img_id": img, "img_name": f"xmlab{img}/source.jpg", "question": question, "answer": answer,
            "q_lang": lang, "location": "Lung", "modality": "CT", "answer_type": kind,
            "base_type": "vqa", "content_type": "Abnormality", "triple": ["vhead", "_", "_"], "qid": qid, **extra}


@pytest.fixture
def slake_root(tmp_path):
    root = tmp_path / "Slake1.0"
    for i in (1, 2):
        _image(root / "imgs" / f"xmlab{i}" / "source.jpg", i)
    mask = np.zeros((32, 32), np.uint8)
    mask[4:10, 6:20] = 3
    Image.fromarray(mask).save(root / "imgs" / "xmlab1" / "mask.png")
    (root / "imgs" / "xmlab1" / "detection.json").write_text(json.dumps([{"Liver": [6, 4, 14, 6]}, {"Spleen": [1, 2, 3, 4]}]))
    rows = [_slake_row(0, 1, "Is the lung healthy?", "No", "CLOSED"),
            _slake_row(1, 1, "这是什么模态?", "CT", "OPEN", lang="zh"),
            _slake_row(2, 2, "Which organ is abnormal?", "Lung", "OPEN")]
    (root / "test.json").write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    (root / "train.json").write_text(json.dumps(rows[:1]))
    (root / "validate.json").write_text(json.dumps(rows[2:]))
    return root


def test_slake_layout(slake_root):
    ds = load_dataset("slake", split="test", root=slake_root)
    assert [r.id for r in ds] == ["slake_test_0", "slake_test_2"]  # English only by default
    r = ds[0]
    assert r.answer_type is AnswerType.CLOSED and r.answer == "No" and r.modality == "CT" and r.organ == "Lung"
    assert r.image_paths == (str(slake_root / "imgs" / "xmlab1" / "source.jpg"),)
    assert [(b.label, b.bbox) for b in r.annotations.boxes] == [("Liver", (6.0, 4.0, 20.0, 10.0)),
                                                                ("Spleen", (1.0, 2.0, 4.0, 6.0))]
    assert r.annotations.masks[0].path.endswith("xmlab1/mask.png")
    assert ds[1].annotations.empty and ds[1].answer_type is AnswerType.OPEN
    assert r.metadata["content_type"] == "Abnormality" and r.question_type == "Abnormality"
    assert len(load_dataset("slake", split="test", root=slake_root, lang=None)) == 3
    assert [r.question for r in load_dataset("slake", split="test", root=slake_root, lang="zh")] == ["这是什么模态?"]
    assert [r.split for r in load_dataset("slake", split="validation", root=slake_root)] == ["val"]
    assert len(load_dataset("slake", split="train", root=slake_root)) == 1


def test_slake_env_root(slake_root, monkeypatch):
    monkeypatch.setenv("MEDVQA_SLAKE", str(slake_root))
    assert len(load_dataset("slake")) == 2
    monkeypatch.delenv("MEDVQA_SLAKE")
    with pytest.raises(DatasetError, match="MEDVQA_SLAKE"):
        load_dataset("slake")


def test_slake_errors_name_record_and_file(slake_root):
    (slake_root / "imgs" / "xmlab2" / "source.jpg").unlink()
    with pytest.raises(DatasetError, match=r"test\.json.*'slake_test_2'.*xmlab2/source\.jpg"):
        load_dataset("slake", root=slake_root)
    (slake_root / "imgs" / "xmlab1" / "detection.json").write_text('[{"Liver": [1, 2]}]')
    with pytest.raises(DatasetError, match=r"detection\.json.*\[x, y, w, h\]"):
        load_dataset("slake", split="train", root=slake_root)
    (slake_root / "test.json").write_text("[{")
    with pytest.raises(DatasetError, match="test.json: invalid JSON"):
        load_dataset("slake", root=slake_root)
    (slake_root / "test.json").write_text(json.dumps([{"img_name": "xmlab1/source.jpg", "answer": "x"}]))
    with pytest.raises(DatasetError, match=r"entry 0: KeyError: 'question'"):
        load_dataset("slake", root=slake_root)
    with pytest.raises(DatasetError, match="SLAKE splits are"):
        load_dataset("slake", split="dev2", root=slake_root)


# -- PathVQA ---------------------------------------------------------------------------------------
@pytest.fixture
def pathvqa_root(tmp_path):
    root = tmp_path / "pvqa"
    for i in range(3):
        _image(root / "split" / "images" / "test" / f"test_{i:04d}.jpg", i)
    rows = [{"image": "test_0000", "question": "Is this tissue necrotic?", "answer": "yes"},
            {"image": "test_0001", "question": "What does this image show?", "answer": "granuloma"},
            {"image": "test_0002", "question": "Are nuclei enlarged?", "answer": "No"}]
    qas = root / "split" / "qas" / "test"
    qas.mkdir(parents=True)
    (qas / "test_qa.pkl").write_bytes(pickle.dumps(rows))
    _image(root / "split" / "images" / "val" / "val_0000.jpg", 5)
    lxmert = [{"img_id": "val_0000", "sent": "What is present?", "label": {"fibrosis": 1.0, "scar": 0.3},
               "answer_type": "other", "question_id": 7}]
    (root / "split" / "qas" / "val").mkdir(parents=True)
    (root / "split" / "qas" / "val" / "val_vqa.pkl").write_bytes(pickle.dumps(lxmert, protocol=2))
    return root


def test_pathvqa_layout(pathvqa_root):
    ds = load_dataset("pathvqa", root=pathvqa_root)
    assert [(r.answer, r.answer_type) for r in ds] == [("yes", AnswerType.CLOSED), ("granuloma", AnswerType.OPEN),
                                                       ("No", AnswerType.CLOSED)]
    assert ds[1].image_paths[0].endswith("split/images/test/test_0001.jpg") and ds[0].modality == "Pathology"
    assert len(load_dataset("pathvqa", root=pathvqa_root / "split", limit=2)) == 2  # root may be split/
    val = load_dataset("pathvqa", split="validation", root=pathvqa_root)
    assert (val[0].question, val[0].answer, val[0].answer_type) == ("What is present?", "fibrosis", AnswerType.OPEN)


class _Payload:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pathvqa_refuses_a_pickle_that_runs_code(pathvqa_root, capsys):
    path = pathvqa_root / "split" / "qas" / "test" / "test_qa.pkl"
    path.write_bytes(pickle.dumps([{"image": "test_0000", "question": _Payload(), "answer": "yes"}]))
    with pytest.raises(DatasetError, match=r"test_qa\.pkl: cannot unpickle.*refusing to load builtins\.print"):
        load_dataset("pathvqa", root=pathvqa_root)
    assert "pwned" not in capsys.readouterr().out
    path.write_bytes(b"not a pickle")
    with pytest.raises(DatasetError, match="cannot unpickle"):
        load_dataset("pathvqa", root=pathvqa_root)


def test_pathvqa_trusted_reads_a_dataframe_pickle(pathvqa_root):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame([{"image": "test_0001", "question": "What is shown?", "answer": "granuloma"}])
    (pathvqa_root / "split" / "qas" / "test" / "test_qa.pkl").write_bytes(pickle.dumps(frame))
    with pytest.raises(DatasetError, match="refusing to load pandas"):
        load_dataset("pathvqa", root=pathvqa_root)
    assert load_dataset("pathvqa", root=pathvqa_root, trusted=True)[0].answer == "granuloma"


def test_pathvqa_errors(pathvqa_root):
    (pathvqa_root / "split" / "images" / "test" / "test_0002.jpg").unlink()
    with pytest.raises(DatasetError, match=r"'pathvqa_test_2'.*test_0002\.jpg.*does not exist"):
        load_dataset("pathvqa", root=pathvqa_root)
    (pathvqa_root / "split" / "qas" / "test" / "test_qa.pkl").write_bytes(pickle.dumps([{"image": "x"}]))
    with pytest.raises(DatasetError, match=r"entry 0: missing field\(s\) \['question', 'answer'\]"):
        load_dataset("pathvqa", root=pathvqa_root)
    with pytest.raises(DatasetError, match="PathVQA train file not found"):
        load_dataset("pathvqa", split="train", root=pathvqa_root)
    with pytest.raises(DatasetError, match="no root given"):
        load_dataset("pathvqa")


# -- PMC-VQA ---------------------------------------------------------------------------------------
PMC_COLUMNS = ["Figure_path", "Question", "Answer", "Choice A", "Choice B", "Choice C", "Choice D", "Answer_label"]


@pytest.fixture
def pmc_root(tmp_path):
    root = tmp_path / "PMC-VQA"
    _image(root / "images" / "PMC1_fig1.jpg", 1)
    _image(root / "images" / "PMC2_fig3.jpg", 2)
    rows = [["PMC1_fig1.jpg", "What imaging modality is shown?", "CT", "A:CT", "B:MRI", "C:Ultrasound", "D:PET", "A"],
            ["PMC2_fig3.jpg", "Where is the mass,\nexactly?", "Left lobe ", " A: Right lobe ", " B: Left lobe ",
             " C: Both ", " D: Neither ", "B"]]
    with (root / "test_clean.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([PMC_COLUMNS, *rows])
    with (root / "train_2.csv").open("w", newline="", encoding="utf-8") as f:  # no Answer_label: from Answer
        w = csv.writer(f)
        w.writerow(["index", "Figure_path", "Caption", "Question", "Answer", "Choice A", "Choice B", "Choice C",
                    "Choice D"])
        w.writerow([0, "PMC1_fig1.jpg", "a CT", "Which modality?", "B:MRI", "A:CT", "B:MRI", "C:PET", "D:US"])
    return root


def test_pmcvqa_layout(pmc_root):
    ds = load_dataset("pmcvqa", split="test_clean", root=pmc_root)
    assert [r.id for r in ds] == ["pmcvqa_test_clean_0", "pmcvqa_test_clean_1"]
    assert ds[0].options == {"A": "CT", "B": "MRI", "C": "Ultrasound", "D": "PET"} and ds[0].answer == "A"
    assert ds[1].options["B"] == "Left lobe" and ds[1].answer == "B" and "\n" in ds[1].question
    assert all(r.answer_type is AnswerType.MCQ for r in ds)
    assert ds[0].image_paths[0] == str(pmc_root / "images" / "PMC1_fig1.jpg")
    assert load_dataset("pmcvqa", split="train_2", root=pmc_root)[0].answer == "B"


def test_pmcvqa_figures_folder_and_errors(pmc_root):
    (pmc_root / "images").rename(pmc_root / "figures")
    assert load_dataset("pmcvqa", split="test_clean", root=pmc_root)[1].image_paths[0].endswith("figures/PMC2_fig3.jpg")
    (pmc_root / "figures" / "PMC2_fig3.jpg").unlink()
    with pytest.raises(DatasetError, match=r"'pmcvqa_test_clean_1'.*PMC2_fig3\.jpg"):
        load_dataset("pmcvqa", split="test_clean", root=pmc_root)
    with pytest.raises(DatasetError, match=r"split 'test' not found.*\['test_clean', 'train_2'\]"):
        load_dataset("pmcvqa", split="test", root=pmc_root)
    (pmc_root / "test.csv").write_text("Figure_path,Question\nx.jpg,q\n")
    with pytest.raises(DatasetError, match=r"missing column\(s\) \['Choice A', 'Choice B'\]"):
        load_dataset("pmcvqa", split="test", root=pmc_root)
    with (pmc_root / "test.csv").open("w", newline="") as f:
        csv.writer(f).writerows([PMC_COLUMNS, ["PMC1_fig1.jpg", "q", "zzz", "A:CT", "B:MRI", "", "", ""]])
    with pytest.raises(DatasetError, match=r"line 2: no answer letter"):
        load_dataset("pmcvqa", split="test", root=pmc_root)


# -- HF datasets -----------------------------------------------------------------------------------
def _hf_rows(tmp_path):
    blobs = [_image(tmp_path / "src" / f"{i}.png", i) for i in range(3)]
    return {"image": [{"bytes": b, "path": None} for b in blobs],
            "question": ["Is there a fracture?", "What organ is shown?", "Which modality?"],
            "answer": ["yes", "liver", "MRI"],
            "answer_type": ["CLOSED", "OPEN", "MCQ"],
            "options": [[], [], ["CT", "MRI", "X-Ray"]]}, blobs


def test_hf_save_to_disk(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    rows, blobs = _hf_rows(tmp_path)
    features = datasets.Features({"image": datasets.Image(), "question": datasets.Value("string"),
                                  "answer": datasets.Value("string"), "answer_type": datasets.Value("string"),
                                  "options": datasets.Sequence(datasets.Value("string"))})
    dd = datasets.DatasetDict({"test": datasets.Dataset.from_dict(rows, features=features),
                               "train": datasets.Dataset.from_dict(rows, features=features).select([0])})
    dd.save_to_disk(str(tmp_path / "saved"))
    ds = load_dataset("hf", path=tmp_path / "saved", split="test", cache_dir=tmp_path / "cache", dataset="myvqa")
    assert [r.id for r in ds] == ["myvqa_test_0", "myvqa_test_1", "myvqa_test_2"] and ds.name == "myvqa"
    assert [r.answer_type for r in ds] == [AnswerType.CLOSED, AnswerType.OPEN, AnswerType.MCQ]
    assert ds[2].options == {"A": "CT", "B": "MRI", "C": "X-Ray"} and ds[2].answer == "B"
    assert Path(ds[0].image_paths[0]).read_bytes() == blobs[0]  # raw bytes, not re-encoded
    assert Path(ds[0].image_paths[0]).parent == tmp_path / "cache" and ds[0].image_paths[0].endswith(".png")
    again = load_dataset("hf", path=tmp_path / "saved", split="test", cache_dir=tmp_path / "cache")
    assert again[1].image_paths == ds[1].image_paths  # content-addressed: same file reused
    assert len(load_dataset("hf", path=tmp_path / "saved", split="train", cache_dir=tmp_path / "cache")) == 1
    with pytest.raises(DatasetError, match=r"no split 'val'; have \['test', 'train'\]"):
        load_dataset("hf", path=tmp_path / "saved", split="val", cache_dir=tmp_path / "cache")


def test_hf_single_saved_dataset_with_class_labels(tmp_path):
    datasets = pytest.importorskip("datasets")
    blob = _image(tmp_path / "a.jpg", 7)
    features = datasets.Features({"image": datasets.Image(), "question": datasets.Value("string"),
                                  "answer": datasets.Value("string"),
                                  "answer_type": datasets.ClassLabel(names=["CLOSED", "OPEN"])})
    rows = {"image": [{"bytes": blob, "path": None}] * 2, "question": ["Is it?", "What?"],
            "answer": ["no", "a cyst"], "answer_type": [0, 1]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "one"))
    ds = load_dataset("hf", path=tmp_path / "one", split="train", cache_dir=tmp_path / "c")
    assert [r.answer_type for r in ds] == [AnswerType.CLOSED, AnswerType.OPEN]
    assert ds[0].image_paths == ds[1].image_paths and ds[0].image_paths[0].endswith(".jpg")


def test_hf_parquet_folder_with_column_mapping(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    blob = _image(tmp_path / "x.jpg", 3)
    table = pa.table({"img": [{"bytes": blob, "path": "x.jpg"}, {"bytes": None, "path": "rel/y.jpg"}],
                      "query": ["Is it normal?", "Where?"], "response": ["no", "apex"], "qid": [11, 12]})
    _image(tmp_path / "hub" / "rel" / "y.jpg", 4)
    (tmp_path / "hub" / "data").mkdir(parents=True)
    pq.write_table(table, tmp_path / "hub" / "data" / "test-00000-of-00001.parquet")
    pq.write_table(table.slice(0, 1), tmp_path / "hub" / "data" / "train-00000-of-00001.parquet")
    ds = load_dataset("hf", path=tmp_path / "hub", split="test", cache_dir=tmp_path / "c",
                      columns={"image": "img", "answer": "response"})
    assert [r.id for r in ds] == ["hub_test_11", "hub_test_12"]
    assert ds[0].question == "Is it normal?" and ds[0].answer_type is AnswerType.CLOSED
    assert ds[0].image_paths[0].endswith(".jpg") and Path(ds[0].image_paths[0]).read_bytes() == blob
    assert ds[1].image_paths[0] == str(tmp_path / "hub" / "rel" / "y.jpg")
    with pytest.raises(DatasetError, match=r"no answer column .*pass columns="):
        load_dataset("hf", path=tmp_path / "hub", split="test", cache_dir=tmp_path / "c", columns={"image": "img"})
    with pytest.raises(DatasetError, match=r"column 'nope' \(for image\) not found"):
        load_dataset("hf", path=tmp_path / "hub", cache_dir=tmp_path / "c", columns={"image": "nope"})
    with pytest.raises(DatasetError, match=r"no file for split 'val'.*test-00000-of-00001.parquet"):
        load_dataset("hf", path=tmp_path / "hub", split="val", cache_dir=tmp_path / "c")


def test_hf_arrow_file_and_missing_image(tmp_path):
    pa = pytest.importorskip("pyarrow")
    folder = tmp_path / "arrow" / "validation"
    folder.mkdir(parents=True)
    table = pa.table({"image": ["gone.png"], "question": ["Is it?"], "answer": ["yes"]})
    with pa.OSFile(str(folder / "data.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(DatasetError, match=r"record 'arrow_val_0'.*gone\.png.*does not exist"):
        load_dataset("hf", path=tmp_path / "arrow", split="val", cache_dir=tmp_path / "c")
    _image(tmp_path / "arrow" / "gone.png", 1)
    assert load_dataset("hf", path=tmp_path / "arrow", split="val", cache_dir=tmp_path / "c")[0].answer == "yes"
    with pytest.raises(DatasetError, match="does not exist .*offline only"):
        load_dataset("hf", path=tmp_path / "nowhere")


# -- JSONL and VQA-RAD -----------------------------------------------------------------------------
def test_jsonl_medbridge_fields(tmp_path):
    _image(tmp_path / "a.png", 1)
    rows = [{"dataset_name": "vqa_rad", "dataset_index": 3, "image": "a.png", "question": "Which?",
             "options": ["CT", "MRI"], "answer_label": "B", "answer": "MRI"},
            {"id": "q2", "images": ["a.png"], "question": "Is it?", "answer": "Yes"}]
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ds = load_dataset(str(tmp_path / "m.jsonl"))
    assert [r.id for r in ds] == ["vqa_rad_3", "q2"]
    assert ds[0].answer == "B" and ds[0].options == {"A": "CT", "B": "MRI"} and ds[1].answer_type is AnswerType.CLOSED
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "x", "image": "missing.png", "question": "q", "answer": "a"}))
    with pytest.raises(DatasetError, match=r"record 'x'.*missing\.png"):
        load_dataset(str(tmp_path / "m.jsonl"))


@pytest.mark.data
def test_vqa_rad_real_counts(vqa_rad_root):
    test = load_dataset("vqa_rad", split="test", root=vqa_rad_root)
    kinds = [r.answer_type for r in test]
    assert len(test) == 451 and kinds.count(AnswerType.CLOSED) == 272 and kinds.count(AnswerType.OPEN) == 179
    assert len(load_dataset("vqa_rad", split="train", root=vqa_rad_root)) == 3064
    assert {r.organ for r in test} == {"HEAD", "CHEST", "ABD"}
    closed = load_dataset("vqa_rad", split="test", root=vqa_rad_root, answer_types=("CLOSED",))
    assert len(closed) == 272
