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
    with pytest.raises(DatasetError, match=r"test\.json: entry 2: record 'slake_test_2': image .*xmlab2/source\.jpg' "
                                           r"does not exist$"):
        load_dataset("slake", root=slake_root)
    # every missing image is counted; the first is named with its entry
    with pytest.raises(DatasetError, match=r"test\.json: entry 0: record 'slake_test_0': image .*xmlab1/source\.jpg' "
                                           r"does not exist \(3 of 3 records have an unreadable image; "
                                           r"on_invalid='skip' loads the others"):
        (slake_root / "imgs" / "xmlab1" / "source.jpg").unlink()
        load_dataset("slake", root=slake_root, lang=None)
    (slake_root / "imgs" / "xmlab1" / "detection.json").write_text('[{"Liver": [1, 2]}]')
    with pytest.raises(DatasetError, match=r"detection\.json.*\[x, y, w, h\]"):
        load_dataset("slake", split="train", root=slake_root)
    (slake_root / "test.json").write_text('[{"qid": 1,\n  "answer": "x",}]')
    with pytest.raises(DatasetError, match=r"test\.json: invalid JSON: Expecting property name .*\(line 2, column 17\)"):
        load_dataset("slake", root=slake_root)
    (slake_root / "test.json").write_text(json.dumps([{"img_name": "xmlab1/source.jpg", "answer": "x"}]))
    with pytest.raises(DatasetError, match=r"entry 0: record 'slake_test_0': KeyError: 'question'"):
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
    with pytest.raises(DatasetError, match=r"entry 0: record 'pathvqa_test_0': missing field\(s\) \['question', 'answer'\]"):
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
    with pytest.raises(DatasetError, match=r"line 2: record 'pmcvqa_test_0': no answer letter"):
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


# -- dirty rows: on_invalid="error" (default) names the row, "skip" leaves it out, named and counted --
def _official_slake_train(root: Path) -> list[dict]:
    """A ``train.json`` in the official SLAKE shape (field order and types as published) holding what
    the real file holds that matters here: English and Chinese questions, and one English question
    whose answer is ``""`` (qid 1622 in the official file)."""
    for i in (1, 2, 3):
        _image(root / "imgs" / f"xmlab{i}" / "source.jpg", i)
    rows = [_slake_row(1620, 1, "Does the picture contain liver?", "Yes", "CLOSED"),
            _slake_row(1621, 1, "图片中包含肝脏吗?", "是", "CLOSED", lang="zh"),
            _slake_row(1622, 2, "What diseases are included in the picture?", "", "OPEN"),
            _slake_row(1623, 3, "Which organ is the largest?", "Liver", "OPEN")]
    (root / "train.json").write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
    return rows


def test_slake_official_train_loads_with_its_empty_answer_skipped(tmp_path, caplog):
    from medvqa_env.provenance import dataset_provenance

    root = tmp_path / "Slake1.0"
    _official_slake_train(root)
    with pytest.raises(DatasetError, match=r"train\.json: entry 2: record 'slake_train_1622' has an empty answer"):
        load_dataset("slake", split="train", root=root)
    with caplog.at_level("WARNING", logger="medvqa_env.datasets"):
        ds = load_dataset("slake", split="train", root=root, on_invalid="skip")
    assert [r.id for r in ds] == ["slake_train_1620", "slake_train_1623"]
    prov = dataset_provenance(ds)
    assert prov.n_skipped == 1 and prov.n_records == 2 and prov.on_invalid == "skip"
    assert prov.skipped == [{"source": str(root / "train.json"), "where": "entry 2", "record_id": "slake_train_1622",
                             "reason": "record 'slake_train_1622' has an empty answer (got '')"}]
    assert prov.skipped_by_reason() == {"empty answer": 1}
    assert prov.sources == [str(root / "train.json")] and prov.n_images_checked == 2
    assert "slake: skipped 1 invalid row(s)" in caplog.text and "entry 2" in caplog.text
    # the Chinese twin is not English, so it was never a candidate; with lang=None it loads
    assert len(load_dataset("slake", split="train", root=root, on_invalid="skip", lang=None)) == 3


