"""``/get_observation`` shares like ``/call``: a group's identical turns decode once and encode once,
distinct turns are not shared, and an image is named in the key exactly as it is decoded. Real
parts: the server's ``ToolService`` and ``TrajectoryObserver``, real images, 8 real threads."""

from __future__ import annotations

import base64
import io
import threading

import numpy as np
import pytest
from PIL import Image

from medvqa_env.images import image_digest
from tool_backends import observation_image
from tool_backends.config import load_tool_config, make_backends
from tool_backends.observation_share import ObservationShare
from tool_backends.server import ServerSettings, ToolService
from tool_backends.trajectories import TrajectoryObserver

GROUP = 8


def _image(seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8))


def _png_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _zoom(box=(10, 10, 60, 50), index: int = 0) -> str:
    return ('<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": %s, "image_index": %d}}</tool_call>'
            % (list(box), index))


@pytest.fixture()
def share(monkeypatch):
    service = ToolService(make_backends(load_tool_config({"image_zoom_in": "local"})), ServerSettings())
    share = ObservationShare(TrajectoryObserver(service))
    share.encodes = []
    real = observation_image.encode
    monkeypatch.setattr(observation_image, "encode", lambda *a, **k: share.encodes.append(1) or real(*a, **k))
    return share


def _concurrently(share, turns):
    """Each (tid, action, extra) turn in its own thread, all released at once."""
    barrier, out = threading.Barrier(len(turns)), [None] * len(turns)

    def run(i, tid, action, extra):
        barrier.wait()
        out[i] = share.batch([tid], [action], [False], [extra])

    threads = [threading.Thread(target=run, args=(i, *t)) for i, t in enumerate(turns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_a_group_of_identical_turns_decodes_once_and_encodes_once(share):
    url = _png_url(_image())  # each client sends its own copy of the same data URL
    out = _concurrently(share, [(f"t{i}", _zoom(), {"images": [str(url)]}) for i in range(GROUP)])
    service = share.observer.service
    assert service.uploads == 1 and len(share.encodes) == 1 and service.computed == 1
    assert (share.stepped, share.shared) == (1, GROUP - 1)
    first = out[0]["observations"][0]
    assert first["image"][0].startswith("data:image/png") and "New image: image 1." in first["obs"]
    assert all(o == {"observations": [first], "dones": [False], "valids": [True]} for o in out)
    # every trajectory holds the question's image and the crop: its next turn can read the crop
    second = _concurrently(share, [(f"t{i}", _zoom((0, 0, 40, 40), 1), {}) for i in range(GROUP)])
    assert all(o["valids"] == [True] and "of image 1" in o["observations"][0]["obs"] for o in second)
    assert service.uploads == 1 and len(share.encodes) == 2 and (share.stepped, share.shared) == (2, 2 * GROUP - 2)


def test_identical_turns_in_one_request_share_too(share):
    url = _png_url(_image())
    out = share.batch([f"t{i}" for i in range(4)], [_zoom()] * 4, [False] * 4, [{"images": [url]}] * 4)
    assert len(set(map(str, out["observations"]))) == 1 and share.observer.service.uploads == 1
    assert len(share.encodes) == 1 and share.shared == 3


def test_distinct_turns_are_not_shared(share):
    url = _png_url(_image())
    turns = [(f"t{i}", _zoom((i, i, 40 + i, 40 + i)), {"images": [url]}) for i in range(4)]  # other boxes
    turns += [(f"u{i}", _zoom(), {"images": [_png_url(_image(i + 1))]}) for i in range(2)]  # other images
    turns += [("c", _zoom(), {"images": [url], "context": {"record_id": "other"}})]  # other context
    out = _concurrently(share, turns)
    assert share.shared == 0 and share.stepped == len(turns) and len(share.encodes) == len(turns)
    assert len({o["observations"][0]["image"][0] for o in out[:4]}) == 4


def test_an_upload_claiming_a_digest_is_never_taken_for_that_image(share):
    """A request whose bytes are another image than the digest it claims must not get (or give)
    the answer for the image the digest names; a reference to the digest is the stored image."""
    honest, other = _image(0), _image(1)
    digest = image_digest(honest)
    entry = lambda im: {"png": _png_url(im).split(",", 1)[1], "digest": digest}  # noqa: E731
    first = share.batch(["a"], [_zoom()], [False], [{"images": [entry(honest)]}])
    assert first["valids"] == [True] and share.stepped == 1
    # same digest claimed, other bytes: keyed by its bytes, so it steps itself
    share.batch(["b"], [_zoom()], [False], [{"images": [entry(other)]}])
    assert share.shared == 0 and share.stepped == 2
    # a reference names the stored pixels by digest: the same key as that image once decoded
    ref = share.batch(["r"], [_zoom()], [False], [{"images": [{"ref": digest}]}])
    assert ref["valids"] == [True] and share.stepped == 3
    again = share.batch(["r2"], [_zoom()], [False], [{"images": [{"ref": digest}]}])
    assert again == ref and share.shared == 1


def test_paths_are_never_shared(share, tmp_path):
    path = tmp_path / "scan.png"
    _image().save(path)
    share.observer.service.settings.image_roots = (str(tmp_path),)
    for tid in "ab":
        assert share.batch([tid], [_zoom()], [False], [{"images": [str(path)]}])["valids"] == [True]
    assert share.shared == 0 and share.stepped == 0  # the observer stepped both itself


def test_a_joiner_is_charged_on_its_own_budget_and_steps_alone_when_spent(share):
    url = _png_url(_image())
    share.batch(["a"], [_zoom()], [False], [{"images": [url]}])
    budget = share.observer.service.budget()
    budget.calls = budget.max_calls  # this request has spent its calls
    out = share.batch(["b"], [_zoom()], [False], [{"images": [url]}], budget)
    assert share.shared == 0 and out["valids"] == [False] and "limit of" in out["observations"][0]
    fresh = share.observer.service.budget()
    share.batch(["c"], [_zoom()], [False], [{"images": [url]}], fresh)
    assert share.shared == 1 and fresh.calls == 1 and fresh.result_pixels > 0


def test_finish_and_turns_without_a_call_go_to_the_observer(share):
    url = _png_url(_image())
    share.batch(["a"], [_zoom()], [False], [{"images": [url]}])
    assert share.batch(["a"], ["no call here"], [False], [{}]) == {"observations": [""], "dones": [False],
                                                                  "valids": [False]}
    share.batch(["a"], [""], [True], [{}])
    assert len(share.observer) == 0


def test_remembered_turns_are_bounded(share):
    share.max_entries = 3
    url = _png_url(_image())
    for i in range(6):
        share.batch([f"t{i}"], [_zoom((i, 0, 40 + i, 40))], [False], [{"images": [url]}])
    assert len(share) == 3


# ---- answer(): on the event loop, as the server's handler would call it ------------------------------
def _answer_all(share, requests, run=None):
    """Each request through ``share.answer`` concurrently on one event loop; the slot-holding part
    in worker threads, as the server's ``guarded`` runs it."""
    import asyncio

    async def main():
        async def slot(*args):
            return await asyncio.to_thread(share.batch, *args)

        calls = [share.answer(*req, share.observer.service.budget, run or slot) for req in requests]
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)

    return asyncio.run(main())


def test_answer_joins_a_group_on_the_loop(share):
    url = _png_url(_image())
    requests = [([f"t{i}"], [_zoom()], [False], [{"images": [str(url)]}]) for i in range(GROUP)]
    out = _answer_all(share, requests)
    service = share.observer.service
    assert service.uploads == 1 and len(share.encodes) == 1 and service.computed == 1
    assert share.stepped == 1 and share.answered_on_loop == GROUP - 1 and share.shared == GROUP - 1
    assert all(o == out[0] and o["valids"] == [True] for o in out)
    # the joiners' trajectories hold the crop: a next turn on it works, and is shared again
    again = _answer_all(share, [([f"t{i}"], [_zoom((0, 0, 40, 40), 1)], [False], [{}]) for i in range(GROUP)])
    assert all(o["valids"] == [True] for o in again) and share.stepped == 2


def test_answer_lets_waiters_go_when_the_leader_is_refused(share):
    """A request that claimed a turn and then failed (a 503, a bad image) must not leave the group
    waiting: the others step it themselves."""
    import asyncio

    url = _png_url(_image())
    first = []

    async def refuse_once(*args):
        if not first:
            first.append(1)
            await asyncio.sleep(0.05)  # the others are waiting for this one now
            raise RuntimeError("server busy")
        return await asyncio.to_thread(share.batch, *args)

    requests = [([f"t{i}"], [_zoom()], [False], [{"images": [url]}]) for i in range(4)]
    out = _answer_all(share, requests, refuse_once)
    assert isinstance(out[0], RuntimeError) and all(o["valids"] == [True] for o in out[1:])
    assert share.observer.service.computed == 1 and not share._flights


def test_answer_leaves_unshareable_requests_to_the_slot(share, tmp_path):
    path = tmp_path / "scan.png"
    _image().save(path)
    share.observer.service.settings.image_roots = (str(tmp_path),)
    out = _answer_all(share, [(["a"], [_zoom()], [False], [{"images": [str(path)]}]),
                              (["b"], ["no call"], [False], [{}])])
    assert out[0]["valids"] == [True] and out[1]["valids"] == [False] and share.answered_on_loop == 0
