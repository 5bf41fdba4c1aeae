"""Our datasets -> verl parquet, read back with pyarrow and with verl's own RLHFDataset."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("verl")

import pyarrow.parquet as pq  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from PIL import Image  # noqa: E402

from medvqa_env.datasets import load_dataset  # noqa: E402
from medvqa_env.errors import ConfigError  # noqa: E402
from train.verl_integration.config import AGENT_NAME  # noqa: E402
from train.verl_integration.data import convert, options_from_rows, record_to_row, write_parquet  # noqa: E402

ENV = {"dataset": "embedded", "split": "train", "dataset_options": {"n": 8}}


@pytest.fixture(scope="module")
def train_parquet(tmp_path_factory):
    return convert(ENV, tmp_path_factory.mktemp("verl") / "train.parquet")


def test_rows_read_back(train_parquet):
    rows = pq.read_table(train_parquet).to_pylist()
    dataset = load_dataset("embedded", split="train", n=8)
    assert len(rows) == len(dataset)
    for i, (row, record) in enumerate(zip(rows, dataset)):
        assert row["data_source"] == "medvqa/embedded" and row["ability"] == "medical_vqa"
        assert row["agent_name"] == AGENT_NAME
        assert row["reward_model"] == {"style": "rule", "ground_truth": record.answer}
        info = row["extra_info"]
        assert (info["index"], info["record_id"], info["answer_type"]) == (i, record.id, record.answer_type.value)
        assert options_from_rows(info["options"]) == dict(record.options)
        system, user = row["prompt"]
        assert system["role"] == "system" and "image_zoom_in" in system["content"]  # the tools are listed
        assert user["content"].startswith("<image>") and record.question in user["content"]
        assert len(row["images"]) == len(record.image_paths) == user["content"].count("<image>")
        with open(record.image_paths[0], "rb") as f:
            assert row["images"][0]["bytes"] == f.read()
        Image.open(io.BytesIO(row["images"][0]["bytes"])).verify()
    assert any(options_from_rows(r["extra_info"]["options"]) for r in rows)  # an MCQ row kept its options


def test_verl_rlhf_dataset_reads_it(train_parquet):
    """verl's own loader turns each row into raw_prompt messages with PIL images."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from train.verl_integration.cpu_stand_in import build_processor, build_tokenizer

    tok = build_tokenizer(["Question: How many lesions"])
    config = OmegaConf.create({"prompt_key": "prompt", "image_key": "images", "max_prompt_length": 100000,
                               "filter_overlong_prompts": False, "return_raw_chat": True,
                               "cache_dir": str(train_parquet.parent / "cache")})
    ds = RLHFDataset(data_files=[str(train_parquet)], tokenizer=tok, config=config, processor=build_processor(tok))
    assert len(ds) == 8
    item = ds[2]
    assert item["extra_info"]["record_id"] == "embedded_train_0002" and item["index"] == 2
    assert item["agent_name"] == AGENT_NAME
    user = item["raw_prompt"][1]["content"]
    assert user[0]["type"] == "image" and isinstance(user[0]["image"], Image.Image)
    assert user[1]["type"] == "text" and "imaging modality" in user[1]["text"]


def test_path_mode_and_limit(tmp_path):
    path = convert(ENV, tmp_path / "p.parquet", image_mode="path", limit=3)
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == 3 and rows[0]["images"][0]["image"].endswith(".png")


def test_bad_inputs():
    record = load_dataset("embedded", split="train", n=1)[0]
    with pytest.raises(ConfigError, match="image_mode"):
        record_to_row(record, 0, "sys", image_mode="url")
    with pytest.raises(ConfigError, match="at least one row"):
        write_parquet([], "unused.parquet")


def test_medical_images_reach_verl_as_the_pixels_the_env_shows(tmp_path):
    """A DICOM with a window fragment, a 16-bit PNG and an image over max_image_side: verl's loader
    must decode each (raw DICOM bytes would not), and see what the env shows."""
    import sys
    from pathlib import Path

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "medvqa_env"))  # the medical test files
    from medical_files import phantom, write_dicom, write_png16

    from medvqa_env.env import MedVQAEnv
    from medvqa_env.records import AnswerType, VQADataset, VQARecord

    pytest.importorskip("pydicom")
    dcm = write_dicom(tmp_path / "ct.dcm", phantom(0, 1000).astype(np.uint16))
    png16 = write_png16(tmp_path / "x16.png", phantom(0, 60000).astype(np.uint16))
    big = tmp_path / "big.png"
    Image.new("RGB", (300, 120), (90, 30, 10)).save(big)
    paths = [f"{dcm}#window=500,1000", str(png16), str(big)]
    records = [VQARecord(f"m{i}", (p,), "Is there a lesion?", "yes", AnswerType.CLOSED, "med")
               for i, p in enumerate(paths)]
    for record in records:
        row = record_to_row(record, 0, "sys", "bytes", max_image_side=100)
        shown = Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")
        env = MedVQAEnv(VQADataset(records, name="med"), tools=[], reward="rule", max_image_side=100)
        env.reset(options={"record_id": record.id})
        assert np.array_equal(np.asarray(shown), np.asarray(env.images[0].convert("RGB")))
    with pytest.raises(ConfigError, match="fragment"):
        record_to_row(records[0], 0, "sys", "path")
