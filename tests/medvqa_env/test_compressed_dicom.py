"""Compressed DICOM (PACS exports): JPEG Lossless, JPEG-LS and JPEG 2000 files the test writes itself
decode through the loader to the same pixels as the uncompressed file, with the decoder plugins
the ``medical`` extra installs (``bash scripts/setup.sh``); an undecodable syntax or a text file
named ``.dcm`` is a clear error naming file and reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from medical_files import LESION, phantom, write_dicom
from medvqa_env.datasets import load_dataset
from medvqa_env.errors import DatasetError
from medvqa_env.images import load_image
from medvqa_env.medical_images import dicom_decoders

pydicom = pytest.importorskip("pydicom", reason="the 'medical' extra is part of the project's install")
gdcm = pytest.importorskip("gdcm", reason="the 'medical' extra installs python-gdcm (bash scripts/setup.sh)")
pytest.importorskip("openjpeg", reason="the 'medical' extra installs pylibjpeg-openjpeg (bash scripts/setup.sh)")


def _plain(path: Path) -> Path:
    hu = phantom(40.0, 200.0)
    return write_dicom(path, (hu + 1024).astype(np.uint16), intercept=-1024, window=(40, 400))


def _gdcm_recode(src: Path, dst: Path, syntax: int) -> Path:
    """Re-encode ``src`` with GDCM's own encoder (pydicom has no JPEG Lossless encoder)."""
    reader = gdcm.ImageReader()
    reader.SetFileName(str(src))
    assert reader.Read(), src
    change = gdcm.ImageChangeTransferSyntax()
    change.SetTransferSyntax(gdcm.TransferSyntax(syntax))
    change.SetInput(reader.GetImage())
    assert change.Change()
    writer = gdcm.ImageWriter()
    writer.SetFileName(str(dst))
    writer.SetFile(reader.GetFile())
    writer.SetImage(change.GetOutput())
    assert writer.Write()
    return dst


def _j2k(src: Path, dst: Path) -> Path:
    ds = pydicom.dcmread(src)
    ds.compress(pydicom.uid.JPEG2000Lossless)  # pylibjpeg-openjpeg's encoder
    ds.save_as(dst, enforce_file_format=True)
    return dst


@pytest.mark.parametrize("kind", ["jpeg_lossless", "jpeg_ls", "jpeg2000"])
def test_compressed_dicom_decodes_to_the_uncompressed_pixels(tmp_path, kind):
    plain = _plain(tmp_path / "plain.dcm")
    if kind == "jpeg2000":
        path = _j2k(plain, tmp_path / f"{kind}.dcm")
        want = pydicom.uid.JPEG2000Lossless
    else:
        syntax = {"jpeg_lossless": gdcm.TransferSyntax.JPEGLosslessProcess14_1,
                  "jpeg_ls": gdcm.TransferSyntax.JPEGLSLossless}[kind]
        path = _gdcm_recode(plain, tmp_path / f"{kind}.dcm", syntax)
        want = {"jpeg_lossless": pydicom.uid.JPEGLosslessSV1, "jpeg_ls": pydicom.uid.JPEGLSLossless}[kind]
    written = pydicom.dcmread(path)
    assert written.file_meta.TransferSyntaxUID == want and written.file_meta.TransferSyntaxUID.is_compressed
    assert len(path.read_bytes()) < len(plain.read_bytes())  # really compressed
    got, ref = np.asarray(load_image(path, "rec")), np.asarray(load_image(plain, "rec"))
    assert np.array_equal(got, ref)  # lossless: the same picture, rescale and file window applied
    cx, cy, _ = LESION
    assert abs(int(got[cy, cx, 0]) - 230) <= 1  # 200 HU in the file's 40/400 window
    # through a loader with the decode check, counted in the dataset's provenance
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "c1", "image": path.name, "question": "Q?", "answer": "yes"}))
    ds = load_dataset(str(tmp_path / "m.jsonl"), check_images="decode")
    assert (ds.provenance.n_images_checked, ds.provenance.n_images_decoded) == (1, 1)


def test_the_documented_syntaxes_have_decoders_here():
    decoders = dicom_decoders()
    for name in ("JPEG Baseline (Process 1)", "JPEG Extended (Process 2 and 4)",
                 "JPEG Lossless, Non-Hierarchical (Process 14)",
                 "JPEG Lossless, Non-Hierarchical, First-Order Prediction (Process 14 [Selection Value 1])",
                 "JPEG-LS Lossless Image Compression", "JPEG-LS Lossy (Near-Lossless) Image Compression",
                 "JPEG 2000 Image Compression (Lossless Only)", "JPEG 2000 Image Compression",
                 "High-Throughput JPEG 2000 Image Compression (Lossless Only)", "RLE Lossless"):
        assert decoders[name], name
    assert decoders["MPEG2 Main Profile / Main Level"] == ()


