"""The tools over the Model Context Protocol: ``medvqa-tools mcp`` (stdio or streamable HTTP).

A thin layer over :class:`tool_backends.server.ToolService`, the same core the HTTP tool server
runs (decoding, image-pixel limits, image roots, the result cache, single-flight), so a tool
answers an MCP client exactly as it answers ``POST /call``:

* ``tools/list``: every served tool, its JSON schema as ``inputSchema`` plus two arguments of the
  call itself: ``images`` (the conversation's images, each a ``data:image/...;base64,`` URL, a
  wire entry such as ``{"png": base64}``, or a path under ``--image-root``; only the one the call's
  ``image_index`` names is decoded) and ``context`` (``record_id``, ``annotations``, ``question``:
  what oracle engines read). ``outputSchema`` describes the structured result.
* ``tools/call``: the result as a text block (what the model reads), one PNG image block per
  result image (a crop, a mask overlay, boxes drawn) and ``structuredContent`` (the result's
  ``data``: ``boxes``, ``area_px``, ``scores``, ``region``, ...). A tool's refusal and a malformed
  image are results with ``isError`` set, which the model can read; an unknown tool is a protocol
  error (the spec's ``INVALID_PARAMS``).

Limits and auth are the HTTP server's (:class:`~tool_backends.server.ServerSettings`): at most
``max_concurrency`` tool runs at once and ``max_queue`` waiting, ``max_pixels`` per image and
the per-request pixel budget, ``max_body_bytes`` per HTTP request; over HTTP a bind address other
than loopback needs a token, and with a token every request must send ``Authorization: Bearer
<token>`` (401 otherwise). stdio has no token: whoever starts the process owns it.
"""

from __future__ import annotations

import hmac
import json
import threading
from typing import Any, Mapping

from medvqa_env.errors import ConfigError, unknown_name_message
from tool_backends.base import ToolResult
from tool_backends.server import ServerSettings, ToolService, check_settings
from tool_backends.toolbox import ToolBackend
from tool_backends.wire import UnknownImage, WireError, encode_image

CALL_KEYS = ("images", "context")
"""Arguments of an MCP call that are not the tool's own: taken out before the tool sees them."""

IMAGES_SCHEMA: dict[str, Any] = {
    "type": "array",
    "maxItems": 64,
    "items": {"type": ["string", "object", "null"]},
    "description": ("the conversation's images, image 0 first: each a data URL "
                    "('data:image/png;base64,...'), an entry {'png': base64} / {'raw': base64, 'size': [w, h]} / "
                    "{'ref': digest of an image sent before with its 'digest'}, or a path under the server's "
                    "image roots; null for one the call does not read"),
}
CONTEXT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "the episode: record_id, dataset, question, annotations (boxes, masks, labels; oracle engines read them)",
}
OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": ("the result's data: region ([x0, y0, x1, y1] looked at), boxes ([{bbox, label, score}]), "
                    "mask_rle, area_px, scores ({label: probability}), image_index; error when the tool refused"),
    "additionalProperties": True,
}


