"""Issue 41, item 7: pictures a person must read. compare.html plots the compared figures with
their intervals (before: tables only); no report figure is wider than the page (before: the
by-slice figure of four slices was 1400 px on a 1200 px page)."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import numpy as np
from PIL import Image

from eval.compare import main as compare
from eval.report import FIGURE_MAX_PX, write_reports
from eval.runner import EvalConfig, evaluate
from eval.scripted import ScriptedAgent
from medvqa_env.datasets import load_dataset

FAST = dict(workers=0, tools=[], open_metrics=False, progress=False, bootstrap=100)


def manifest(root: Path, n: int = 12) -> Path:
    """CLOSED questions over two modalities and two organs, one real PNG each."""
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(n):
        Image.fromarray((np.random.default_rng(i).random((16, 16, 3)) * 255).astype("uint8")).save(root / "img" / f"{i}.png")
        rows.append({"id": f"q{i:02d}", "image_paths": [f"img/{i}.png"], "question": f"Is {i} normal?",
                     "answer_type": "CLOSED", "answer": "yes" if i % 3 else "no", "modality": ("CT", "MRI")[i % 2],
                     "organ": ("lung", "brain")[i % 2]})
    (root / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "qa.jsonl"


def _embedded_pngs(page: str) -> list[Image.Image]:
    return [Image.open(io.BytesIO(base64.b64decode(b))) for b in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)]


def test_compare_html_plots_the_compared_figures_with_their_intervals(tmp_path, capsys):
    ds = load_dataset(str(manifest(tmp_path / "data")))
    runs = tmp_path / "runs"
    for name, answer in (("yes", "yes"), ("no", "no")):
        evaluate(ScriptedAgent(answer=answer, zoom=False), ds, EvalConfig(**FAST), out_dir=runs / name)
    assert compare([str(runs / "yes"), str(runs / "no"), "--select", "closed"]) == 0
    assert f"(plot: {runs / 'compare.png'})" in capsys.readouterr().err
    page = (runs / "compare.html").read_text()
    images = _embedded_pngs(page)
    assert len(images) == 1 and images[0].size[0] <= FIGURE_MAX_PX
    assert (runs / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![compared figures with their 95% intervals](compare.png)" in (runs / "compare.md").read_text()
    # the bars carry their interval: the 'no' run's CLOSED 0.333 [lo, hi] is drawn with an error bar
    pixels = np.asarray(images[0].convert("RGB")).astype(int)
    black = (pixels.sum(-1) < 60)  # error bars and caps are drawn black
    assert black[:, : pixels.shape[1] // 2].sum() > 30
    assert compare([str(runs / "yes"), str(runs / "no")]) == 0  # a second call over the same folder is fine


def test_no_report_figure_is_wider_than_the_page(tmp_path):
    ds = load_dataset(str(manifest(tmp_path / "data")))
    summary = evaluate(ScriptedAgent(zoom=False), ds, EvalConfig(**FAST))
    assert len(summary.by_organ) == 2 and len(summary.by_modality) == 2  # four slice panels
    out = tmp_path / "report"
    write_reports(out, summary)
    widths = {p.name: Image.open(p).size[0] for p in (out / "plots").glob("*.png")}
    assert "by_slice.png" in widths and max(widths.values()) <= FIGURE_MAX_PX, widths
    page = (out / "report.html").read_text()
    assert "img{max-width:100%;height:auto}" in page
