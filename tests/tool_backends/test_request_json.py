"""``wire.request_json`` splices uploaded images' base64 into a request body instead of running it
through the JSON encoder; the bytes must be exactly ``json.dumps(body).encode()``'s, whatever the
rest of the body holds (text that looks like its markers, non-ASCII, batches)."""

from __future__ import annotations

import base64
import json

from hypothesis import given, settings, strategies as st
from PIL import Image

from tool_backends.wire import encode_image, request_json

b64 = st.binary(min_size=0, max_size=3000).map(lambda b: base64.b64encode(b).decode("ascii"))
text = st.text(max_size=40)
entry = st.one_of(st.none(), st.fixed_dictionaries({"raw": b64, "size": st.just([4, 4])}),
                  st.fixed_dictionaries({"png": b64, "digest": text}), st.fixed_dictionaries({"ref": text}))
call = st.fixed_dictionaries({"tool": text, "arguments": st.dictionaries(text, st.one_of(text, st.integers())),
                              "images": st.lists(entry, max_size=4),
                              "context": st.fixed_dictionaries({"question": text})})


@settings(max_examples=200, deadline=None)
@given(call)
def test_a_call_body_is_byte_for_byte_what_json_dumps_writes(body):
    assert request_json(body) == json.dumps(body).encode()


@settings(max_examples=100, deadline=None)
@given(st.lists(call, max_size=4))
def test_a_batch_body_is_byte_for_byte_what_json_dumps_writes(calls):
    assert request_json({"calls": calls}) == json.dumps({"calls": calls}).encode()


def test_a_real_upload_round_trips_and_its_pixels_survive():
    image = Image.radial_gradient("L").convert("RGB").resize((300, 200))
    body = {"tool": "segment", "arguments": {"bbox": [1, 2, 30, 40]}, "images": [encode_image(image, "raw")],
            "context": {"question": "is the mass \"large\"? ünïcode"}}
    raw = request_json(body)
    assert raw == json.dumps(body).encode()
    back = json.loads(raw)["images"][0]
    assert Image.frombytes("RGB", tuple(back["size"]), base64.b64decode(back["raw"])).tobytes() == image.tobytes()
