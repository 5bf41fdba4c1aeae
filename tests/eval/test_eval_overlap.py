"""``overlap=True``: two waves of episodes take turns, env workers step one while the agent acts on
the other -- same episodes as the serial harness, full agent batches, crashes still contained."""

from __future__ import annotations

import multiprocessing

import pytest

import eval.runner as runner_module
from eval.runner import EvalConfig, Runner
from eval.scripted import ScriptedAgent
from medvqa_env.datasets import load_dataset
from medvqa_env.pool import EnvPool

from eval_helpers import by_key

FAST = dict(progress=False, open_metrics=False, bootstrap=50)


def run(agent, dataset, **cfg):
    return Runner(agent, dataset, EvalConfig(**{**FAST, **cfg}), out_dir=None).run()


def mixed_agent(**kw) -> ScriptedAgent:
    """Episodes of different lengths and outcomes, so the waves do not stay in lockstep."""
    return ScriptedAgent(bad_tool_on="q05", garbage_on="q07", crash_on="q10", **kw)


@pytest.mark.parametrize("workers", [2, 0])
def test_overlap_gives_the_same_episodes_as_serial(dataset, workers):
    serial = run(mixed_agent(), dataset, k=2, workers=0, batch_size=5)
    agent = mixed_agent()
    overlapped = run(agent, dataset, k=2, workers=workers, batch_size=5, overlap=True)
    assert by_key(overlapped) == by_key(serial)
    assert max(agent.batch_sizes) <= 6  # a wave of 5 rounded up to whole slots per worker, never two waves


def test_overlap_gives_the_same_episodes_as_serial_on_vqa_rad(vqa_rad_root):
    ds = load_dataset("vqa_rad", split="test", root=vqa_rad_root)[:16]
    serial = run(ScriptedAgent(), ds, workers=0, batch_size=4)
    assert by_key(run(ScriptedAgent(), ds, workers=2, batch_size=4, overlap=True)) == by_key(serial)


class PoolWatchingAgent(ScriptedAgent):
    """Notes, at each ``act_batch``, whether an env worker is holding a command list (stepping)."""

    pool = None

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.workers_busy: list[bool] = []

    def act_batch(self, conversations):
        self.workers_busy.append(any(type(self).pool.busy))
        return super().act_batch(conversations)


@pytest.fixture
def watched_pool(monkeypatch):
    def make_pool(*args, **kwargs):
        PoolWatchingAgent.pool = EnvPool(*args, **kwargs)
        return PoolWatchingAgent.pool

    monkeypatch.setattr(runner_module, "EnvPool", make_pool)
    yield
    PoolWatchingAgent.pool = None


def test_the_workers_step_one_wave_while_the_agent_acts_on_the_other(dataset, watched_pool):
    plain = PoolWatchingAgent()
    run(plain, dataset, k=2, workers=2, batch_size=4)
    assert not any(plain.workers_busy)  # gather=all: the workers idle while the agent thinks
    agent = PoolWatchingAgent()
    run(agent, dataset, k=2, workers=2, batch_size=4, overlap=True)
    assert sum(agent.workers_busy) >= len(agent.workers_busy) - 2  # all but the last calls overlap
    assert max(agent.batch_sizes) == 4 and sum(agent.batch_sizes) == sum(plain.batch_sizes)


class WorkerKillingAgent(ScriptedAgent):
    """Kills env worker 0 during its third ``act_batch`` call (a segfault in a tool, an OOM kill)."""

    def act_batch(self, conversations):
        if len(self.batch_sizes) == 2:
            for proc in multiprocessing.active_children():
                if proc.name == "medvqa-env-0":
                    proc.kill()
                    proc.join(5)
        return super().act_batch(conversations)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_worker_killed_once_loses_no_episode(dataset, overlap):
    """Killed from outside (an OOM kill): no episode caused it, so every one it held starts again
    and ends as it does serially (before: each became a ``worker_crash`` row)."""
    serial = by_key(run(ScriptedAgent(), dataset, k=2, workers=0))
    rows = run(WorkerKillingAgent(), dataset, k=2, workers=2, batch_size=8, overlap=overlap)
    assert by_key(rows) == serial


