"""The notebooks under ``examples/`` run top to bottom, as a new user would run them (issue 30).

Each is executed with nbclient in a kernel that is this venv's python (a kernelspec written to a
temporary Jupyter path, so no user-level ``python3`` kernel can stand in), in a temporary working
folder, with the repository on the path. The notebooks are stored without outputs, so what is
checked is what runs today, not what ran once.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "examples").glob("*.ipynb"))
KERNEL = "medvqa-gym-venv"


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """A kernelspec named :data:`KERNEL` whose argv is this interpreter, found first on JUPYTER_PATH."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "medvqa-gym test kernel", "language": "python", "env": env}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL


def execute(path: Path, kernel_name: str, workdir: Path):
    nb = nbformat.read(path, as_version=4)
    # iopub_timeout: on a loaded machine a cell's last outputs may arrive seconds after its reply;
    # nbclient's default (4 s) would drop them silently
    client = nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=300, iopub_timeout=60,
                                     raise_on_iopub_timeout=True, resources={"metadata": {"path": str(workdir)}})
    client.execute()
    return nb


def test_there_are_notebooks_and_the_readme_links_each():
    readme = (REPO / "README.md").read_text()
    assert {p.name for p in NOTEBOOKS} >= {"probe_tools.ipynb", "train_and_evaluate.ipynb"}
    for path in NOTEBOOKS:
        assert f"examples/{path.name}" in readme, f"README does not link {path.name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: a cell holds outputs"


def _text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", ()):
            parts.append(out.get("text", "") if out.get("output_type") == "stream"
                         else out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _images(nb) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", ()))


@pytest.mark.slow
def test_probe_tools_runs_top_to_bottom(kernel, tmp_path):
    nb = execute(REPO / "examples" / "probe_tools.ipynb", kernel, tmp_path)
    text = _text(nb)
    for tool in ("[ground]", "[image_zoom_in]", "[segment]", "[classify]", "[hires_render]"):
        assert tool in text, f"no observation of {tool}"
    assert "same text: True | same boxes and masks: True | same images: True" in text
    assert "tool server stopped" in text and "reward 1.0" in text
    assert _images(nb) >= 7  # the question image, the tools' images, the renders, the side-by-side pair


@pytest.mark.slow
def test_train_and_evaluate_runs_top_to_bottom(kernel, tmp_path):
    nb = execute(REPO / "examples" / "train_and_evaluate.ipynb", kernel, tmp_path)
    text = _text(nb)
    assert "== train.sft done: " in text and "reproduce the held-out figure: python -m eval.run" in text
    trained, evaluated = (float(x) for x in
                          text.split("trainer's final held-out accuracy ")[1].split("\n")[0].split("; eval.run's "))
    assert trained == evaluated  # the printed command reproduces the trainer's figure
    out = tmp_path / "runs" / "notebook"
    assert (out / "compare.md").is_file() and (out / "compare.html").is_file()
    assert (out / "sft" / "final" / "medvqa_run.json").is_file() and _images(nb) >= 1  # the curves