def input_schema(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's JSON schema with the call's ``images`` (required) and ``context``.

    >>> s = input_schema({"type": "object", "properties": {"bbox": {"type": "array"}}, "required": ["bbox"]})
    >>> sorted(s["properties"]), s["required"]
    (['bbox', 'context', 'images'], ['bbox', 'images'])
    """
    props = dict(parameters.get("properties", {}))
    clash = [k for k in CALL_KEYS if k in props]
    if clash:
        raise ConfigError(f"a tool's own arguments {clash} clash with the MCP call's {list(CALL_KEYS)}")
    schema = {k: v for k, v in parameters.items() if k not in ("properties", "required")}
    schema["type"] = "object"
    schema["properties"] = {**props, "images": IMAGES_SCHEMA, "context": CONTEXT_SCHEMA}
    schema["required"] = [*parameters.get("required", ()), "images"]
    return schema


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON (what a client receives): tuples become lists, numpy scalars numbers."""
    return json.loads(json.dumps(value, default=_default))


def _default(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


class MCPTools:
    """The MCP view of a :class:`ToolService`: tool listings and calls as MCP types.

    ``server`` is the SDK's low-level :class:`mcp.server.lowlevel.Server` with the two handlers;
    run it with :func:`run_stdio` or serve :meth:`http_app` with uvicorn (:func:`serve_http`).
    """

    def __init__(self, backends: Mapping[str, ToolBackend], settings: ServerSettings | None = None) -> None:
        from mcp.server.lowlevel import Server

        self.settings = settings or ServerSettings()
        check_settings(self.settings)
        self.service = ToolService(backends, self.settings)
        self.tools = self._list()
        self._slots = threading.BoundedSemaphore(self.settings.max_concurrency)
        self._waiting = 0
        self._lock = threading.Lock()
        self.server = Server("medvqa-tools", version=_version(),
                             instructions="Medical image tools (MedVQA-Gym): pass the conversation's images "
                                          "with every call; results carry images and structured data.",
                             on_list_tools=self._on_list_tools, on_call_tool=self._on_call_tool)

    def _list(self) -> list:
        import mcp_types as types

        return [types.Tool(name=spec.name, description=spec.description, input_schema=input_schema(spec.parameters),
                           output_schema=OUTPUT_SCHEMA)
                for spec in self.service.specs.values()]

    async def _on_list_tools(self, ctx, params):
        import mcp_types as types

        return types.ListToolsResult(tools=self.tools)

    async def _on_call_tool(self, ctx, params):
        import anyio
        import mcp_types as types
        from mcp.shared.exceptions import MCPError

        if params.name not in self.service.backends:
            raise MCPError(types.INVALID_PARAMS, unknown_name_message("tool", params.name, self.service.backends))
        return await anyio.to_thread.run_sync(self.call, params.name, dict(params.arguments or {}))

    def call(self, name: str, arguments: Mapping[str, Any]):
        """One call (any thread): a ``CallToolResult``; never raises for bad input."""
        with self._lock:
            if self._waiting >= self.settings.max_queue + self.settings.max_concurrency:
                return to_mcp(ToolResult.failure(f"the tool server is busy ({self.settings.max_queue} calls waiting): "
                                                 "retry shortly"))
            self._waiting += 1
        try:
            with self._slots:
                return to_mcp(self.run(name, arguments))
        finally:
            with self._lock:
                self._waiting -= 1

    def run(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """The :class:`ToolResult` of an MCP call's arguments (images and context taken out), under
        the per-request budget the HTTP server gives one ``/call``."""
        own = {k: v for k, v in arguments.items() if k not in CALL_KEYS}
        call = {"tool": name, "arguments": own, "images": arguments.get("images"), "context": arguments.get("context")}
        budget = self.service.budget()
        spent = budget.take_call()
        if spent is not None:
            return ToolResult.failure(spent)
        try:
            name, own, images, context = self.service.decode_call(call, budget)
        except (WireError, UnknownImage, PermissionError, LookupError) as e:
            return ToolResult.failure(str(e))
        return budget.take_result(self.service.run(name, own, images, context))

    def http_app(self, path: str = "/mcp"):
        """The streamable-HTTP ASGI app behind the HTTP tool server's own :class:`RequestGate`: the
        token (without one: loopback ``Host``/``Origin`` and ``application/json`` bodies) before any
        body byte, the body size and its whole-body deadline, a client that leaves ends its request."""
        from tool_backends.server import RequestGate

        app = self.server.streamable_http_app(streamable_http_path=path, host=self.settings.host,
                                              max_request_body_size=self.settings.max_body_bytes)
        return RequestGate(app, self.settings, answer=None)


def to_mcp(result: ToolResult):
    """A :class:`ToolResult` as an MCP ``CallToolResult``: text, PNG images, structured data."""
    import mcp_types as types

    content: list[Any] = [types.TextContent(text=result.text)]
    for image in result.images:
        content.append(types.ImageContent(data=encode_image(image, "png", digest=False)["png"], mime_type="image/png"))
    structured = jsonable(dict(result.data or {}))
    if result.error is not None:
        structured["error"] = result.error
    return types.CallToolResult(content=content, structured_content=structured, is_error=not result.ok)


def from_mcp(result) -> ToolResult:
    """The inverse of :func:`to_mcp` (a client's view): text, decoded images, data."""
    from tool_backends.wire import decode_image_entry

    texts = [b.text for b in result.content if getattr(b, "type", None) == "text"]
    images = [decode_image_entry({"png": b.data}) for b in result.content if getattr(b, "type", None) == "image"]
    data = dict(result.structured_content or {})
    error = data.pop("error", None) if result.is_error else None
    return ToolResult("\n".join(texts), images=images, data=data, error=error)


def run_stdio(tools: MCPTools) -> None:
    """Serve ``tools`` on this process's stdin/stdout until the client closes them."""
    import anyio
    from mcp.server.stdio import stdio_server

    async def main() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await tools.server.run(read_stream, write_stream, tools.server.create_initialization_options())

    anyio.run(main)


def serve_http(tools: MCPTools, port: int, path: str = "/mcp", log_level: str = "warning") -> None:
    """Serve ``tools`` over streamable HTTP on ``settings.host:port`` (blocking), with the HTTP
    server's connection limits (``max_connections``, ``read_timeout_s``)."""
    import uvicorn

    from tool_backends.limits import read_timeout_protocol

    s = tools.settings
    uvicorn.run(tools.http_app(path), host=s.host, port=port, log_level=log_level, access_log=False,
                limit_concurrency=s.max_connections, http=read_timeout_protocol(s.read_timeout_s))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("medvqa-gym")
    except PackageNotFoundError:
        return "0"


__all__ = ["MCPTools", "input_schema", "to_mcp", "from_mcp", "run_stdio", "serve_http"]
