"""Issue 41, item 2: no decoder can take the process down, and a failure names the file.

GDCM throws an uncaught C++ exception (SIGABRT, exit 134) on a header-corrupted JPEG Baseline
DICOM: the tests write such a file themselves (a Pillow-encoded frame in a DICOM, its JPEG header
garbled), check that GDCM really aborts on it, and that the loader, a dataset's decode check and
the env all turn it into one :class:`DecodeError` line naming the file and its transfer syntax
while the process lives on. Each run that could abort is a child process, so a regression is a
failed test, not a dead test run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from medical_files import corrupt_jpeg_header, phantom, write_dicom, write_jpeg_baseline_dicom
from medvqa_env.errors import DatasetError, DecodeError
from medvqa_env.images import load_image

pydicom = pytest.importorskip("pydicom", reason="the 'medical' extra is part of the project's install")
gdcm = pytest.importorskip("gdcm", reason="the 'medical' extra installs python-gdcm (bash scripts/setup.sh)")

REPO = Path(__file__).resolve().parents[2]


def _grey() -> np.ndarray:
    return np.clip(phantom(60.0, 220.0), 0, 255).astype(np.uint8)


def _child(code: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture()
def baseline_files(tmp_path):
    good = write_jpeg_baseline_dicom(tmp_path / "good.dcm", _grey())
    bad = corrupt_jpeg_header(good, tmp_path / "bad_baseline.dcm")
    return good, bad


def test_gdcm_itself_aborts_on_the_corrupt_baseline_file(baseline_files):
    """The premise: called in-process, GDCM kills the interpreter on this file (exit 134) and
    Pillow refuses it cleanly -- so the file is a real test of containment."""
    _, bad = baseline_files
    code = f"""
        import pydicom
        ds = pydicom.dcmread({str(bad)!r})
        ds.pixel_array_options(decoding_plugin={{plugin!r}})
        try:
            ds.pixel_array
        except Exception as e:
            print("raised", type(e).__name__)
    """
    gdcm_run = _child(code.replace("{plugin!r}", "'gdcm'"))
    assert gdcm_run.returncode in (-6, 134), (gdcm_run.returncode, gdcm_run.stderr[-300:])
    assert "terminate called" in gdcm_run.stderr
    pillow_run = _child(code.replace("{plugin!r}", "'pillow'"))
    assert pillow_run.returncode == 0 and "raised RuntimeError" in pillow_run.stdout


def test_a_corrupt_baseline_dicom_is_one_decode_error_and_the_process_survives(baseline_files):
    good, bad = baseline_files
    child = _child(f"""
        from medvqa_env.errors import DecodeError
        from medvqa_env.images import load_image
        try:
            load_image({str(bad)!r}, "r1")
        except DecodeError as e:
            print("ERROR", e)
        print("GOOD", load_image({str(good)!r}, "r2").size)
    """)
    assert child.returncode == 0, (child.returncode, child.stderr[-500:])
    assert child.stderr == "", child.stderr  # GDCM's own words are in the reason, not on stderr
    error = next(line for line in child.stdout.splitlines() if line.startswith("ERROR "))
    assert f"record 'r1': image '{bad}': cannot decode its pixel data (transfer syntax 'JPEG Baseline (Process 1)' " \
           "(1.2.840.10008.1.2.4.50))" in error
    assert "pillow: cannot identify image file" in error  # Pillow refused it cleanly, in-process
    assert "gdcm: aborted (SIGABRT) on this file" in error and "terminate called" in error
    assert "GOOD (64, 48)" in child.stdout


def test_a_corrupt_file_in_a_dataset_is_named_by_the_loader_and_the_env(tmp_path, baseline_files):
    """A dataset holding the corrupt file: the decode check skips it by name, and an env given the
    record anyway raises DecodeError naming it at reset -- and the next episode runs."""
    good, bad = baseline_files
    rows = [{"id": "ok", "image": good.name, "question": "Is there a lesion?", "answer": "yes"},
            {"id": "broken", "image": bad.name, "question": "Is there a lesion?", "answer": "no"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    child = _child(f"""
        from medvqa_env.datasets import load_dataset
        from medvqa_env.env import MedVQAEnv
        from medvqa_env.errors import DecodeError
        checked = load_dataset({str(tmp_path / 'm.jsonl')!r}, check_images="decode", on_invalid="skip")
        print("KEPT", [checked[i].id for i in range(len(checked))])
        print("SKIPPED", checked.provenance.skipped[0]["reason"] if checked.provenance.skipped else None)
        env = MedVQAEnv(load_dataset({str(tmp_path / 'm.jsonl')!r}), max_turns=0)
        try:
            env.reset(options={{"index": 1}})
        except DecodeError as e:
            print("RESET", e)
        obs, info = env.reset(options={{"index": 0}})
        print("NEXT", info["record_id"])
    """)
    assert child.returncode == 0, (child.returncode, child.stderr[-800:])
    out = child.stdout
    assert "KEPT ['ok']" in out
    skipped = next(line for line in out.splitlines() if line.startswith("SKIPPED"))
    assert "bad_baseline.dcm" in skipped and "JPEG Baseline (Process 1)" in skipped
    reset = next(line for line in out.splitlines() if line.startswith("RESET"))
    assert "'broken'" in reset and "bad_baseline.dcm" in reset and "JPEG Baseline (Process 1)" in reset
    assert "NEXT ok" in out


def test_the_contained_decoder_starts_again_after_an_abort(tmp_path, baseline_files):
    from medvqa_env.contained_decode import ContainedDecoder, DecodeFailed

    good, bad = baseline_files
    lossless = _jpeg_lossless(tmp_path)
    decoder = ContainedDecoder()
    try:
        with pytest.raises(DecodeFailed, match=r"gdcm: aborted \(SIGABRT\)") as caught:
            decoder.decode(bad.read_bytes(), "gdcm")
        assert not caught.value.raised and "terminate called" in caught.value.said
        want = pydicom.dcmread(lossless).pixel_array
        assert np.array_equal(decoder.decode(lossless.read_bytes(), "gdcm"), want)
        assert decoder.started == 2  # the dead child was replaced, once
        with pytest.raises(DecodeFailed) as raised:  # a decoder that raises is reported, its child kept
            decoder.decode(corrupt_jpeg_header(lossless, tmp_path / "x.dcm", fill=b"\x13", n=78).read_bytes(), "gdcm")
        assert raised.value.raised and decoder.started == 2
    finally:
        decoder.close()


def _jpeg_lossless(tmp_path: Path) -> Path:
    plain = write_dicom(tmp_path / "plain.dcm", (phantom(40.0, 200.0) + 1024).astype(np.uint16), intercept=-1024,
                        window=(40, 400))
    reader = gdcm.ImageReader()
    reader.SetFileName(str(plain))
    assert reader.Read()
    change = gdcm.ImageChangeTransferSyntax()
    change.SetTransferSyntax(gdcm.TransferSyntax(gdcm.TransferSyntax.JPEGLosslessProcess14_1))
    change.SetInput(reader.GetImage())
    assert change.Change()
    writer = gdcm.ImageWriter()
    writer.SetFileName(str(tmp_path / "lossless.dcm"))
    writer.SetFile(reader.GetFile())
    writer.SetImage(change.GetOutput())
    assert writer.Write()
    return tmp_path / "lossless.dcm"


def test_decoding_keeps_other_threads_stderr(tmp_path, capfd):
    """The decoder-noise capture used to redirect file descriptor 2 for each decode: what another
    thread wrote meanwhile was swallowed. Now nothing here redirects it."""
    lossless = _jpeg_lossless(tmp_path)
    broken = corrupt_jpeg_header(lossless, tmp_path / "noisy.dcm", n=78)  # libjpeg prints "Corrupt JPEG data"
    load_image(lossless)  # the contained decoder is up
    capfd.readouterr()
    stop = threading.Event()
    written: list[int] = []

    def chatter() -> None:
        i = 0
        while not stop.is_set() or i < 50:
            os.write(2, f"line {i}\n".encode())
            written.append(i)
            i += 1

    thread = threading.Thread(target=chatter)
    thread.start()
    try:
        for _ in range(10):
            load_image(lossless)
            with pytest.raises(DecodeError):
                load_image(broken)
    finally:
        stop.set()
        thread.join()
    err = capfd.readouterr().err
    lines = err.splitlines()
    assert [f"line {i}" for i in written] == lines, (len(written), len(lines), err[-300:])
    assert "Corrupt JPEG" not in err  # the decoder's own noise still stays out


def test_a_300_byte_truncated_dicom_says_truncated(tmp_path):
    data = write_jpeg_baseline_dicom(tmp_path / "whole.dcm", _grey()).read_bytes()
    (tmp_path / "cut.dcm").write_bytes(data[:300])
    with pytest.raises(DecodeError, match=r"cut\.dcm' is a truncated DICOM .*: the file ends at byte 300 before its "
                                          r"file meta header ends") as caught:
        load_image(tmp_path / "cut.dcm", "r")
    assert "without an image" not in str(caught.value)
    for n in (400, 480, 700):  # inside the data set's elements, inside the pixel data
        plain = write_dicom(tmp_path / "p.dcm", (phantom(40.0, 200.0) + 1024).astype(np.uint16)).read_bytes()
        (tmp_path / f"cut{n}.dcm").write_bytes(plain[:n])
        with pytest.raises(DecodeError, match=rf"is a truncated DICOM .*the file ends at byte {n} "):
            load_image(tmp_path / f"cut{n}.dcm", "r")
    # a whole DICOM that holds no image is still told apart
    ds = pydicom.dcmread(tmp_path / "p.dcm")
    del ds.PixelData, ds.Rows, ds.Columns
    ds.save_as(tmp_path / "report.dcm", enforce_file_format=True)
    with pytest.raises(DatasetError, match="is a DICOM without an image"):
        load_image(tmp_path / "report.dcm", "r")


def test_12_bit_jpeg_extended_is_a_documented_decode_error():
    """pydicom's own example of a 12-bit JPEG Extended file: no installed plugin decodes it (Pillow
    and GDCM both refuse 12-bit precision); the error says so and points at docs/datasets.md,
    which lists it among what cannot be decoded."""
    path = pydicom.data.get_testdata_file("JPGExtended.dcm")
    with pytest.raises(DecodeError, match=r"transfer syntax 'JPEG Extended \(Process 2 and 4\)'.*12-bit JPEG Extended "
                                          r"image has no decoder in the medical extra .*docs/datasets\.md"):
        load_image(path, "r")
    docs = (REPO / "docs" / "datasets.md").read_text()
    assert "12-bit JPEG Extended" in docs


@pytest.mark.slow
def test_a_benchmark_with_a_corrupt_baseline_dicom_loses_no_valid_episode(tmp_path, baseline_files):
    """``eval.run --workers 2`` on a dataset holding the corrupt file: the process ends, every valid
    episode is scored, and the one bad episode's error names its file and transfer syntax (one bad
    file used to abort a worker and cost the episodes beside it as ``worker_crash``)."""
    good, bad = baseline_files
    rows = [{"id": f"ok{i}", "image": good.name, "question": "Is there a lesion?", "answer": "yes",
             "answer_type": "CLOSED"} for i in range(6)]
    rows.insert(3, {"id": "broken", "image": bad.name, "question": "Is there a lesion?", "answer": "no",
                    "answer_type": "CLOSED"})
    manifest = good.parent / "qa.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    child = subprocess.run(
        [sys.executable, "-m", "eval.run", "--agent", "oracle", "--dataset", str(manifest), "--split", "all",
         "--workers", "2", "--tools", "none", "--no-progress", "--bootstrap", "0", "--no-open-metrics",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.returncode in (0, 1), (child.returncode, child.stderr[-1500:])  # 1: the failure rate, said
    episodes = {e["record_id"]: e for e in map(json.loads, (out / "episodes.jsonl").read_text().splitlines())}
    assert {rid for rid, e in episodes.items() if e["correct"]} == {f"ok{i}" for i in range(6)}
    broken = episodes["broken"]
    assert broken["error"] and "worker_crash" not in json.dumps(broken["error"])
    reason = json.dumps(broken["error"], ensure_ascii=False)
    assert "bad_baseline.dcm" in reason and "JPEG Baseline (Process 1)" in reason
    assert "terminate called" not in child.stderr
