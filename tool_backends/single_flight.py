"""Single-flight: identical calls in flight at once share one computation.

A GRPO group's n copies make the same tool call at the same moment; a result cache does not help
them (every one of them misses it before the first finishes). :class:`SingleFlight` lets the first
caller of a key compute and makes every caller arriving while it runs wait for that one result:

* the result (or the exception) of the one computation goes to every caller of the flight, so a
  failing computation fails each of them with the same error;
* a waiter that gives up (``timeout``) gets :class:`TimeoutError` and leaves; the computation and
  the other callers go on (only the computing caller's own thread runs it, and nothing cancels it);
* the flight ends with its computation: a call arriving after that computes again (caching
  finished results is the caller's business, e.g. :class:`tool_backends.toolbox.ToolCache`).

Used by the tool server (:class:`tool_backends.server.ToolService`, keyed like its cache: tool,
arguments, image digest, context) and the router (keyed on the forwarded request).

>>> flights = SingleFlight()
>>> flights.run("k", lambda: 41 + 1), flights.run(None, lambda: "no key: never shared")
(42, 'no key: never shared')
>>> flights.computed, flights.joined
(1, 0)
"""

from __future__ import annotations

import hashlib
import threading
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")


class _Flight:
    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None


class SingleFlight:
    """Thread-safe; see the module docstring. ``computed`` counts computations started,
    ``joined`` the calls that waited for another caller's computation instead."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[Hashable, _Flight] = {}
        self.computed = 0
        self.joined = 0

    def __len__(self) -> int:
        """Flights now in progress."""
        return len(self._flights)

    def run(self, key: Hashable | None, fn: Callable[[], T], timeout: float | None = None) -> T:
        """``fn()``, or the result of the ``fn`` already running under ``key`` (``None``: no sharing).

        ``timeout`` bounds how long this caller waits for another caller's computation."""
        if key is None:
            return fn()
        with self._lock:
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                flight = self._flights[key] = _Flight()
                self.computed += 1
            else:
                self.joined += 1
        if leader:
            try:
                flight.result = fn()
            except BaseException as e:  # every waiter gets it too
                flight.error = e
            finally:
                with self._lock:
                    del self._flights[key]
                flight.done.set()
        elif not flight.done.wait(timeout):
            raise TimeoutError(f"gave up after {timeout:g} s waiting for an identical call in flight "
                               "(it goes on for the others)")
        if flight.error is not None:
            raise flight.error
        return flight.result





class AsyncSingleFlight:
    """:class:`SingleFlight` on an event loop, for a caller that must first take a slot: the
    router's identical requests join the one in flight *before* its concurrency gate, holding no
    slot and no thread (joining after it, a group's calls filled every slot and the rest queued for
    the flight to end). The computation is a task: a caller that is cancelled (its client went
    away) leaves it running for the others, and its error reaches each of them."""

    def __init__(self) -> None:
        self._tasks: dict = {}
        self.computed = 0
        self.joined = 0

    def __contains__(self, key) -> bool:
        """Whether a computation runs under ``key`` now (a caller would join it)."""
        return key in self._tasks

    async def run(self, key, start):
        """The result of ``start()``'s coroutine, or of the one already running under ``key``."""
        import asyncio

        task = self._tasks.get(key)
        if task is None:
            self.computed += 1
            task = self._tasks[key] = asyncio.ensure_future(start())
            task.add_done_callback(lambda _t, k=key: self._tasks.pop(k, None))
        else:
            self.joined += 1
        return await asyncio.shield(task)


