"""``/get_observation`` shares like ``/call``: identical turns of a group step once.

A GRPO group's n rollouts make the same first turn on the same image; verl-tool posts each to
``/get_observation``. The tool already runs once for them (the server's cache and single-flight),
but each turn still decodes its own upload and encodes its own observation image. An
:class:`ObservationShare` in front of a :class:`~tool_backends.trajectories.TrajectoryObserver`
steps one of them and gives the others the same observation (the same data-URL strings: encoded
once) and the same images in their trajectories (decoded once), whether the turns come in one
request or in concurrent ones.

Two turns are identical when their key is: the action text, the context, and every image of the
trajectory *named as it is decoded*:

* an image sent in the request (a data URL, ``png``/``raw`` bytes): a hash of the entry's whole
  text (its bytes and anything else it claims; two uploads share only if byte-identical);
* ``{"ref": digest}``: the stored image with that pixel digest (the store checked it);
* an image already decoded in the trajectory: its pixel digest;
* a file path: never shared (the file may change between turns).

So an upload that *claims* a digest is never taken for the image the digest names, nor for a
reference to it: the bytes-vs-digest mix that let one request poison another's answer on ``/call``
cannot happen here. Each joiner is charged the leader's calls and result pixels on its own
request budget (and steps itself if they would not fit); a leader whose budget refused anything
is not shared. Remembered turns are bounded (``max_entries``, ``max_bytes``).

The server wires it in with two lines: ``shared = ObservationShare(observer)`` beside the
observer, and in the ``/get_observation`` handler ``return await shared.answer(ids, actions,
finish, extras, service.budget, lambda *a: guarded(shared.batch, *a))`` where it awaited
``guarded(observer.batch, ...)``. :meth:`ObservationShare.answer` runs on the event loop: a
request whose turns another request is stepping waits for it there (no slot, no thread), and one
whose turns are all remembered is answered there; only the rest take a slot (``batch``, which
takes and returns what ``TrajectoryObserver.batch`` does).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from PIL import Image

from medvqa_env.images import image_digest
from medvqa_env.parser import parse_action


@dataclass
class _Turn:
    """A stepped turn others may take: its answer, what it left in the trajectory, what it cost."""

    observation: Any
    done: bool
    valid: bool
    images: list  # the trajectory's image list after the turn (shared objects)
    spent: list  # ("call", None) / ("result", ToolResult), in the order the leader's budget saw them
    nbytes: int


class _Recording:
    """A request budget seen through: forwards every charge and notes it, and whether any was refused."""

    def __init__(self, budget) -> None:
        self._budget, self.spent, self.refused = budget, [], False

    def take_call(self):
        out = self._budget.take_call()
        self.spent.append(("call", None))
        self.refused |= out is not None
        return out

    def take_input(self, image) -> None:
        try:
            self._budget.take_input(image)
        except Exception:
            self.refused = True
            raise

    def take_result(self, result):
        out = self._budget.take_result(result)
        self.spent.append(("result", result))
        self.refused |= out is not result
        return out

    def __getattr__(self, name):  # counters and limits read through
        return getattr(self._budget, name)


class Plan:
    """What :meth:`ObservationShare.answer` found for one request: each turn's key, the keys it
    claimed to step itself, and those another request is stepping."""

    def __init__(self, keys: list[bytes]) -> None:
        self.keys, self.claimed, self.waiting = keys, set(), []
        self.ids: Sequence[Any] = ()
        self.extras: Sequence[Any] = ()


def _resolve(future) -> None:
    if not future.done():
        future.set_result(None)


class ObservationShare:
    """Steps identical turns once (see the module docstring). Thread-safe; ``shared`` counts turns
    answered from another's step, ``stepped`` turns this class had the observer step."""

    def __init__(self, observer, max_entries: int = 256, max_bytes: int = 64 << 20) -> None:
        self.observer = observer
        self.max_entries, self.max_bytes = int(max_entries), int(max_bytes)
        self._turns: OrderedDict[bytes, _Turn] = OrderedDict()
        self._bytes = 0
        self._flights: dict[bytes, threading.Event] = {}
        self._waiters: dict[bytes, list] = {}  # key -> [(loop, future)] of requests waiting on the loop
        self._lock = threading.Lock()
        self.shared = self.stepped = 0
        self.answered_on_loop = 0  # requests answered by :meth:`answer` without a slot

    # ---- the observer's interface ------------------------------------------------------------
    def batch(self, ids: Sequence[Any], actions: Sequence[Any], finish: Sequence[Any],
              extras: Sequence[Any], budget=None, plan: "Plan | None" = None) -> dict[str, list]:
        """As :meth:`TrajectoryObserver.batch`, sharing identical turns; ``plan`` (from
        :meth:`answer`) holds the turns this request already claimed to step."""
        budget = budget if budget is not None else self.observer.service.budget()
        claimed = plan.claimed if plan is not None else set()
        obs, dones, valids = [], [], []
        for tid, action, done, extra in zip(ids, actions, finish, extras):
            o, d, v = self.step(tid, action, extra, bool(done), budget, claimed)
            obs.append(o), dones.append(d), valids.append(v)
        return {"observations": obs, "dones": dones, "valids": valids}

    def step(self, tid: Any, action: Any, extra: Any, finish: bool, budget=None,
             claimed: set | None = None) -> tuple[Any, bool, bool]:
        """One trajectory's turn -> (observation, done, valid), stepped once per identical turn."""
        observer = self.observer
        budget = budget if budget is not None else observer.service.budget()
        extra = extra if isinstance(extra, Mapping) else {}
        if finish or not isinstance(action, str) or not parse_action(
                action, max_chars=observer.max_action_chars).tool_calls:
            return observer.step(tid, action, extra, finish, budget)
        images = observer._trajectory_images(str(tid), extra)
        key = self.key(action, extra.get("context"), images)
        if key is None:
            return observer.step(tid, action, extra, finish, budget)
        with self._lock:
            turn = self._turns.get(key)
            flight = None if turn is not None else self._flights.get(key)
            leading = turn is None and (flight is None or (claimed is not None and key in claimed))
            if leading:  # this thread steps it; identical turns arriving meanwhile wait for it
                if claimed is not None:
                    claimed.discard(key)
                if flight is None:
                    self._flights[key] = threading.Event()
            elif turn is not None:
                self._turns.move_to_end(key)
        if leading:
            try:
                return self._lead(key, tid, action, extra, images, budget)
            finally:
                self._land(key)
        if turn is None:
            flight.wait()
            with self._lock:
                turn = self._turns.get(key)
        answered = self._join(turn, images, budget) if turn is not None else None
        if answered is not None:
            return answered
        return self._step_alone(tid, action, extra, budget)  # the leader failed, was not shared, or it does not fit

    # ---- on the event loop -----------------------------------------------------------------------
    async def answer(self, ids: Sequence[Any], actions: Sequence[Any], finish: Sequence[Any],
                     extras: Sequence[Any], make_budget, run) -> dict[str, list]:
        """A ``/get_observation`` request's answer, from the event loop: when every turn is
        shareable, wait here for identical turns another request is stepping, then answer from
        the remembered turns (charged to one ``make_budget()``); else ``await run(ids, actions,
        finish, extras, budget, plan)`` (the slot-holding :meth:`batch`), which steps the turns
        this request claimed. Never blocks the loop for longer than hashing the request's images."""
        plan = self.plan(ids, actions, finish, extras)
        budget = make_budget()
        try:
            if plan is not None:
                for key in plan.waiting:
                    await self._settled(key)
                hit = self._remembered(plan, budget)
                if hit is not None:
                    return hit
                for key in plan.keys:  # not remembered (a leader that failed, or evicted): claim it now
                    self._claim(key, plan)
            return await run(ids, actions, finish, extras, budget, plan)
        finally:
            if plan is not None:
                for key in list(plan.claimed):  # claimed but never stepped (refused, failed): let waiters go
                    plan.claimed.discard(key)
                    self._land(key)

    def plan(self, ids, actions, finish, extras) -> "Plan | None":
        """The keys of a request whose turns are all shareable (``None`` otherwise); turns no one
        holds or steps are claimed for this request, turns another request steps are ``waiting``."""
        n = len(actions) if isinstance(actions, Sequence) else -1
        if not all(isinstance(v, Sequence) and len(v) == n for v in (ids, finish, extras)) or n < 1:
            return None
        keys = []
        for tid, action, done, extra in zip(ids, actions, finish, extras):
            if done or not isinstance(action, str) or not isinstance(extra, Mapping):
                return None
            if not parse_action(action, max_chars=self.observer.max_action_chars).tool_calls:
                return None
            key = self.key(action, extra.get("context"), self._images_of(tid, extra))
            if key is None:
                return None
            keys.append(key)
        plan = Plan(keys)
        plan.ids, plan.extras = list(ids), list(extras)
        for key in dict.fromkeys(keys):
            self._claim(key, plan)
        return plan

    def _images_of(self, tid: Any, extra: Mapping[str, Any]) -> list:
        """The trajectory's images as a turn would find them, without creating its state."""
        with self.observer._lock:
            held = self.observer._images.get(str(tid))
            if held is not None:
                return list(held)
        raw = extra.get("images") or []
        return [raw] if isinstance(raw, (str, dict)) else (list(raw) if isinstance(raw, list) else [object()])

    def _claim(self, key: bytes, plan: "Plan") -> None:
        with self._lock:
            if key in self._turns or key in plan.claimed:
                return
            if key in self._flights:
                plan.waiting.append(key)
            else:
                self._flights[key] = threading.Event()
                plan.claimed.add(key)

    async def _settled(self, key: bytes) -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if key not in self._flights:
                return
            self._waiters.setdefault(key, []).append((loop, future))
        await future

    def _land(self, key: bytes) -> None:
        """A flight ends (stepped, failed or never started): wake whoever waits for it."""
        with self._lock:
            flight = self._flights.pop(key, None)
            waiters = self._waiters.pop(key, [])
        if flight is not None:
            flight.set()
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def _remembered(self, plan: "Plan", budget) -> dict[str, list] | None:
        """Every turn of ``plan`` answered from remembered turns, charged to ``budget``; ``None``
        (and nothing changed) unless all are remembered and fit."""
        with self._lock:
            turns = [self._turns.get(key) for key in plan.keys]
        if any(t is None for t in turns):
            return None
        trial = copy.copy(budget)
        for turn in turns:
            for kind, result in turn.spent:
                if kind == "call" and trial.take_call() is not None:
                    return None
                if kind == "result" and trial.take_result(result) is not result:
                    return None
        budget.__dict__.update(trial.__dict__)
        for tid, extra, turn in zip(plan.ids, plan.extras, turns):
            self.observer._trajectory_images(str(tid), extra)[:] = turn.images
        with self._lock:
            self.shared += len(turns)
            self.answered_on_loop += 1
        return {"observations": [t.observation for t in turns], "dones": [t.done for t in turns],
                "valids": [t.valid for t in turns]}

    # ---- keys ----------------------------------------------------------------------------------
    def key(self, action: str, context: Any, images: Sequence[Any]) -> bytes | None:
        """The turn's key, or ``None`` when it must not be shared (a path image, an unreadable
        context). Images are named as they are decoded (see the module docstring)."""
        names = []
        for image in images:
            name = image_name(image)
            if name is None:
                return None
            names.append(name)
        try:
            blob = json.dumps([action, context, names], sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):
            return None
        return hashlib.blake2b(blob.encode(), digest_size=20).digest()

    # ---- stepping ------------------------------------------------------------------------------
    def _step_alone(self, tid, action, extra, budget):
        with self._lock:
            self.stepped += 1
        return self.observer.step(tid, action, extra, False, budget)

    def _lead(self, key, tid, action, extra, images, budget):
        recording = _Recording(budget)
        with self._lock:
            self.stepped += 1
        observation, done, valid = self.observer.step(tid, action, extra, False, recording)
        if not recording.refused:
            after = list(images)
            turn = _Turn(observation, done, valid, after, recording.spent, _turn_bytes(action, observation, after))
            self._remember(key, turn)
        return observation, done, valid

    def _join(self, turn: _Turn, images: list, budget) -> tuple[Any, bool, bool] | None:
        """``turn``'s answer for this trajectory, charged to ``budget``; ``None`` if it would not fit."""
        trial = copy.copy(budget)
        for kind, result in turn.spent:
            if kind == "call" and trial.take_call() is not None:
                return None
            if kind == "result" and trial.take_result(result) is not result:
                return None
        budget.__dict__.update(trial.__dict__)
        images[:] = turn.images  # the same decoded images and results: the next turn keys alike
        with self._lock:
            self.shared += 1
        return turn.observation, turn.done, turn.valid

    def _remember(self, key: bytes, turn: _Turn) -> None:
        if turn.nbytes > self.max_bytes // 4:
            return
        with self._lock:
            old = self._turns.pop(key, None)
            self._bytes -= old.nbytes if old else 0
            self._turns[key] = turn
            self._bytes += turn.nbytes
            while len(self._turns) > self.max_entries or self._bytes > self.max_bytes:
                _, dropped = self._turns.popitem(last=False)
                self._bytes -= dropped.nbytes

    def __len__(self) -> int:
        return len(self._turns)


