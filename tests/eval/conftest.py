"""Fixtures for the evaluation tests: a small real JSONL dataset with real PNG images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ANSWERS = {"CLOSED": "yes", "OPEN": "left lung", "MCQ": "B"}


def write_manifest(root: Path, n: int = 12) -> Path:
    """``n`` questions cycling CLOSED / OPEN / MCQ over two modalities, one 64x64 image each."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        pixels = (np.random.default_rng(i).random((64, 64, 3)) * 255).astype("uint8")
        Image.fromarray(pixels).save(root / "img" / f"{i}.png")
        kind = ("CLOSED", "OPEN", "MCQ")[i % 3]
        row = {"id": f"q{i:02d}", "image_paths": [f"img/{i}.png"], "question": f"Question {i}?",
               "answer_type": kind, "answer": ANSWERS[kind], "modality": ("CT", "MRI")[i % 2]}
        if kind == "MCQ":
            row["options"] = {"A": "CT", "B": "MRI"}
        rows.append(row)
    path = root / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def manifest(tmp_path) -> Path:
    return write_manifest(tmp_path / "data")


@pytest.fixture
def dataset(manifest):
    from medvqa_env.datasets import load_dataset

    return load_dataset(str(manifest))