def test_skip_lists_every_kind_of_bad_row_and_limit_counts_good_ones(slake_root, pathvqa_root, pmc_root):
    from medvqa_env.provenance import dataset_provenance

    rows = json.loads((slake_root / "test.json").read_text(encoding="utf-8"))
    rows += [{"qid": 7, "img_name": "xmlab9/source.jpg", "question": "Gone?", "answer": "yes", "q_lang": "en"},
             {"qid": 8, "img_name": "xmlab1/source.jpg", "answer": "no", "q_lang": "en"},
             {**rows[0]}]  # qid 0 again
    (slake_root / "test.json").write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    ds = load_dataset("slake", root=slake_root, on_invalid="skip")
    assert [r.id for r in ds] == ["slake_test_0", "slake_test_2"]
    skipped = dataset_provenance(ds).skipped
    assert [(s["where"], s["record_id"]) for s in skipped] == [("entry 3", "slake_test_7"), ("entry 4", "slake_test_8"),
                                                               ("entry 5", "slake_test_0")]
    assert "xmlab9/source.jpg' does not exist" in skipped[0]["reason"]
    assert skipped[1]["reason"] == "KeyError: 'question'"
    assert skipped[2]["reason"] == "duplicate id (first used on entry 0)"
    with pytest.raises(DatasetError, match=r"entry 4: record 'slake_test_8': KeyError: 'question'"):
        load_dataset("slake", root=slake_root, check_images="none")
    assert len(load_dataset("slake", root=slake_root, on_invalid="skip", limit=2)) == 2
    # PathVQA and PMC-VQA: the same policy
    (pathvqa_root / "split" / "qas" / "test" / "test_qa.pkl").write_bytes(pickle.dumps(
        [{"image": "test_0000"}, {"image": "test_0001", "question": "What?", "answer": "granuloma"}]))
    pv = load_dataset("pathvqa", root=pathvqa_root, on_invalid="skip")
    assert [r.id for r in pv] == ["pathvqa_test_1"]
    assert dataset_provenance(pv).skipped[0]["where"] == "entry 0"
    with (pmc_root / "test.csv").open("w", newline="") as f:
        csv.writer(f).writerows([PMC_COLUMNS, ["PMC1_fig1.jpg", "q", "zzz", "A:CT", "B:MRI", "", "", ""],
                                 ["PMC1_fig1.jpg", "q2", "CT", "A:CT", "B:MRI", "", "", "A"]])
    pmc = load_dataset("pmcvqa", split="test", root=pmc_root, on_invalid="skip")
    assert [r.id for r in pmc] == ["pmcvqa_test_1"]
    assert dataset_provenance(pmc).skipped[0]["where"] == "line 2"
    with pytest.raises(DatasetError, match=r"expected on_invalid in \['error', 'skip'\], got 'ignore'"):
        load_dataset("pmcvqa", split="test", root=pmc_root, on_invalid="ignore")
    with pytest.raises(DatasetError, match=r"expected check_images in \['exists', 'decode', 'none'\]"):
        load_dataset("pmcvqa", split="test", root=pmc_root, check_images="open")


def test_jsonl_skip_names_line_id_and_reason(tmp_path):
    from medvqa_env.provenance import dataset_provenance

    _image(tmp_path / "a.png", 1)
    lines = [json.dumps({"id": "ok1", "image": "a.png", "question": "Is it?", "answer": "yes"}),
             '{"id": "broken", "image": "a.png",, }',
             json.dumps({"id": "empty", "image": "a.png", "question": "What?", "answer": ""}),
             json.dumps({"id": "ok1", "image": "a.png", "question": "Again?", "answer": "no"}),
             json.dumps({"id": "gone", "image": "b.png", "question": "What?", "answer": "x"}),
             json.dumps([1, 2]),
             json.dumps({"id": "ok2", "image": "a.png", "question": "Which?", "answer": "liver"})]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"m\.jsonl: line 2: invalid JSON: Expecting property name .*\(column 35\)"):
        load_dataset(str(tmp_path / "m.jsonl"))
    ds = load_dataset(str(tmp_path / "m.jsonl"), on_invalid="skip")
    assert [r.id for r in ds] == ["ok1", "ok2"]
    prov = dataset_provenance(ds)
    assert [(s["where"], s["record_id"]) for s in prov.skipped] == [
        ("line 2", None), ("line 6", None), ("line 3", "empty"), ("line 4", "ok1"), ("line 5", "gone")]
    assert prov.skipped_by_reason() == {"duplicate id": 1, "the answer is empty": 1, "expected a JSON object,": 1,
                                        "image does not exist": 1, "invalid JSON Expecting property": 1}


