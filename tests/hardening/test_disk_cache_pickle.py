"""No code from data (issue 40, attack 7): ``DiskToolCache`` (``tool_cache_dir``) stores results
as ``.npz`` data and never unpickles; a pickle planted under an entry's name is a miss and runs
nothing."""

from __future__ import annotations

import pickle

import numpy as np
from PIL import Image

from tool_backends.base import ToolResult
from tool_backends.disk_cache import DiskToolCache


class Planted:
    """A pickle that, when loaded, creates the file ``marker`` (any code could run instead)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_planted_pickle_is_refused_and_runs_nothing(tmp_path):
    cache = DiskToolCache(tmp_path / "cache")
    marker = tmp_path / "ran"
    cache._path("key").write_bytes(pickle.dumps(("key", Planted(str(marker)))))
    assert DiskToolCache(tmp_path / "cache").get("key") is None
    assert not marker.exists()


def test_an_npz_holding_a_pickled_object_array_is_refused(tmp_path):
    cache = DiskToolCache(tmp_path / "cache")
    marker = tmp_path / "ran"
    with open(cache._path("key"), "wb") as f:
        np.savez(f, meta=np.array([Planted(str(marker))], dtype=object))
    assert DiskToolCache(tmp_path / "cache").get("key") is None
    assert not marker.exists()


def test_results_round_trip_through_the_directory_as_data(tmp_path):
    rgb = Image.new("RGB", (7, 5), (1, 2, 3))
    gray = Image.new("L", (3, 4), 9)
    palette = Image.new("P", (2, 2))
    result = ToolResult("text", [rgb, gray, palette], {"mask_rle": {"size": [5, 7], "counts": [1, 2]}, "x": 1.5}, None)
    DiskToolCache(tmp_path).put("k", result)
    assert all(p.suffix == ".npz" for p in tmp_path.iterdir())
    back = DiskToolCache(tmp_path).get("k")
    assert (back.text, back.data, back.error) == (result.text, result.data, None)
    assert [im.mode for im in back.images] == ["RGB", "L", "RGB"]
    assert back.images[0].tobytes() == rgb.tobytes() and back.images[1].tobytes() == gray.tobytes()
    odd = ToolResult("odd", data={"array": np.zeros(2)})  # not JSON: kept in memory only
    DiskToolCache(tmp_path).put("odd", odd)
    assert DiskToolCache(tmp_path).get("odd") is None
