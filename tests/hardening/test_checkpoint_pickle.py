"""A checkpoint folder cannot run code: resuming reads ``trainer_state/`` without unpickling
arbitrary objects (issue 28). The RNG state is JSON; an older run's ``rng.pt`` and the optimizer
are read with ``weights_only=True``, so a crafted pickle is refused before anything in it runs."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from train.checkpoint import STATE_DIR, load_checkpoint, load_rng_state, rng_state, save_checkpoint, set_rng_state


class _RunsCode:
    """Unpickling this calls ``Path.touch(marker)``: what a crafted ``rng.pt`` would do."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def _checkpoint(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer, save_checkpoint(tmp_path / "run", 1, model, optimizer, {"acc": 0.5})


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_a_crafted_rng_pt_is_refused_and_never_run(tmp_path):
    model, optimizer, path = _checkpoint(tmp_path)
    state_dir = path / STATE_DIR
    (state_dir / "rng.json").unlink()  # an older run's folder, or one someone swapped in
    marker = tmp_path / "ran"
    torch.save({"python": _RunsCode(marker)}, state_dir / "rng.pt")
    with pytest.raises(ValueError, match="refused, nothing in it was run"):
        load_checkpoint(path, model, optimizer)
    assert not marker.exists()


def test_a_crafted_optimizer_pt_is_refused_and_never_run(tmp_path):
    model, optimizer, path = _checkpoint(tmp_path)
    marker = tmp_path / "ran"
    torch.save({"state": _RunsCode(marker)}, path / STATE_DIR / "optimizer.pt")
    with pytest.raises(Exception):
        load_checkpoint(path, model, optimizer)
    assert not marker.exists()


def test_the_rng_state_is_json_and_resuming_restores_every_stream(tmp_path):
    model, optimizer, path = _checkpoint(tmp_path)
    assert not (path / STATE_DIR / "rng.pt").exists() and (path / STATE_DIR / "rng.json").is_file()
    expected = _draws()  # the draws right after the checkpoint was written
    _draws(), _draws()
    load_checkpoint(path, model, optimizer)
    assert _draws() == expected


def test_an_older_runs_rng_pt_still_resumes(tmp_path):
    model, optimizer, path = _checkpoint(tmp_path)
    state_dir = path / STATE_DIR
    (state_dir / "rng.json").unlink()
    torch.save(rng_state(), state_dir / "rng.pt")  # what save_checkpoint wrote before
    expected = _draws()
    _draws()
    set_rng_state(load_rng_state(state_dir))
    assert _draws() == expected
    load_checkpoint(path, model, optimizer)  # and through the resume path
