"""DICOM, NIfTI and multi-page TIFF as record images: the rescale, window, inversion, slice and
orientation a clinician's viewer would apply, on small files the tests write."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from medical_files import LESION, lesion_volume, phantom, write_dicom, write_nifti
from medvqa_env.errors import DatasetError
from medvqa_env.images import image_file, load_image
from medvqa_env.medical_images import image_ref, split_image_ref

pytest.importorskip("pydicom", reason="the 'medical' extra is part of the project's install")
pytest.importorskip("nibabel", reason="the 'medical' extra is part of the project's install")


def grey(path, rid="rec") -> np.ndarray:
    img = load_image(path, rid)
    assert img.mode == "RGB"
    return np.asarray(img)[..., 0].astype(int)


def test_dicom_rescale_and_the_files_own_window(tmp_path):
    # stored = HU + 1024 (slope 1, intercept -1024); the file's window 40/400 is the soft-tissue one
    hu = phantom(40.0, 200.0)
    p = write_dicom(tmp_path / "ct.dcm", (hu + 1024).astype(np.uint16), intercept=-1024, window=(40, 400))
    out = grey(p)
    cx, cy, _ = LESION
    assert abs(out[cy, cx] - (200 - (40 - 200)) * 255 / 400) <= 0.5  # 200 HU in a 40/400 window -> 229.5
    assert out[10, 10] in (127, 128) and out[0, 0] in (25, 26)  # body (40 HU) at the centre; -120 HU near black


def test_dicom_window_given_by_the_record_wins(tmp_path):
    hu = phantom(40.0, 200.0)
    p = write_dicom(tmp_path / "ct.dcm", (hu + 1024).astype(np.uint16), intercept=-1024, window=(40, 400))
    bone = grey(f"{p}#window=200,20")  # only the lesion's value is inside
    assert bone[LESION[1], LESION[0]] == 128 and bone[10, 10] == 0


def test_dicom_slope_and_monochrome1_inversion(tmp_path):
    stored = (phantom(100.0, 300.0) / 2).astype(np.uint16)  # slope 2 restores the values
    normal = grey(write_dicom(tmp_path / "m2.dcm", stored, slope=2.0, window=(200, 400)))
    inverted = grey(write_dicom(tmp_path / "m1.dcm", stored, slope=2.0, window=(200, 400), photometric="MONOCHROME1"))
    assert normal[10, 10] == 64 and normal[LESION[1], LESION[0]] == 191
    assert (inverted == 255 - normal).all()
    assert (grey(f"{tmp_path / 'm1.dcm'}#invert=0") == normal).all()


def test_multiframe_dicom_frame_by_slice(tmp_path):
    frames = np.stack([np.full((8, 8), v, np.uint16) for v in (0, 100, 200)])
    frames[:, 0, 0] = 0
    frames[:, 7, 7] = 200
    p = write_dicom(tmp_path / "mf.dcm", frames, window=(100, 200))
    assert grey(p)[3, 3] == 0 and grey(f"{p}#slice=2")[3, 3] == 255 and grey(f"{p}#slice=-2")[3, 3] in (127, 128)
    with pytest.raises(DatasetError, match="rec.*mf.dcm.*frame 3 is out of range"):
        load_image(f"{p}#slice=3", "rec")


def test_pydicoms_own_example_ct_reads_in_hounsfield(tmp_path):
    from pydicom import examples

    out = grey(examples.ct.filename)
    assert out.shape == (128, 128) and 0 < out.mean() < 255 and len(np.unique(out)) > 100


@pytest.mark.parametrize("flip", [False, True])
def test_nifti_slice_and_orientation(tmp_path, flip):
    vol, affine = lesion_volume(), np.eye(4)
    if flip:  # the same anatomy stored left-right and front-back reversed (an LPS-like file)
        vol, affine = vol[::-1, ::-1, :].copy(), np.diag([-1.0, -1.0, 1.0, 1.0])
    p = write_nifti(tmp_path / f"v{int(flip)}.nii.gz", vol, affine)
    out = grey(f"{p}#slice=6&window=120,160")
    assert out.shape == (48, 64)
    ys, xs = np.nonzero(out == 255)
    # radiological view: the patient's right (high x) on the left, anterior (high y) at the top
    assert (round(xs.mean()), round(ys.mean())) == (63 - LESION[0], 47 - LESION[1])
    assert grey(p).max() == 0 or grey(p).std() == 0  # the default middle slice (4) holds only -1000


def test_nifti_4d_and_other_axes(tmp_path):
    vol = np.zeros((6, 5, 4, 2), np.float32)
    vol[..., 1] = 7.0
    vol[0, 0, 2, 1] = 0.0  # on the default (middle) slice
    p = write_nifti(tmp_path / "t.nii", vol)
    assert grey(f"{p}#volume=1&window=minmax").max() == 255
    assert grey(f"{p}#axis=sagittal").shape == (4, 5) and grey(f"{p}#axis=coronal").shape == (4, 6)
    with pytest.raises(DatasetError, match="volume 2 is out of range"):
        load_image(f"{p}#volume=2", "rec")


def test_multipage_tiff_page_by_slice(tmp_path):
    pages = [Image.fromarray(np.full((8, 8), v, np.uint8)) for v in (10, 20, 30)]
    p = tmp_path / "stack.tif"
    pages[0].save(p, save_all=True, append_images=pages[1:])
    assert grey(p)[0, 0] == 10 and grey(f"{p}#slice=2")[0, 0] == 30


@pytest.mark.parametrize("suffix, payload, fragment", [
    (".dcm", b"\0" * 128 + b"DICM" + b"\x02\x00" * 40, "not a readable DICOM|without an image"),
    (".nii.gz", b"\x1f\x8b\x08\x00junk", "not a readable gzip-compressed NIfTI"),
    (".nii", b"\x00" * 400, "not a readable NIfTI"),
])
def test_bad_medical_files_name_record_and_file(tmp_path, suffix, payload, fragment):
    p = tmp_path / f"bad{suffix}"
    p.write_bytes(payload)
    with pytest.raises(DatasetError, match=fragment) as err:
        load_image(p, "rec_9")
    assert "rec_9" in str(err.value) and f"bad{suffix}" in str(err.value)


@pytest.mark.parametrize("fragment, message", [
    ("slice=x", "expected an integer for slice"),
    ("window=40", "expected window=centre,width"),
    ("window=40,-5", "a width > 0"),
    ("axis=up", "expected axis in"),
    ("colour=red", "unknown image option 'colour'"),
])
def test_bad_fragments_are_dataset_errors(tmp_path, fragment, message):
    p = write_nifti(tmp_path / "v.nii", lesion_volume())
    with pytest.raises(DatasetError, match=message):
        load_image(f"{p}#{fragment}", "rec")


def test_refs_round_trip_and_a_hash_in_a_real_name_survives(tmp_path):
    ref = image_ref("a/b.nii.gz", slice=3, axis="coronal", window=(40, 400))
    assert split_image_ref(ref)[1].slice == 3 and image_file(ref) == "a/b.nii.gz"
    odd = tmp_path / "scan#1.png"
    Image.new("L", (4, 4), 9).save(odd)
    assert grey(odd)[0, 0] == 9


def test_a_2d_array_with_an_identity_affine_is_shown_anti_transposed(tmp_path):
    """docs/datasets.md: radiological display puts array axis 0 (x, patient left-to-right) on the
    picture's rows reversed and axis 1 (y, posterior-to-anterior) on its columns reversed."""
    from medvqa_env.medical_images import ImageOptions, read_nifti

    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = write_nifti(tmp_path / "flat.nii", array)
    shown = read_nifti(p.read_bytes(), ImageOptions(), "flat.nii", 10**6).array
    assert np.array_equal(shown, array.T[::-1, ::-1])
