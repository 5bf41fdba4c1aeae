"""The one env pool: every backend passes one suite (real processes, real Ray actors), the copies
of a group share one reward and one tool cache, and thresholds move only at a batch end."""

from __future__ import annotations

import numpy as np
import pytest

from medvqa_env.errors import ConfigError
from medvqa_env.pool import EnvPool, PoolSpec

SEGMENT = '<tool_call>{"name": "segment", "arguments": {"bbox": [20, 50, 40, 70]}}</tool_call>'
ZOOM = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [20, 50, 40, 70]}}</tool_call>'
TOOLS = {"image_zoom_in": "local", "segment": {"engine": "classical"}}


@pytest.fixture(scope="module", params=["thread", "process", "ray"])
def backend(request):
    yield request.param
    if request.param == "ray":  # leave no Ray running for later test modules
        import ray

        ray.shutdown()


@pytest.fixture(scope="module")
def pool(backend, tiny_dataset):
    p = EnvPool({"dataset": tiny_dataset, "tools": TOOLS, "max_turns": 2, "reward": "rule"}, size=8,
                backend=backend, workers=2, group_size=4)
    yield p
    p.close()


def test_a_group_runs_identical_episodes_and_pays_once_per_tool_call(pool):
    before = pool.tool_cache_stats()
    resets = pool.reset([(5, {"index": 0})] * 4 + [(5, {"index": 2})] * 4)
    assert [info["record_id"] for _, info in resets] == ["t_closed"] * 4 + ["t_open"] * 4
    results = pool.step({s: SEGMENT for s in range(8)})
    texts = {results[s][4]["tool_calls"][0]["text"] for s in range(4)}
    assert len(texts) == 1 and "Error" not in next(iter(texts))
    masks = [results[s][0]["images"][0] for s in range(4)]
    assert all(np.array_equal(masks[0], m) for m in masks)
    after = pool.tool_cache_stats()
    # two groups of four copies, each group on one worker: the tool really ran twice, not eight times
    assert after["misses"] - before["misses"] == 2 and after["hits"] - before["hits"] == 6


def test_same_answer_same_reward_across_copies_and_workers(pool):
    pool.reset([(0, {"index": 0})] * 8)
    results = pool.step_async({s: r"\boxed{yes}" if s % 2 else r"\boxed{no}" for s in range(8)}).result()
    rewards = [results[s][1] for s in range(8)]
    assert rewards == [-1.0, 1.0] * 4 and all(results[s][2] for s in range(8))
    assert results[1][4]["correct"] is True and results[1][4]["reward_components"]["accuracy"] == 1.0
    assert "reward_input" not in results[1][4]


def test_errors_and_slot_checks(pool):
    with pytest.raises(ConfigError, match="at most 8 env slots"):
        pool.reset([(0, None)] * 9)
    with pytest.raises(RuntimeError, match="index"):
        pool.reset([(0, {"index": 99})])
    pool.reset([(0, {"index": 0})])
    pool.step({0: r"\boxed{yes}"})
    with pytest.raises(RuntimeError, match="has ended"):
        pool.step({0: r"\boxed{yes}"})


def test_worker_commands_keep_errors_per_episode(tiny_dataset):
    with EnvPool(PoolSpec({"dataset": tiny_dataset, "tools": []}), size=4, backend="process", workers=2,
                 reward="rule") as pool:
        pool.submit(0, [("reset", 0, 1, {"index": 0}), ("reset", 1, 1, {"index": 99})])
        pool.submit(1, [("reset", 0, 1, {"index": 1}), ("step", 1, r"\boxed{yes}")])  # step before reset
        got = _answers(pool)
        assert got[0][0]["kind"] == "reset" and got[0][0]["info"]["record_id"] == "t_closed"
        assert got[0][1]["error"]["kind"] == "env_error" and "IndexError" in got[0][1]["error"]["message"]
        assert got[1][1]["error"]["kind"] == "env_error" and "before reset" in got[1][1]["error"]["message"]
        pool.submit(0, [("step", 0, r"\boxed{yes}")])
        done = _answers(pool)[0][0]
        assert done["terminated"] and done["reward"] == 1.0 and done["info"]["correct"] is True


def test_a_dead_worker_is_reported_once_and_restarted(tiny_dataset):
    with EnvPool({"dataset": tiny_dataset, "tools": [], "reward": "rule"}, size=2, backend="process",
                 workers=2) as pool:
        procs = pool._workers._procs
        procs[0].kill()
        procs[0].join(timeout=10)
        pool.submit(0, [("reset", 0, 1, {"index": 0})])
        pool.submit(1, [("reset", 0, 1, {"index": 1})])
        got = _answers(pool)
        assert got[0] is None and got[1][0]["kind"] == "reset"
        pool.submit(0, [("reset", 0, 1, {"index": 2})])  # the restarted worker serves again
        assert _answers(pool)[0][0]["info"]["record_id"] == "t_open"


def test_bad_pool_arguments(tiny_dataset):
    kwargs = {"dataset": tiny_dataset, "tools": []}
    with pytest.raises(ConfigError, match="pool size"):
        EnvPool(kwargs, size=0)
    with pytest.raises(ConfigError, match="Did you mean 'ray'"):
        EnvPool(kwargs, size=1, backend="rya")
    with pytest.raises(ConfigError, match="services"):
        EnvPool({**kwargs, "services": None}, size=1)


