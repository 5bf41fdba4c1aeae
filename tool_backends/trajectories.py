"""The verl-tool side of a tool server: ``/get_observation`` over whole trajectories.

verl-tool sends, per trajectory, the model's raw turn (``actions``) and its ``extra_fields``
(``images``: data URLs, file paths or our image entries; optionally ``context``). The server keeps
each live trajectory's image list (bounded LRU), appends the images tools return, so a later turn's
``image_index`` can name an earlier crop, and forgets the trajectory when verl-tool says
``finish``. A turn without a tool call observes ``""``, ``valid=False`` and ``done=done_if_invalid``
(verl-tool's convention). A trajectory's uploaded images are decoded when a call first reads them,
not before; a turn over ``max_action_chars`` observes the parser's length error.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence

from PIL import Image

from medvqa_env.errors import unknown_name_message
from medvqa_env.parser import MAX_ACTION_CHARS
from tool_backends.base import ToolResult
from tool_backends.wire import WireError


class _Undecoded:
    """An uploaded image entry not decoded yet (decoded when a call reads it)."""

    __slots__ = ("entry",)

    def __init__(self, entry: Any) -> None:
        self.entry = entry


def data_url(image: Image.Image) -> str:
    """An observation image as a data URL, through :func:`tool_backends.observation_image.data_url`
    (a tool's ``observation_image`` setting: its JPEG/WebP bytes as encoded; else PNG as before)."""
    from tool_backends.observation_image import data_url as observation_data_url

    return observation_data_url(image)


class TrajectoryObserver:
    """Runs verl-tool steps on a :class:`tool_backends.server.ToolService`."""

    def __init__(self, service, max_trajectories: int = 1024, done_if_invalid: bool = False,
                 max_action_chars: int = MAX_ACTION_CHARS) -> None:
        self.service = service
        self.max_action_chars = int(max_action_chars)
        self.max_trajectories = int(max_trajectories)
        self.done_if_invalid = bool(done_if_invalid)
        self._images: OrderedDict[str, list[Image.Image]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._images)

    def _trajectory_images(self, tid: str, extra: Mapping[str, Any]) -> list[Any]:
        with self._lock:
            images = self._images.get(tid)
            if images is not None:
                self._images.move_to_end(tid)
                return images
        raw = extra.get("images") or []
        if isinstance(raw, (str, dict)):
            raw = [raw]
        if not isinstance(raw, list) or len(raw) > self.service.settings.max_images:
            raise WireError(f"expected extra_fields 'images' to be a list of at most {self.service.settings.max_images}")
        images = [_Undecoded(e) for e in raw]
        with self._lock:
            self._images[tid] = images
            while len(self._images) > self.max_trajectories:
                self._images.popitem(last=False)
        return images

    def _images_for(self, name: str, arguments: Any, images: list[Any], budget) -> list[Image.Image | None]:
        """The trajectory's images for one call: the one it targets decoded (and kept decoded),
        the others ``None`` if not decoded yet."""
        index = self.service.target(name, arguments, len(images))
        if index is not None and isinstance(images[index], _Undecoded):
            entry = images[index].entry
            images[index] = None if entry is None else self.service.decode(entry, budget)
        return [None if isinstance(im, _Undecoded) else im for im in images]

    def step(self, tid: Any, action: Any, extra: Any, finish: bool, budget=None) -> tuple[Any, bool, bool]:
        """One trajectory's turn -> (observation, done, valid)."""
        from medvqa_env.parser import parse_action

        key = str(tid)
        if finish:
            with self._lock:
                self._images.pop(key, None)
            return "", True, False
        extra = extra if isinstance(extra, Mapping) else {}
        parsed = parse_action(action if isinstance(action, str) else "", max_chars=self.max_action_chars)
        if not parsed.tool_calls:
            return "", self.done_if_invalid, False
        budget = budget if budget is not None else self.service.budget()
        images = self._trajectory_images(key, extra)
        context = self.service.context(extra.get("context"))
        parts, new_images, valid = [], [], True
        for call in parsed.tool_calls:
            spent = budget.take_call()
            if spent is not None:
                result = ToolResult.failure(spent)
            elif call.name not in self.service.backends:
                result = ToolResult.failure(unknown_name_message("tool", call.name, self.service.backends))
            else:
                shown = self._images_for(call.name, call.arguments, images, budget)
                result = budget.take_result(self.service.run(call.name, call.arguments, shown, context))
            valid &= result.ok
            first = len(images) + len(new_images)
            new_images.extend(result.images)
            where = "".join(f" New image: image {i}." for i in range(first, first + len(result.images)))
            parts.append(f"[{call.name}] {result.text}{where}")
        images.extend(new_images)
        text = "\n".join(parts)
        if not new_images:
            return text, False, valid
        return {"obs": text, "image": [data_url(im) for im in new_images]}, False, valid

    def batch(self, ids: Sequence[Any], actions: Sequence[Any], finish: Sequence[Any],
              extras: Sequence[Any], budget=None) -> dict[str, list]:
        """Every trajectory's turn; ``budget`` (a :class:`tool_backends.limits.RequestBudget`) is
        the whole request's."""
        budget = budget if budget is not None else self.service.budget()
        obs, dones, valids = [], [], []
        for tid, action, done, extra in zip(ids, actions, finish, extras):
            o, d, v = self.step(tid, action, extra, bool(done), budget)
            obs.append(o), dones.append(d), valids.append(v)
        return {"observations": obs, "dones": dones, "valids": valids}
