"""Schemathesis fuzzes the tool server's HTTP API, over real HTTP, from its OpenAPI schema.

The server's endpoints read raw JSON (so they can answer malformed bodies with a readable 400), so
FastAPI's generated schema has no request bodies. :func:`wire_schema` adds them from the wire
format (``tool_backends/server.py``) and from the tools' own argument schemas, so schemathesis
generates calls that are well-formed and calls that are not (its negative mode). The schema also
offers the hostile inputs of issue 28 as values the generator may pick: the worst turns (quadratic
for the old parser), numbers far past any coordinate, batches past the call limit. The checks: no
5xx ever, every answer is JSON with a readable ``detail`` or a result, the server stays up, and
``/health`` answers within a bound measured as a ratio of its idle latency after every case.
"""

from __future__ import annotations

import copy

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tool_backends.registry import build_tool
from tool_backends.server import create_app
from tool_backends.toolbox import LocalBackend

TOOLS = ("segment", "image_zoom_in")
MAX_EXAMPLES = 25  # per operation and mode; ~15 s in all on 2 cores
HOSTILE_TURNS = ["<think>" * 15000, "<think>" * 9000 + "</think>", "\\boxed{" * 4096 + "}" * 4096,
                 "<answer>" * 8000, '<tool_call>{"name": "segment", "arguments": {"bbox": [0, 0, %s, 9]}}</tool_call>'
                 % ("9" * 5000)]
HUGE_NUMBERS = [10 ** 400, -(10 ** 300), 2 ** 64, 1e308]


def _real_png() -> str:
    """A real 48x40 grey image, so fuzzed arguments reach the tools and not only the decoder."""
    from PIL import Image

    from tool_backends.wire import encode_image

    return encode_image(Image.radial_gradient("L").resize((48, 40)))["png"]


def wire_schema() -> dict:
    backend = LocalBackend([build_tool(t) for t in TOOLS])
    raw = copy.deepcopy(create_app({t: backend for t in TOOLS}).openapi())
    image = {"anyOf": [  # one fuzzed entry of each transport
        {"type": "object", "required": ["png"], "properties": {"png": {"type": "string", "maxLength": 200}}},
        {"type": "object", "required": ["raw", "size"], "properties": {
            "raw": {"type": "string", "maxLength": 200},
            "size": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}}},
        {"type": "object", "required": ["path"], "properties": {"path": {"type": "string", "maxLength": 100}}}]}
    real = {"type": "object", "required": ["png"], "additionalProperties": False,
            "properties": {"png": {"enum": [_real_png()]}}}
    arguments = {"oneOf": [backend.tools[t].spec.parameters for t in TOOLS] + [  # and numbers no tool can use
        {"type": "object", "properties": {"bbox": {"type": "array", "minItems": 4, "maxItems": 4,
                                                   "items": {"enum": HUGE_NUMBERS + [0, 1]}},
                                          "image_index": {"enum": HUGE_NUMBERS}}}]}
    context = {"type": "object", "properties": {
        "record_id": {"type": "string"}, "dataset": {"type": "string"}, "question": {"type": "string"},
        "annotations": {"type": "object", "properties": {
            "boxes": {"type": "array", "maxItems": 2}, "labels": {"type": "array", "maxItems": 2},
            "masks": {"type": "array", "maxItems": 2, "items": {"type": "object", "required": ["label", "path"], "properties": {
                "label": {"type": "string"}, "path": {"type": "string"}}}}}}}}

    def call(images: dict) -> dict:
        return {"type": "object", "required": ["tool", "arguments", "images"], "properties": {
            "tool": {"type": "string", "enum": list(TOOLS)},
            "arguments": arguments,
            "images": {"type": "array", "minItems": 1, "maxItems": 3, "items": images},
            "context": context,
            "image_format": {"type": "string", "enum": ["png", "raw"]}}}

    observation = {"type": "object", "required": ["actions"], "properties": {
        "trajectory_ids": {"type": "array", "maxItems": 3},
        "actions": {"type": "array", "maxItems": 3, "items": {"anyOf": [
            {"type": "string", "maxLength": 300}, {"enum": HOSTILE_TURNS}]}},
        "finish": {"type": "array", "maxItems": 3, "items": {"type": "boolean"}},
        "is_last_step": {"type": "boolean"},
        "extra_fields": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
            "images": {"type": "array", "maxItems": 2, "items": image}, "context": context}}}}}
    # /call: real images, fuzzed arguments (reaches the tools); /call_batch: fuzzed image entries
    bodies = {"/call": call(real),
              "/call_batch": {"type": "object", "required": ["calls"], "properties": {
                  "calls": {"anyOf": [
                      {"type": "array", "maxItems": 3, "items": call({"anyOf": [image, {"type": "null"}]})},
                      {"type": "array", "minItems": 65, "maxItems": 70, "items": {"enum": [{}]}}]}}},  # past the limit
              "/get_observation": observation}
    for path, body in bodies.items():
        raw["paths"][path]["post"]["requestBody"] = {
            "required": True, "content": {"application/json": {"schema": body}}}
    return raw


schema = schemathesis.openapi.from_dict(wire_schema())


def test_the_augmented_schema_covers_every_endpoint():
    paths = wire_schema()["paths"]
    assert set(paths) == {"/health", "/tools", "/call", "/call_batch", "/get_observation"}
    assert all("requestBody" in paths[p]["post"] for p in ("/call", "/call_batch", "/get_observation"))


def _health_s(url: str) -> float:
    import time

    start = time.perf_counter()
    assert httpx.get(url + "/health", timeout=60).status_code == 200
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def fuzz_server(tool_server):
    tool_server.idle_health_s = min(_health_s(tool_server.url) for _ in range(5))
    yield tool_server
    # the server survived everything it was sent
    assert httpx.get(tool_server.url + "/health", timeout=10).status_code == 200


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_requests_never_get_a_server_error(case, fuzz_server):
    response = case.call(base_url=fuzz_server.url, timeout=30)
    case.validate_response(response, checks=[not_a_server_error])
    body = response.json()  # every answer, refusals included, is JSON the client can read
    if response.status_code >= 400:
        assert isinstance(body.get("detail"), str) and body["detail"]
    elif case.path == "/call":
        assert isinstance(body["result"]["text"], str)
    # nothing it was sent leaves the server slow to answer (the old parser held /health for 46 s)
    assert _health_s(fuzz_server.url) < max(1.0, 200 * fuzz_server.idle_health_s)