def test_undecodable_syntax_and_text_named_dcm_are_clear_errors(tmp_path):
    from pydicom.encaps import encapsulate

    ds = pydicom.dcmread(_plain(tmp_path / "plain.dcm"))
    ds.file_meta.TransferSyntaxUID = pydicom.uid.MPEG2MPML
    ds.PixelData = encapsulate([b"\x00\x00\x01\xb3" + b"\x00" * 28])
    ds["PixelData"].VR = "OB"
    ds.save_as(tmp_path / "video.dcm", enforce_file_format=True)
    with pytest.raises(DatasetError, match=r"record 'r1': image '.*video\.dcm': cannot decode its pixel data: transfer "
                                           r"syntax 'MPEG2 Main Profile / Main Level' \(1\.2\.840\.10008\.1\.2\.4\.100\)"
                                           r" has no decoder installed"):
        load_image(tmp_path / "video.dcm", "r1")
    broken = bytearray(_j2k(tmp_path / "plain.dcm", tmp_path / "j2k.dcm").read_bytes())
    soc = bytes(broken).index(b"\xff\x4f\xff\x51")  # the J2K codestream's start and its SIZ marker
    broken[soc + 4: soc + 40] = b"\xff" * 36
    (tmp_path / "broken.dcm").write_bytes(bytes(broken))
    with pytest.raises(DatasetError, match=r"broken\.dcm': cannot decode its pixel data \(transfer syntax 'JPEG 2000 "
                                           r"Image Compression \(Lossless Only\)' \(1\.2\.840\.10008\.1\.2\.4\.90\)\)"):
        load_image(tmp_path / "broken.dcm", "r2")
    (tmp_path / "notes.dcm").write_text("hello, this is a text file that someone named .dcm\n")
    with pytest.raises(DatasetError, match=r"notes\.dcm' is not a DICOM file: no 'DICM' marker at byte 128 and no "
                                           r"DICOM data element in it \(it starts b'hello, this"):
        load_image(tmp_path / "notes.dcm", "r3")


def test_a_corrupt_compressed_dicom_is_one_quiet_line_naming_file_syntax_and_reason(tmp_path, capfd):
    """Issue 27: libjpeg's "Corrupt JPEG data" and pydicom's per-plugin tracebacks used to flood
    stderr and the reason read "'NoneType' object has no attribute 'encode'"."""
    plain = _plain(tmp_path / "plain.dcm")
    data = bytearray(_gdcm_recode(plain, tmp_path / "jll.dcm", gdcm.TransferSyntax.JPEGLosslessProcess14_1).read_bytes())
    soi = bytes(data).index(b"\xff\xd8")
    data[soi + 2: soi + 80] = b"\x13" * 78  # the JPEG header garbled
    (tmp_path / "bad.dcm").write_bytes(bytes(data))
    capfd.readouterr()
    with pytest.raises(DatasetError) as caught:
        load_image(tmp_path / "bad.dcm", "r1")
    message = str(caught.value)
    assert "\n" not in message and "NoneType" not in message
    assert message.startswith(f"record 'r1': image '{tmp_path / 'bad.dcm'}': cannot decode its pixel data (transfer "
                              "syntax 'JPEG Lossless, Non-Hierarchical, First-Order Prediction")
    assert "(1.2.840.10008.1.2.4.70)): gdcm: the decoder returned no pixels" in message
    assert "decoder output: Corrupt JPEG data" in message  # what libjpeg said, in the reason
    err = capfd.readouterr().err
    assert err == "", err
    truncated = tmp_path / "truncated.dcm"
    truncated.write_bytes(_j2k(plain, tmp_path / "j2k.dcm").read_bytes()[:-300])
    with pytest.raises(DatasetError, match=r"truncated\.dcm' is a truncated DICOM \(transfer syntax 'JPEG 2000 .*\): "
                                           r"the file ends at byte \d+ before its pixel data"):
        load_image(truncated, "r2")
    assert capfd.readouterr().err == ""


def test_a_corrupt_jpeg2000_header_does_not_take_the_process_down(tmp_path):
    """GDCM's JPEG 2000 path aborts the process (an uncaught C++ exception: "terminate called after
    throwing an instance of 'std::string'") on this header; with pylibjpeg-openjpeg installed GDCM is
    not tried for JPEG 2000 and the file is a DatasetError like any other (run in a child process,
    so a regression is a failed test, not a dead test run)."""
    import subprocess
    import sys

    data = bytearray(_j2k(_plain(tmp_path / "plain.dcm"), tmp_path / "j2k.dcm").read_bytes())
    soc = bytes(data).index(b"\xff\x4f\xff\x51")
    data[soc + 4: soc + 60] = b"\xff" * 56
    (tmp_path / "abort.dcm").write_bytes(bytes(data))
    code = ("from medvqa_env.errors import DatasetError\nfrom medvqa_env.images import load_image\n"
            f"try:\n    load_image({str(tmp_path / 'abort.dcm')!r}, 'r')\nexcept DatasetError as e:\n    print(e)\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[2])
    assert child.returncode == 0, child.stderr[-500:]
    assert "abort.dcm': cannot decode its pixel data (transfer syntax 'JPEG 2000 Image Compression" in child.stdout
    assert "pylibjpeg: Error decoding the J2K data" in child.stdout and child.stderr == ""