@pytest.mark.parametrize("overlap", [False, True])
def test_a_record_that_kills_its_worker_loses_only_its_own_episode_and_is_named(dataset, overlap):
    """Issue 41 item 2: the episode whose image aborts the worker is the one ``worker_crash`` row,
    naming its record and file; the episodes that shared the worker are scored as serially."""
    from eval_helpers import with_aborting_record

    serial = by_key(run(ScriptedAgent(), dataset, workers=0))
    bad = with_aborting_record(dataset, 5)
    rows = run(ScriptedAgent(), bad, workers=2, batch_size=8, overlap=overlap)
    crashed = [r for r in rows if r["error"]]
    assert [r["record_id"] for r in crashed] == ["q05"], [(r["record_id"], r["error"]) for r in crashed]
    err = crashed[0]["error"]
    assert err["kind"] == "worker_crash" and "record 'q05'" in err["message"]
    assert bad[5].image_paths[0] in err["message"]
    assert crashed[0]["failures"][0]["file"] == list(bad[5].image_paths)
    assert {k: v for k, v in by_key(rows).items() if k != "q05#0"} == {k: v for k, v in serial.items() if k != "q05#0"}


def test_overlap_needs_gather_all(dataset):
    with pytest.raises(ValueError, match="gather='all'"):
        Runner(ScriptedAgent(), dataset, EvalConfig(overlap=True, gather="any"), None)


class PixelReadingAgent(ScriptedAgent):
    """Records a digest of every image of a conversation when it answers (the first look at the
    pixels: the question's image has waited in shared memory through the zoom turn)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.seen: dict[tuple[str, int], list[str]] = {}

    def act_batch(self, conversations):
        import hashlib

        import numpy as np

        for conv in conversations:
            if conv.turns == 0:
                continue
            self.seen[(conv.info["episode_key"], conv.turns)] = [
                hashlib.sha256(np.asarray(im).tobytes()).hexdigest() for im in conv.images]
        return super().act_batch(conversations)


@pytest.mark.parametrize("overlap", [False, True])
def test_workers_show_the_agent_the_same_pixels_as_serial(dataset, overlap):
    """Worker processes hand images back as views of shared memory that live until the slot's next
    reset; with slots reused many times, every turn of every episode must still see its own pixels."""
    serial, workers = PixelReadingAgent(), PixelReadingAgent()
    run(serial, dataset, k=3, workers=0, batch_size=3)
    run(workers, dataset, k=3, workers=2, batch_size=3, overlap=overlap)
    assert workers.seen == serial.seen
    assert len(serial.seen) == 3 * len(dataset)  # every episode: zoom, then answer with two images
    assert all(len(images) == 2 for images in serial.seen.values())


class ImageKeepingAgent(ScriptedAgent):
    """Keeps every conversation's first image; reads the pixels of every other one at once."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.kept = []

    def act_batch(self, conversations):
        import numpy as np

        for i, conv in enumerate(conversations):
            if conv.turns == 0:
                self.kept.append((i % 2 == 0, conv.images[0]))
                if i % 2 == 1:
                    np.asarray(conv.images[0])  # read while the episode is live
        return super().act_batch(conversations)


@pytest.mark.parametrize("workers", [2, 0])
def test_an_image_kept_past_its_episode_is_a_clear_error_not_another_episodes_pixels(dataset, workers):
    import numpy as np

    agent = ImageKeepingAgent()
    run(agent, dataset, k=2, workers=workers, batch_size=3)
    unread = [im for never_read, im in agent.kept if never_read]
    read = [im for never_read, im in agent.kept if not never_read]
    assert unread and read
    assert all(np.asarray(im).shape[2] == 3 for im in read)  # read in time: still there
    for im in unread:
        if workers:
            with pytest.raises(RuntimeError, match="episode is over"):
                np.asarray(im)
        else:  # envs in this process hand over copies
            assert np.asarray(im).shape[2] == 3