def test_groups_are_placed_on_one_worker(tiny_dataset):
    with EnvPool({"dataset": tiny_dataset, "tools": [], "reward": "rule"}, size=12, workers=2,
                 group_size=4) as pool:
        workers = [pool.locate(s)[0] for s in range(12)]
        assert [len({workers[g * 4 + k] for k in range(4)}) for g in range(3)] == [1, 1, 1]


def test_images_cross_through_the_arena_and_what_does_not_fit_goes_inline():
    from multiprocessing import shared_memory

    from medvqa_env.pool_backends import ArenaImage, fetch_images, park_images

    arena = shared_memory.SharedMemory(create=True, size=4096)
    try:
        small, big = np.arange(48, dtype=np.uint8).reshape(4, 4, 3), np.ones((64, 64, 3), np.uint8)
        results = [{"obs": {"text": "x", "images": (small, big)}}, {"error": {"kind": "env_error"}}]
        parked = park_images(results, arena)
        assert [type(a) for a in parked[0]["obs"]["images"]] == [ArenaImage, np.ndarray]
        back = fetch_images(parked, arena)[0]["obs"]["images"]
        assert np.array_equal(back[0], small) and np.array_equal(back[1], big)
    finally:
        arena.close()
        arena.unlink()


def _answers(pool):
    got = {}
    while any(pool.busy):
        got.update(pool.poll())
    return got


def test_a_plain_script_without_a_main_guard_can_run_process_workers(tmp_path):
    """Spawned workers used to re-run the user's script (no ``if __name__ == "__main__"``) and die
    with "env worker 0 could not start", leaking shared memory."""
    import os
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text(
        "from medvqa_env.pool import EnvPool\n"
        "pool = EnvPool({'dataset': 'embedded', 'tools': ['image_zoom_in'], 'reward': 'rule'}, size=2,"
        " backend='process', workers=2)\n"
        "print(len(pool.reset([(0, {'index': 1})] * 2)), 'resets')\n"
        "pool.close()\n")
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 resets" in done.stdout and "leaked" not in done.stderr
    if shm_before:
        assert not {n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith("psm_")}


def test_slot_regions_keep_each_image_in_place_until_its_slot_is_reset():
    from multiprocessing import shared_memory

    from medvqa_env.pool_backends import ArenaImage, SlotRegions, fetch_images

    arena = shared_memory.SharedMemory(create=True, size=2 * 1024)
    try:
        regions = SlotRegions(arena, slots=2)  # 1024 bytes each

        def image(value, side=8):
            return np.full((side, side, 3), value, np.uint8)  # 192 bytes

        def obs(*images):
            return {"obs": {"text": "", "images": images}}

        first = fetch_images(regions.park([("reset", 0, 0, {})], [obs(image(1))]), arena, views=True)
        kept = first[0]["obs"]["images"][0]
        assert not kept.flags.writeable
        # other slots' resets and steps, and this slot's own steps, append elsewhere
        regions.park([("reset", 1, 0, {}), ("step", 1, "a"), ("step", 0, "b")],
                     [obs(image(2)), obs(image(3)), obs(image(4, side=12))])
        assert (kept == 1).all()
        # a step whose images do not fit the slot's region sends them inline
        big = regions.park([("step", 0, "c")], [obs(image(5, side=16))])[0]["obs"]["images"][0]
        assert isinstance(big, np.ndarray) and (big == 5).all()
        # the slot's next reset rewinds it: the old episode's image is gone
        parked = regions.park([("reset", 0, 0, {})], [obs(image(6))])[0]["obs"]["images"][0]
        assert isinstance(parked, ArenaImage) and parked.offset == 0 and (kept == 6).all()
    finally:
        del kept, first
        arena.close()
        arena.unlink()


def test_process_pool_image_views_match_copies_across_resets_of_other_slots(tiny_dataset):
    kwargs = {"dataset": tiny_dataset, "tools": ["image_zoom_in"], "reward": "rule"}
    zoom = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 16, 16]}}</tool_call>'

    def episode_images(pool):
        (obs0, _), (obs1, _) = pool.reset([(0, {"index": 0}), (0, {"index": 1})])
        crop0 = pool.step({0: zoom})[0][0]["images"][0]
        pool.step({1: zoom})
        pool.reset_slots({1: (0, {"index": 2})})  # slot 1 starts again; slot 0's images stay
        return [np.array(obs0["images"][0]), np.array(crop0)], [obs0["images"][0], crop0]

    with EnvPool(kwargs, size=2, backend="thread") as pool:
        expected, _ = episode_images(pool)
    with EnvPool(kwargs, size=2, backend="process", workers=1, image_views=True) as pool:
        _, views = episode_images(pool)
        assert [v.flags.writeable for v in views] == [False, False]
        assert all(np.array_equal(v, e) for v, e in zip(views, expected))
        del views


def test_a_worker_whose_results_are_copied_anyway_skips_the_envs_own_copy(tiny_dataset):
    from medvqa_env.pool import EnvWorker, resolve_spec

    spec, _ = resolve_spec({"dataset": tiny_dataset, "tools": []})
    copied, shared = EnvWorker(spec, 1), EnvWorker(spec, 1, copy_images=False)
    a = copied.run([("reset", 0, 0, {"index": 0})])[0]["obs"]["images"][0]
    b = shared.run([("reset", 0, 0, {"index": 0})])[0]["obs"]["images"][0]
    assert np.array_equal(a, b) and a.flags.writeable and not b.flags.writeable  # the cache's array, read-only
    copied.close(), shared.close()
