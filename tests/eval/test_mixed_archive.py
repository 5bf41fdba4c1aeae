"""Done-when test of issue 27: a mixed archive -- accepted alternatives, SLAKE-style Chinese and
Spanish answers, a gold that normalises to nothing, valid and corrupt compressed DICOMs -- runs
through ``eval.run`` with every score right (gold > near miss > wrong in the env reward and the
eval metrics), every skipped row listed with its file, transfer syntax and reason, and a quiet
log: no decoder tracebacks or C-library chatter on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "medvqa_env"))  # the image tests' DICOM writer
from medical_files import phantom, write_dicom  # noqa: E402

pydicom = pytest.importorskip("pydicom", reason="the 'medical' extra is part of the project's install")
gdcm = pytest.importorskip("gdcm", reason="the 'medical' extra installs python-gdcm (bash scripts/setup.sh)")
pytest.importorskip("openjpeg", reason="the 'medical' extra installs pylibjpeg-openjpeg (bash scripts/setup.sh)")

ZH, ES = "左肺", "pulmón izquierdo"
# id -> (answer type, gold, alternatives, image, the answer given); skipped rows have no answer given
ROWS = {
    "alt": ("OPEN", "septic cerebral emboli", ["mass"], "plain.png", "mass"),
    "zh_gold": ("OPEN", ZH, [], "plain.png", "左肺。"),
    "zh_near": ("OPEN", ZH, [], "plain.png", "右肺"),
    "zh_wrong": ("OPEN", ZH, [], "plain.png", "肝"),
    "zh_closed": ("CLOSED", "是", [], "plain.png", "是的"),
    "es_gold": ("OPEN", ES, [], "plain.png", "Pulmón izquierdo."),
    "es_near": ("OPEN", ES, [], "plain.png", "pulmón derecho"),
    "es_wrong": ("OPEN", ES, [], "plain.png", "hígado"),
    "empty_gold": ("OPEN", "。", [], "plain.png", None),
    "dcm_ok": ("CLOSED", "yes", [], "ok_j2k.dcm", "Yes"),
    "dcm_corrupt_j2k": ("CLOSED", "yes", [], "corrupt_j2k.dcm", None),
    "dcm_corrupt_jpeg": ("CLOSED", "no", [], "corrupt_jpeg_lossless.dcm", None),
    "dcm_truncated": ("CLOSED", "no", [], "truncated.dcm", None),
}


def _dicoms(root: Path) -> None:
    plain = write_dicom(root / "plain.dcm", (phantom(40.0, 200.0) + 1024).astype(np.uint16), intercept=-1024,
                        window=(40, 400))
    ds = pydicom.dcmread(plain)
    ds.compress(pydicom.uid.JPEG2000Lossless)
    ds.save_as(root / "ok_j2k.dcm", enforce_file_format=True)
    j2k = bytearray((root / "ok_j2k.dcm").read_bytes())
    soc = bytes(j2k).index(b"\xff\x4f\xff\x51")  # the codestream's start and its SIZ marker
    broken = bytearray(j2k)
    broken[soc + 4: soc + 40] = b"\xff" * 36
    (root / "corrupt_j2k.dcm").write_bytes(bytes(broken))
    (root / "truncated.dcm").write_bytes(bytes(j2k[:-300]))
    reader = gdcm.ImageReader()  # JPEG Lossless through GDCM's encoder, then its JPEG header garbled
    reader.SetFileName(str(plain))
    assert reader.Read()
    change = gdcm.ImageChangeTransferSyntax()
    change.SetTransferSyntax(gdcm.TransferSyntax(gdcm.TransferSyntax.JPEGLosslessProcess14_1))
    change.SetInput(reader.GetImage())
    assert change.Change()
    writer = gdcm.ImageWriter()
    writer.SetFileName(str(root / "jpeg_lossless.dcm"))
    writer.SetFile(reader.GetFile())
    writer.SetImage(change.GetOutput())
    assert writer.Write()
    jpeg = bytearray((root / "jpeg_lossless.dcm").read_bytes())
    soi = bytes(jpeg).index(b"\xff\xd8")
    jpeg[soi + 2: soi + 80] = b"\x13" * 78
    (root / "corrupt_jpeg_lossless.dcm").write_bytes(bytes(jpeg))


def _archive(root: Path) -> Path:
    root.mkdir(parents=True)
    Image.fromarray((np.random.default_rng(0).random((48, 48, 3)) * 255).astype("uint8")).save(root / "plain.png")
    _dicoms(root)
    lines = []
    for rid, (kind, gold, alternatives, image, _) in ROWS.items():
        row = {"id": rid, "image": image, "question": f"Question {rid}?", "answer": gold, "answer_type": kind,
               "q_lang": "zh" if rid.startswith("zh") else "es" if rid.startswith("es") else "en"}
        if alternatives:
            row["metadata"] = {"answer_alternatives": alternatives}
        lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    (root / "qa.jsonl").write_text("".join(lines), encoding="utf-8")
    return root / "qa.jsonl"


def test_a_mixed_archive_is_scored_right_every_skip_listed_and_the_log_quiet(tmp_path, capfd, caplog):
    from eval.run import main

    manifest = _archive(tmp_path / "archive")
    out = tmp_path / "run"
    answers = {rid: given for rid, (*_, given) in ROWS.items() if given is not None}
    code = main(["--agent", "answer_book:AnswerBook", "--agent-opt", "answers=" + json.dumps(answers, ensure_ascii=False),
                 "--dataset", str(manifest), "--dataset-opt", "on_invalid=skip", "--dataset-opt", "check_images=decode",
                 "--out", str(out), "--reward", "default", "--tools", "none", "--workers", "0", "--no-progress",
                 "--bootstrap", "0"])
    captured = capfd.readouterr()
    assert code == 0, captured.err

    rows = {r["record_id"]: r for r in map(json.loads, (out / "episodes.jsonl").read_text().splitlines())}
    assert set(rows) == {rid for rid, (*_, given) in ROWS.items() if given is not None}
    assert all(r["error"] is None for r in rows.values())
    right = {"alt", "zh_gold", "zh_closed", "es_gold", "dcm_ok"}
    assert {rid for rid, r in rows.items() if r["correct"]} == right
    # the env reward: the accepted alternative earns a right answer's reward; gold > near miss > wrong
    assert rows["alt"]["reward"] > 0.9 and rows["alt"]["reward_components"]["alternative"] == 1.0
    assert rows["zh_closed"]["reward"] == rows["dcm_ok"]["reward"] == 1.0
    for lang in ("zh", "es"):
        gold, near, wrong = (rows[f"{lang}_{k}"] for k in ("gold", "near", "wrong"))
        assert gold["reward"] > near["reward"] > wrong["reward"], lang
        assert gold["metrics"]["armed_avg"] > near["metrics"]["armed_avg"] > wrong["metrics"]["armed_avg"], lang
        assert (gold["metrics"]["bleu1"], near["metrics"]["bleu1"], wrong["metrics"]["bleu1"]) == (1.0, 0.5, 0.0), lang
    # MiniLM reads Chinese as [UNK]: no BERTScore/cosine for it, rather than a 1.0 for every answer
    assert "bertscore" not in rows["zh_wrong"]["metrics"] and rows["zh_wrong"]["reward_components"]["semantic"] == 0.0
    assert "bertscore" in rows["es_wrong"]["metrics"] and rows["es_wrong"]["reward_components"]["semantic"] == 1.0
    assert rows["alt"]["metrics"]["armed_avg"] == 1.0  # the best alternative's metrics

    skipped = {s["record_id"]: s for s in map(json.loads, (out / "skipped_records.jsonl").read_text().splitlines())}
    assert set(skipped) == {"empty_gold", "dcm_corrupt_j2k", "dcm_corrupt_jpeg", "dcm_truncated"}
    assert all(s["source"] == str(manifest) and s["where"].startswith("line ") for s in skipped.values())
    assert "empty answer once normalised" in skipped["empty_gold"]["reason"]
    j2k = skipped["dcm_corrupt_j2k"]["reason"]
    assert "corrupt_j2k.dcm" in j2k and "'JPEG 2000 Image Compression (Lossless Only)'" in j2k
    assert "pylibjpeg: Error decoding the J2K data: failed to read the header" in j2k
    jpeg = skipped["dcm_corrupt_jpeg"]["reason"]
    assert "corrupt_jpeg_lossless.dcm" in jpeg and "JPEG Lossless" in jpeg and "1.2.840.10008.1.2.4.70" in jpeg
    assert "gdcm: the decoder returned no pixels" in jpeg and "Corrupt JPEG data" in jpeg  # libjpeg's words, kept
    truncated = skipped["dcm_truncated"]["reason"]
    assert "truncated.dcm' cannot be decoded: is a truncated DICOM" in truncated and "ends at byte" in truncated
    for reason in map(lambda s: s["reason"], skipped.values()):
        assert "\n" not in reason and "NoneType" not in reason and "Traceback" not in reason
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["n_episodes"], summary["n_errors"], summary["n_skipped_records"]) == (len(rows), 0, 4)
    assert "Dataset rows skipped by the loader: 4" in (out / "report.md").read_text().splitlines()[2]

    # quiet: nothing of the decoders reaches stderr (their words are in the reasons above), and the
    # log holds a few readable lines, none a traceback
    for noise in ("Corrupt JPEG", "Traceback", "NoneType", "marker", "pydicom", "terminate called"):
        assert noise not in captured.err, (noise, captured.err)
    messages = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert len(messages) <= 3 and all("\n" not in m and "Traceback" not in m for m in messages), messages
    assert any("skipped 4 invalid row(s)" in m for m in messages)
