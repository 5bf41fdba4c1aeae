"""Env worker processes: batched commands, per-episode errors, a dead worker restarted."""

from __future__ import annotations

import pytest

from eval.pool import EnvPool, EnvSpec


def answers(pool):
    got = {}
    while any(pool.busy):
        got.update(pool.poll())
    return got


def test_commands_run_in_workers_and_errors_stay_per_episode(dataset):
    pool = EnvPool(EnvSpec(dataset, open_metrics=False), workers=2, slots=2)
    try:
        pool.submit(0, [("reset", 0, 0, 1), ("reset", 1, 99, 1)])  # index 99 does not exist
        pool.submit(1, [("reset", 0, 1, 1), ("step", 1, "\\boxed{yes}")])  # step before reset
        got = answers(pool)
        assert got[0][0]["kind"] == "reset" and got[0][0]["info"]["record_id"] == dataset[0].id
        assert got[0][1]["error"]["kind"] == "env_error" and "IndexError" in got[0][1]["error"]["message"]
        assert got[1][1]["error"]["kind"] == "env_error" and "before reset" in got[1][1]["error"]["message"]
        pool.submit(0, [("step", 0, "\\boxed{yes}")])
        done = answers(pool)[0][0]
        assert done["terminated"] and done["score"]["correct"] is True
    finally:
        pool.close()


def test_a_dead_worker_is_reported_once_and_restarted(dataset):
    pool = EnvPool(EnvSpec(dataset, open_metrics=False), workers=2, slots=1)
    try:
        pool._procs[0].kill()
        pool._procs[0].join(timeout=10)
        pool.submit(0, [("reset", 0, 0, 1)])
        pool.submit(1, [("reset", 0, 1, 1)])
        got = answers(pool)
        assert got[0] is None and got[1][0]["kind"] == "reset"
        pool.submit(0, [("reset", 0, 2, 1)])  # the restarted worker serves again
        assert answers(pool)[0][0]["info"]["record_id"] == dataset[2].id
    finally:
        pool.close()


def test_bad_pool_sizes_are_refused(dataset):
    with pytest.raises(ValueError, match="expected workers >= 0 and slots >= 1"):
        EnvPool(EnvSpec(dataset), workers=1, slots=0)


def test_images_cross_through_the_arena_and_what_does_not_fit_goes_inline():
    from multiprocessing import shared_memory

    import numpy as np

    from eval.pool import ArenaImage, fetch_images, park_images

    arena = shared_memory.SharedMemory(create=True, size=4096)
    try:
        small, big = np.arange(48, dtype=np.uint8).reshape(4, 4, 3), np.ones((64, 64, 3), np.uint8)
        results = [{"obs": {"text": "x", "images": (small, big)}}, {"error": {"kind": "env_error"}}]
        parked = park_images(results, arena)
        kinds = [type(a) for a in parked[0]["obs"]["images"]]
        assert kinds == [ArenaImage, np.ndarray]
        back = fetch_images(parked, arena)[0]["obs"]["images"]
        assert np.array_equal(back[0], small) and np.array_equal(back[1], big)
    finally:
        arena.close()
        arena.unlink()
