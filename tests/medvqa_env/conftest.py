"""A tiny on-disk dataset (real PNGs) for env tests that must not depend on the embedded set."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from medvqa_env.records import Annotations, AnswerType, Box, VQADataset, VQARecord


def _phantom(seed: int, size: int = 96) -> Image.Image:
    rng = np.random.default_rng(seed)
    img = rng.normal(60, 8, (size, size)).clip(0, 255)
    yy, xx = np.mgrid[:size, :size]
    img[(yy - 60) ** 2 + (xx - 30) ** 2 < 36] = 200  # a bright lesion at (30, 60)
    return Image.fromarray(np.stack([img] * 3, -1).astype(np.uint8))


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> VQADataset:
    root = tmp_path_factory.mktemp("tiny")
    paths = []
    for i in range(3):
        p = root / f"img{i}.png"
        _phantom(i).save(p)
        paths.append(str(p))
    lesion = Annotations(boxes=(Box("lesion", (24.0, 54.0, 36.0, 66.0)),))
    records = [
        VQARecord("t_closed", (paths[0],), "Is there a lesion?", "yes", AnswerType.CLOSED, "tiny",
                  modality="CT", organ="ABD", annotations=lesion),
        VQARecord("t_mcq", (paths[1],), "How many lesions?", "B", AnswerType.MCQ, "tiny",
                  options={"A": "0", "B": "1", "C": "2"}, modality="CT", annotations=lesion),
        VQARecord("t_open", (paths[2],), "Which side is the lesion on?", "left", AnswerType.OPEN, "tiny",
                  modality="MRI", annotations=lesion),
    ]
    return VQADataset(records, name="tiny")
