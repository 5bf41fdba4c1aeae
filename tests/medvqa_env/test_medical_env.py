"""DICOM, NIfTI, 16-bit PNG and float TIFF records run through ``reset``, every tool and
``render()``: the lesion each file holds is where the tools find it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from medical_files import LESION, lesion_volume, phantom, write_dicom, write_float_tiff, write_nifti, write_png16
from medvqa_env.env import MedVQAEnv
from medvqa_env.records import Annotations, AnswerType, Box, VQADataset, VQARecord
from rewards import RuleReward
from tool_backends.toolbox import Toolbox

pytest.importorskip("pydicom", reason="the 'medical' extra is part of the project's install")
pytest.importorskip("nibabel", reason="the 'medical' extra is part of the project's install")

TOOLS = {"image_zoom_in": {}, "segment": {"engine": "classical"}, "segment_text": {"engine": "classical"},
         "ground": {"engine": "classical"}, "classify": {"engine": "oracle"}, "hires_render": {}}
CX, CY, R = LESION
NIFTI_CENTRE = (63 - CX, 47 - CY)  # drawn radiologically (see medical_files.lesion_volume)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("medical")
    hu = phantom(40.0, 200.0)
    files = {
        "dicom": (str(write_dicom(root / "ct.dcm", (hu + 1024).astype(np.uint16), intercept=-1024, window=(40, 400))),
                  (CX, CY)),
        "nifti": (f"{write_nifti(root / 'ct.nii.gz', lesion_volume())}#slice=6&window=40,400", NIFTI_CENTRE),
        "png16": (str(write_png16(root / "xr.png", phantom(12000.0, 60000.0))), (CX, CY)),
        "float": (str(write_float_tiff(root / "mr.tif", phantom(0.2, 0.9))), (CX, CY)),
    }
    records = []
    for name, (path, (x, y)) in files.items():
        ann = Annotations(boxes=(Box("lesion", (x - R, y - R, x + R + 1, y + R + 1)),), labels=("ct",))
        records.append(VQARecord(name, (path,), "Is there a lesion?", "yes", AnswerType.CLOSED, "medical",
                                 annotations=ann, metadata={"centre": [x, y]}))
    toolbox = Toolbox.from_config(TOOLS, cache=False)
    env = MedVQAEnv(dataset=VQADataset(records), tools=toolbox, reward=RuleReward(), render_mode="rgb_array")
    yield env
    env.close()


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.mark.parametrize("record_id", ["dicom", "nifti", "png16", "float"])
def test_medical_record_through_reset_every_tool_and_render(env, record_id):
    obs, _ = env.reset(options={"record_id": record_id})
    x, y = env.record.metadata["centre"]
    image = obs["images"][0]
    assert image.shape == (48, 64, 3) and image[y, x, 0] > 200 and image[12, 12, 0] < 160  # lesion bright, body not
    box = [x - R - 3, y - R - 3, x + R + 4, y + R + 4]
    turn = (call("image_zoom_in", bbox=box) + call("segment", bbox=box) + call("segment_text", text="bright lesion")
            + call("ground", text="bright lesion") + call("classify", labels=["ct", "mri"])
            + call("hires_render", bbox=box))
    _, _, _, _, info = env.step(turn)
    calls = {c["name"]: c for c in info["tool_calls"]}
    assert all(c["error"] is None for c in calls.values()), [c["text"] for c in calls.values()]
    lesion = [x - R, y - R, x + R + 1, y + R + 1]
    for name in ("segment", "segment_text"):
        found = calls[name]["data"]["bbox"]
        assert max(abs(a - b) for a, b in zip(found, lesion)) <= 1, (name, found, lesion)
    gx0, gy0, gx1, gy1 = calls["ground"]["data"]["boxes"][0]["bbox"]
    assert gx0 <= x <= gx1 and gy0 <= y <= gy1
    assert calls["classify"]["data"]["top"] == "ct"
    assert env.render().shape[2] == 3
    assert env.step(r"\boxed{yes}")[1] == 1.0


def test_oracle_reads_a_nifti_label_volume_as_the_mask(tmp_path):
    """Annotation masks take the same path fragment as images: a label volume and its slice."""
    from medvqa_env.records import Mask

    vol = lesion_volume()
    labels = np.zeros(vol.shape, np.float32)
    labels[vol > 100] = 3  # label 3 on slice 6 where the lesion is
    image = f"{write_nifti(tmp_path / 'ct.nii.gz', vol)}#slice=6&window=40,400"
    mask = f"{write_nifti(tmp_path / 'labels.nii.gz', labels)}#slice=6"
    record = VQARecord("lab", (image,), "Is there a lesion?", "yes", AnswerType.CLOSED, "medical",
                       annotations=Annotations(masks=(Mask("lesion", mask),)))
    env = MedVQAEnv(dataset=VQADataset([record]), tools={"segment_text": {"engine": "oracle"}}, reward=RuleReward())
    env.reset(options={"index": 0})
    _, _, _, _, info = env.step(call("segment_text", text="lesion"))
    x, y = NIFTI_CENTRE
    assert info["tool_calls"][0]["data"]["bbox"] == [x - R, y - R, x + R + 1, y + R + 1]
    env.close()