class ImageArrivals:
    """A GRPO group's clients all refer to the shared image by digest before the server has it
    (optimistic refs): without this each gets 409 and uploads it. The first request naming an
    unknown digest *claims* it (it gets its 409 and its client uploads); the others naming it
    within ``timeout_s`` wait until it is stored (then their refs resolve) or the wait times out
    (then they get their 409 too). Runs on the server's event loop: waiting requests hold no
    worker thread and no concurrency slot. ``settle`` is called after each request."""

    def __init__(self, timeout_s: float = 2.0) -> None:
        self.timeout_s = float(timeout_s)
        self._claims: dict[str, tuple] = {}  # digest -> (asyncio.Event, claimed at)
        self.waited = 0  # requests that waited
        self.waiting = 0  # requests in wait() now

    async def wait(self, digests, store) -> None:
        """Before running a call whose image refs are ``digests``: wait for those another request
        claimed, all at once and within ``timeout_s`` in all (a request naming one unknown digest
        thirty times, or thirty of them, waits once). The caller's task is cancelled when its
        client goes (:class:`tool_backends.server.RequestGate`), which ends the wait."""
        import asyncio
        import time

        now = time.monotonic()
        events, until = [], now
        self.waiting += 1
        try:
            for digest in dict.fromkeys(digests):
                if store.get(digest) is not None:
                    continue
                claim = self._claims.get(digest)
                if claim is None or now - claim[1] > self.timeout_s:
                    self._claims[digest] = (asyncio.Event(), now)  # this request's client uploads it
                    continue
                events.append(claim[0])
                until = max(until, claim[1] + self.timeout_s)
            if not events:
                return
            self.waited += 1
            waits = [asyncio.ensure_future(e.wait()) for e in events if not e.is_set()]
            if waits:
                try:
                    await asyncio.wait(waits, timeout=max(0.0, min(until, now + self.timeout_s) - now))
                finally:
                    for w in waits:
                        w.cancel()
        finally:
            self.waiting -= 1

    def settle(self, store) -> None:
        """Wake the waiters of every claimed digest now stored; forget expired claims."""
        import time

        now = time.monotonic()
        for digest, (event, at) in list(self._claims.items()):
            if store.get(digest) is not None or now - at > self.timeout_s:
                event.set()
                del self._claims[digest]


class ForwardedImages:
    """The router's view of its upstreams' image stores: digests of images it has forwarded as
    bytes (from the moment it starts forwarding them) -- a hint for :class:`ImageArrivals` (the
    same ``get``), so a group's ref requests wait for the one upload *before* taking a router slot
    (waiting inside, they would hold every slot while the upload queued behind them), then go on
    while it is in flight (the upstream server makes them wait for it and join its computation).
    A digest the upstream never stored or has since evicted costs that request a 409 and an
    upload, as without the router."""

    def __init__(self, max_digests: int = 4096) -> None:
        from collections import OrderedDict

        self.max_digests = int(max_digests)
        self._digests: OrderedDict[str, bool] = OrderedDict()

    def get(self, digest: str) -> bool | None:
        return self._digests.get(digest)

    def add(self, payload) -> bool:
        """Remember the digests of the images ``payload`` (a ``/call`` body) carries as bytes;
        whether it carries any."""
        images = payload.get("images") if isinstance(payload, dict) else None
        added = False
        for entry in images if isinstance(images, list) else ():
            if isinstance(entry, dict) and "ref" not in entry and isinstance(entry.get("digest"), str):
                self._digests[entry["digest"]] = added = True
                self._digests.move_to_end(entry["digest"])
        while len(self._digests) > self.max_digests:
            self._digests.popitem(last=False)
        return added


def request_key(body: bytes, *context: str) -> bytes:
    """The name under which identical requests share one answer: their whole body and whatever
    else must match (path, accepted formats, upstream), 16 bytes of BLAKE2b.

    >>> request_key(b'{"tool": "segment"}', "json") == request_key(b'{"tool": "segment"}', "json")
    True
    >>> request_key(b'{"tool": "segment"}', "json") == request_key(b'{"tool": "segment"}', "frames")
    False
    """
    h = hashlib.blake2b(body, digest_size=16)
    h.update("|".join(("", *context)).encode())
    return h.digest()


def refs_in(payload) -> list[str]:
    """The digests a ``/call`` body refers to (``{"ref": digest}`` image entries).

    >>> refs_in({"images": [None, {"ref": "ab"}, {"png": "..."}]})
    ['ab']
    """
    images = payload.get("images") if isinstance(payload, dict) else None
    if not isinstance(images, list):
        return []
    return [str(e["ref"]) for e in images if isinstance(e, dict) and isinstance(e.get("ref"), str)]


__all__ = ["SingleFlight", "AsyncSingleFlight", "ImageArrivals", "ForwardedImages", "refs_in", "request_key"]
