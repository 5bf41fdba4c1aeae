"""``/get_observation`` keeps at most ``max_trajectories`` live trajectories (least recently used
forgotten), so a server that never receives ``finish`` -- verl-tool's own grows by every turn's
images until one comes -- holds a bounded set of images (issue 47: RSS flat over 10,000 turns in
``benchmarks/bench_seed_wire.py``; this is the bound that makes it so)."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from tool_backends.config import load_tool_config, make_backends
from tool_backends.server import ServerSettings, ToolService
from tool_backends.trajectories import TrajectoryObserver

TURN = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [10, 10, 60, 50], "image_index": %d}}</tool_call>'


def _upload(seed: int) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (96, 128, 3), dtype=np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_the_least_recently_used_trajectory_is_forgotten_past_the_bound():
    service = ToolService(make_backends(load_tool_config({"image_zoom_in": "local"})), ServerSettings())
    observer = TrajectoryObserver(service, max_trajectories=3)
    for i in range(3):
        obs, _, valid = observer.step(f"t{i}", TURN % 0, {"images": [_upload(i)]}, False)
        assert valid and "image 1" in obs["obs"]
    observer.step("t0", TURN % 1, {}, False)  # t0 used again: t1 is now the least recently used
    for i in range(3, 10):
        observer.step(f"t{i}", TURN % 0, {"images": [_upload(i)]}, False)
        assert len(observer) == 3  # never more, however many trajectories come without finish
    # the newest trajectories keep their images (a later turn can zoom into the earlier crop) ...
    obs, _, valid = observer.step("t9", TURN % 1, {}, False)
    assert valid and "of image 1" in obs["obs"]
    # ... a forgotten one has none left: its next turn says so, it does not crash or see another's image
    obs, _, valid = observer.step("t1", TURN % 0, {}, False)
    assert not valid and "image" in str(obs)