def image_name(image: Any) -> str | None:
    """How a turn's key names one trajectory image (``None``: not shareable).

    >>> from tool_backends.trajectories import _Undecoded
    >>> image_name(_Undecoded({"ref": "ab12"})), image_name(_Undecoded("/data/scan.png"))
    ('p:ab12', None)
    >>> image_name(_Undecoded({"png": "iVBO", "digest": "ab12"}))[:2]
    'b:'
    """
    if image is None:
        return "none"
    if isinstance(image, Image.Image):
        return "p:" + image_digest(image)
    entry = getattr(image, "entry", image)  # an upload not decoded yet
    if entry is None:
        return "none"
    if isinstance(entry, str):
        if not entry.startswith("data:"):
            return None  # a file path
        return "b:" + hashlib.sha256(entry.encode()).hexdigest()[:40]  # SHA-NI: ~2x BLAKE2b here
    if isinstance(entry, Mapping):
        if set(entry) == {"ref"} and isinstance(entry["ref"], str):
            return "p:" + entry["ref"]
        if "path" in entry or "ref" in entry:
            return None
        try:
            blob = json.dumps(entry, sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError):
            return None
        return "b:" + hashlib.blake2b(blob.encode(), digest_size=20).hexdigest()
    return None


def _turn_bytes(action: str, observation: Any, images: Sequence[Any]) -> int:
    """About what a remembered turn holds: its text, its data URLs and its decoded images' pixels."""
    n = len(action) + 1024
    if isinstance(observation, Mapping):
        n += len(str(observation.get("obs", ""))) + sum(len(u) for u in observation.get("image") or ())
    else:
        n += len(str(observation))
    for im in images:
        if isinstance(im, Image.Image):
            n += im.size[0] * im.size[1] * 3
    return n


__all__ = ["ObservationShare", "Plan", "image_name"]
