"""Teeth for ``tool_backends/single_flight.py`` (issue 40, mutation testing): sharing only under
one key, every caller of a flight the leader's result or error, a waiter's timeout, the router's
async flight, the optimistic-ref waits (one deadline for all of a request's refs, claims that
expire) and the keys themselves. In-process and fast (no server): ``benchmarks/mutation.py`` runs
it against every mutant of the module."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tool_backends.single_flight import (AsyncSingleFlight, ForwardedImages, ImageArrivals, SingleFlight,
                                         refs_in, request_key)


# ---------------------------------------------------------------- SingleFlight
def _leader_and_joiners(flights, key, fn, joiners=3, timeout=None):
    """Start a leader holding ``fn`` and ``joiners`` callers of the same key; their outcomes."""
    started, release = threading.Event(), threading.Event()
    out: dict = {}

    def lead():
        def held():
            started.set()
            assert release.wait(5)
            return fn()
        try:
            out["leader"] = ("ok", flights.run(key, held))
        except BaseException as e:  # noqa: BLE001
            out["leader"] = ("err", e)

    def join(i):
        try:
            out[i] = ("ok", flights.run(key, lambda: "joiner computed", timeout=timeout))
        except BaseException as e:  # noqa: BLE001
            out[i] = ("err", e)

    t = threading.Thread(target=lead)
    t.start()
    assert started.wait(5)
    others = [threading.Thread(target=join, args=(i,)) for i in range(joiners)]
    for o in others:
        o.start()
    deadline = time.monotonic() + 5
    while flights.joined < joiners and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(flights) == 1
    release.set()
    for th in [t, *others]:
        th.join(5)
    return out


def test_callers_of_one_key_in_flight_share_the_leaders_result():
    flights = SingleFlight()
    out = _leader_and_joiners(flights, "k", lambda: {"answer": 42})
    assert out["leader"] == ("ok", {"answer": 42})
    assert all(out[i] == ("ok", {"answer": 42}) for i in range(3))
    assert out[0][1] is out["leader"][1]  # the very same object
    assert (flights.computed, flights.joined, len(flights)) == (1, 3, 0)


def test_a_failing_computation_fails_every_caller_with_its_error():
    flights = SingleFlight()
    boom = RuntimeError("tool failed")

    def fail():
        raise boom
    out = _leader_and_joiners(flights, "k", fail, joiners=2)
    assert out["leader"] == ("err", boom) and out[0] == ("err", boom) and out[1] == ("err", boom)
    assert len(flights) == 0
    assert flights.run("k", lambda: "fresh") == "fresh"  # the failed flight is over


def test_a_none_result_is_shared_as_none():
    flights = SingleFlight()
    out = _leader_and_joiners(flights, "k", lambda: None, joiners=1)
    assert out["leader"] == ("ok", None) and out[0] == ("ok", None)


def test_different_keys_never_share_and_no_key_never_counts():
    flights = SingleFlight()
    assert flights.run("a", lambda: 1) == 1 and flights.run("b", lambda: 2) == 2
    assert flights.run("a", lambda: 3) == 3  # after the flight ended: computed again
    assert (flights.computed, flights.joined) == (3, 0)
    assert flights.run(None, lambda: "x") == "x"
    assert (flights.computed, flights.joined, len(flights)) == (3, 0, 0)


def test_a_waiter_that_gives_up_gets_timeout_error_and_the_others_go_on():
    flights = SingleFlight()
    started, release = threading.Event(), threading.Event()
    results = []

    def held():
        started.set()
        release.wait(5)
        return "done"
    t = threading.Thread(target=lambda: results.append(flights.run("k", held)))
    t.start()
    assert started.wait(5)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        flights.run("k", lambda: "never", timeout=0.05)
    assert 0.04 <= time.monotonic() - t0 < 2
    assert str(e.value) == ("gave up after 0.05 s waiting for an identical call in flight "
                            "(it goes on for the others)")
    assert len(flights) == 1  # still in flight
    release.set()
    t.join(5)
    assert results == ["done"] and len(flights) == 0


def test_a_base_exception_of_the_leader_reaches_the_waiters_and_ends_the_flight():
    flights = SingleFlight()

    class Stop(BaseException):
        pass

    def stop():
        raise Stop()
    out = _leader_and_joiners(flights, "k", stop, joiners=1)
    assert out["leader"][0] == "err" and isinstance(out["leader"][1], Stop)
    assert out[0][0] == "err" and isinstance(out[0][1], Stop)
    assert len(flights) == 0


# ---------------------------------------------------------------- AsyncSingleFlight
def test_async_callers_of_one_key_share_one_task_and_a_cancelled_caller_leaves_it_running():
    async def main():
        flights = AsyncSingleFlight()
        gate, calls = asyncio.Event(), []

        async def compute():
            calls.append(1)
            await gate.wait()
            return "shared"
        a = asyncio.ensure_future(flights.run("k", compute))
        await asyncio.sleep(0)
        assert "k" in flights and "other" not in flights
        b = asyncio.ensure_future(flights.run("k", compute))
        c = asyncio.ensure_future(flights.run("k", compute))
        await asyncio.sleep(0)
        b.cancel()
        await asyncio.sleep(0)
        gate.set()
        assert await a == "shared" and await c == "shared"
        assert b.cancelled()
        assert calls == [1] and (flights.computed, flights.joined) == (1, 2)
        await asyncio.sleep(0)
        assert "k" not in flights  # done: the next caller computes again
        gate2 = asyncio.Event()
        gate2.set()
        assert await flights.run("k", compute) == "shared" and calls == [1, 1]
        assert await flights.run("j", compute) == "shared" and flights.computed == 3
    asyncio.run(main())


def test_an_async_flights_error_reaches_every_caller():
    async def main():
        flights = AsyncSingleFlight()
        gate = asyncio.Event()

        async def fail():
            await gate.wait()
            raise ValueError("upstream 500")
        a = asyncio.ensure_future(flights.run("k", fail))
        b = asyncio.ensure_future(flights.run("k", fail))
        await asyncio.sleep(0)
        gate.set()
        for t in (a, b):
            with pytest.raises(ValueError, match="upstream 500"):
                await t
        await asyncio.sleep(0)
        assert "k" not in flights
    asyncio.run(main())


# ---------------------------------------------------------------- ImageArrivals
class Store(dict):
    def get(self, key, default=None):  # the ImageStore interface: .get(digest)
        return super().get(key, default)


def test_the_first_request_naming_an_unknown_digest_claims_it_without_waiting():
    async def main():
        arrivals, store = ImageArrivals(timeout_s=5.0), Store()
        assert arrivals.timeout_s == 5.0
        t0 = time.monotonic()
        await arrivals.wait(["d1", "d1", "d2"], store)
        assert time.monotonic() - t0 < 0.5
        assert arrivals.waited == 0 and arrivals.waiting == 0
        assert set(arrivals._claims) == {"d1", "d2"}
        store["known"] = object()
        await arrivals.wait(["known"], store)  # stored: never claimed
        assert "known" not in arrivals._claims
    asyncio.run(main())


def test_later_requests_wait_for_the_claimed_upload_and_go_when_it_is_stored():
    async def main():
        arrivals, store = ImageArrivals(timeout_s=5.0), Store()
        await arrivals.wait(["d"], store)  # the claimer: its client uploads
        waiter = asyncio.ensure_future(arrivals.wait(["d", "d", "d"], store))
        await asyncio.sleep(0.05)
        assert not waiter.done() and arrivals.waiting == 1
        store["d"] = object()
        t0 = time.monotonic()
        arrivals.settle(store)
        await asyncio.wait_for(waiter, 1)
        assert time.monotonic() - t0 < 0.5
        assert arrivals.waited == 1 and arrivals.waiting == 0 and "d" not in arrivals._claims
    asyncio.run(main())


def test_a_request_naming_many_claimed_digests_waits_once_within_the_timeout():
    async def main():
        arrivals, store = ImageArrivals(timeout_s=0.3), Store()
        digests = [f"d{i}" for i in range(30)]
        await arrivals.wait(digests, store)  # claims all thirty
        t0 = time.monotonic()
        await arrivals.wait(digests * 3, store)  # none arrives: one wait of timeout_s in all
        took = time.monotonic() - t0
        assert 0.2 <= took < 0.9, took
        assert arrivals.waited == 1 and arrivals.waiting == 0
    asyncio.run(main())


def test_the_wait_ends_at_the_claims_deadline_not_a_fresh_one():
    async def main():
        arrivals, store = ImageArrivals(timeout_s=0.6), Store()
        await arrivals.wait(["d"], store)
        await asyncio.sleep(0.4)  # the claim is 0.4 s old: 0.2 s of it left
        t0 = time.monotonic()
        await arrivals.wait(["d"], store)
        took = time.monotonic() - t0
        assert 0.1 <= took < 0.45, took
    asyncio.run(main())


def test_an_expired_claim_is_claimed_again_instead_of_waited_for():
    async def main():
        arrivals, store = ImageArrivals(timeout_s=0.1), Store()
        await arrivals.wait(["d"], store)
        first = arrivals._claims["d"]
        await asyncio.sleep(0.15)
        t0 = time.monotonic()
        await arrivals.wait(["d"], store)  # the claimer never uploaded: this one claims it
        assert time.monotonic() - t0 < 0.05
        assert arrivals.waited == 0 and arrivals._claims["d"] is not first
    asyncio.run(main())


def test_settle_wakes_stored_digests_and_forgets_expired_claims_only():
    async def main():
        arrivals, store = ImageArrivals(timeout_s=0.2), Store()
        await arrivals.wait(["stored", "pending", "old"], store)
        events = {d: arrivals._claims[d][0] for d in arrivals._claims}
        arrivals._claims["old"] = (events["old"], time.monotonic() - 1.0)
        store["stored"] = object()
        arrivals.settle(store)
        assert events["stored"].is_set() and events["old"].is_set() and not events["pending"].is_set()
        assert set(arrivals._claims) == {"pending"}
    asyncio.run(main())


def test_a_cancelled_wait_leaves_nothing_behind():
    async def main():
        arrivals, store = ImageArrivals(timeout_s=5.0), Store()
        await arrivals.wait(["d"], store)
        waiter = asyncio.ensure_future(arrivals.wait(["d"], store))
        await asyncio.sleep(0.02)
        assert arrivals.waiting == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert arrivals.waiting == 0
    asyncio.run(main())


# ---------------------------------------------------------------- ForwardedImages, keys, refs
def test_forwarded_images_remember_uploads_only_and_forget_the_oldest():
    f = ForwardedImages(max_digests=2)
    assert f.max_digests == 2 and f.get("a") is None
    assert f.add({"images": [{"png": "..", "digest": "a"}, {"ref": "r", "digest": "x"}, None,
                             {"path": "/p", "digest": 7}]}) is True
    assert f.get("a") is True and f.get("x") is None and f.get("r") is None and f.get(7) is None
    assert f.add({"images": [{"ref": "r"}]}) is False
    assert f.add({"images": "not a list"}) is False and f.add(["images"]) is False and f.add({}) is False
    f.add({"images": [{"raw": "..", "digest": "b"}]})
    f.add({"images": [{"png": "..", "digest": "a"}]})  # a again: now the newest
    f.add({"images": [{"png": "..", "digest": "c"}]})
    assert f.get("b") is None and f.get("a") is True and f.get("c") is True


def test_request_keys_name_the_body_and_every_part_of_the_context():
    k = request_key(b"body", "call", "json")
    assert isinstance(k, bytes) and len(k) == 16
    assert k == request_key(b"body", "call", "json")
    assert k != request_key(b"body2", "call", "json")
    assert k != request_key(b"body", "call", "frames")
    assert k != request_key(b"body", "calljson")  # the parts are separated
    assert request_key(b"body") != request_key(b"body", "")
    import hashlib
    assert k == hashlib.blake2b(b"body|call|json", digest_size=16).digest()


def test_refs_in_lists_only_string_refs_of_image_entries():
    assert refs_in({"images": [None, {"ref": "ab"}, {"png": "..."}, {"ref": 5}, "cd", {"ref": "ef"}]}) == ["ab", "ef"]
    assert refs_in({"images": "ab"}) == [] and refs_in({}) == [] and refs_in(["ab"]) == []