def test_decode_check_finds_unreadable_images_at_load(tmp_path):
    from medvqa_env.provenance import dataset_provenance

    _image(tmp_path / "a.png", 1)
    (tmp_path / "truncated.png").write_bytes((tmp_path / "a.png").read_bytes()[:60])
    (tmp_path / "text.jpg").write_text("not an image")
    rows = [{"id": "good", "image": "a.png", "question": "Is it?", "answer": "yes"},
            {"id": "cut", "image": "truncated.png", "question": "Is it?", "answer": "yes"},
            {"id": "txt", "image": "text.jpg", "question": "Is it?", "answer": "no"},
            {"id": "good2", "image": "a.png", "question": "Which?", "answer": "x"}]
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert len(load_dataset(str(tmp_path / "m.jsonl"))) == 4  # the files exist: the default check passes
    with pytest.raises(DatasetError, match=r"line 2: record 'cut': image .*truncated\.png' cannot be decoded: .*"
                                           r"\(2 of 4 records have an unreadable image"):
        load_dataset(str(tmp_path / "m.jsonl"), check_images="decode")
    ds = load_dataset(str(tmp_path / "m.jsonl"), check_images="decode", on_invalid="skip")
    prov = dataset_provenance(ds)
    assert [r.id for r in ds] == ["good", "good2"] and [s["record_id"] for s in prov.skipped] == ["cut", "txt"]
    assert (prov.check_images, prov.n_images_checked, prov.n_images_decoded) == ("decode", 3, 1)
    assert "text.jpg' cannot be decoded" in prov.skipped[1]["reason"]
    none = dataset_provenance(load_dataset(str(tmp_path / "m.jsonl"), check_images=False))
    assert (none.check_images, none.n_images_checked) == ("none", 0)


def test_mixture_passes_the_policy_down_and_collects_skips(tmp_path):
    from medvqa_env.provenance import dataset_provenance

    root = tmp_path / "Slake1.0"
    _official_slake_train(root)
    _image(tmp_path / "a.png", 1)
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "j1", "image": "a.png", "question": "Q?", "answer": "yes"})
                                      + "\n{broken\n")
    with pytest.raises(DatasetError, match="component 0 .*'slake_train_1622' has an empty answer"):
        load_dataset("mixture", split="train", components=[{"name": "slake", "root": str(root)}])
    mixed = load_dataset("mixture", split="train", on_invalid="skip", components=[
        {"name": "slake", "root": str(root)}, {"name": str(tmp_path / "m.jsonl"), "split": None}])
    prov = dataset_provenance(mixed)
    assert len(mixed) == 3 and prov.n_skipped == 2
    assert [s["where"] for s in prov.skipped] == ["entry 2", "line 2"] and prov.skipped[0]["dataset"] == "slake"
    assert [c["n_skipped"] for c in prov.components] == [1, 1]


def test_vqa_rad_and_hf_skip_bad_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    from medvqa_env.provenance import dataset_provenance

    root = tmp_path / "vqa_rad"
    _image(root / "images" / "synpic1.jpg", 1)
    rows = [{"qid": 1, "image_name": "synpic1.jpg", "question": "Is it?", "answer": "yes", "answer_type": "CLOSED"},
            {"qid": 2, "image_name": "synpic1.jpg", "question": "What?", "answer_type": "OPEN"},
            {"qid": 3, "image_name": "synpic1.jpg", "question": "Where?", "answer": "lung", "answer_type": "OPNE"}]
    (root / "testset.json").write_text(json.dumps(rows))
    with pytest.raises(DatasetError, match=r"testset\.json: entry 1: record 'vqarad_test_2': KeyError: 'answer'"):
        load_dataset("vqa_rad", root=root)
    ds = load_dataset("vqa_rad", root=root, on_invalid="skip")
    assert [r.id for r in ds] == ["vqarad_test_1"]
    assert [(s["where"], s["record_id"]) for s in dataset_provenance(ds).skipped] == [
        ("entry 1", "vqarad_test_2"), ("entry 2", "vqarad_test_3")]
    folder = tmp_path / "arrow" / "test"
    folder.mkdir(parents=True)
    table = pa.table({"image": [str(root / "images" / "synpic1.jpg"), None], "question": ["Is it?", "And?"],
                      "answer": ["yes", "no"]})
    with pa.OSFile(str(folder / "data.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(DatasetError, match=r"row 1: record 'arrow_test_1': no image in column 'image'"):
        load_dataset("hf", path=tmp_path / "arrow", split="test", cache_dir=tmp_path / "c")
    hf = load_dataset("hf", path=tmp_path / "arrow", split="test", cache_dir=tmp_path / "c", on_invalid="skip")
    assert [r.id for r in hf] == ["arrow_test_0"] and dataset_provenance(hf).skipped[0]["where"] == "row 1"
