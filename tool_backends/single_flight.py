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


__all__ = ["SingleFlight"]
