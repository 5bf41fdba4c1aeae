"""``OpenAIAgent``: any OpenAI-compatible chat endpoint (``vllm serve``, SGLang, hosted APIs).

Two ways to call tools, ``tool_protocol``:

* ``"native"`` (default): OpenAI's tool protocol. The tools' JSON schemas go once, as ``tools=``;
  the system prompt is the env's without its tool list and ``<tool_call>`` instructions (so tools
  are described once). The response's ``tool_calls`` are taken as they come: each becomes a
  ``<tool_call>`` block for the env *with its id* (``{"name", "arguments", "id"}``; the env's
  parser ignores the id), so the next request replays the assistant message with the same
  ``tool_calls`` and answers each with a ``role: "tool"`` message carrying its ``tool_call_id``
  and that call's own result. ``reasoning_content`` (vLLM reasoning parsers) is shown to the env
  as ``<think>...</think>`` and not sent back (OpenAI and vLLM drop past reasoning).
  Images a tool returns go in one ``user`` message right after the turn's tool messages, as
  ``image_url`` parts: OpenAI's API accepts images only in user messages (a tool message is
  text), vLLM and SGLang accept that form with every vision chat template, and tool messages must
  directly follow their assistant message -- so the images come after all of them.
  A server without tool parsing that writes ``<tool_call>`` text still works: calls without an id
  stay text in the history and their results go back as the env wrote them. A server that rejects
  ``tools`` switches the agent to ``"text"`` (warned once).
* ``"text"``: no ``tools=``; the env's system prompt describes the tools and the model writes
  ``<tool_call>`` text; results come back as user messages (any chat server).

Requests carry only the sampling fields that are set (``temperature``, ``top_p``, ``seed``,
``stop``, the token limit); the token limit is ``max_completion_tokens`` for OpenAI's own API and
its reasoning models (``o1``.., ``gpt-5``..), else ``max_tokens`` (``token_limit_field`` picks).
A request rejected (HTTP 400/422) for a parameter it names is sent again without it (or with the
token limit under its other name) -- once per parameter -- with one warning per run naming it
(however many concurrent requests were rejected); later requests leave it out, and :meth:`config`
records what was sent: the parameter moves to ``dropped_parameters`` (``{name: {"requested", "why"}}``),
a renamed token limit to ``renamed_parameters``.

Timeouts per request; connection errors, timeouts, 408/409/429 and 5xx are retried with
exponential backoff (honouring ``Retry-After``); other 4xx fail at once. After the last try an
:class:`EndpointError` says what happened -- the harness decides what a failed episode means.
``act_batch`` sends up to ``concurrency`` requests at once (threads) and keeps the order.

What was run is recorded: :meth:`config` holds the resolved model id (``GET /models`` when none is
given); :meth:`usage` the models the server reported in its responses and the token totals; each
conversation's :attr:`~medvqa_env.chat.Conversation.usage` its own tokens (the harness writes them
per episode). The API key is read from the environment variable ``api_key_env`` and is never
logged, put in errors, or returned by :meth:`config`.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

from PIL import Image

from agents.base import Agent
from medvqa_env.chat import Conversation
from medvqa_env.errors import ConfigError, MedVQAError

log = logging.getLogger(__name__)
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
TOOL_PROTOCOLS = ("native", "text")
TOKEN_LIMIT_FIELDS = ("auto", "max_tokens", "max_completion_tokens")
SAMPLING_FIELDS = ("temperature", "top_p", "seed", "stop", "max_tokens", "max_completion_tokens", "tool_choice")
COMPLETION_TOKENS_MODELS = re.compile(r"^(o\d|gpt-5|gpt-4\.1)", re.IGNORECASE)
"""OpenAI models that take ``max_completion_tokens`` (reasoning models reject ``max_tokens``)."""
TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


class EndpointError(MedVQAError, RuntimeError):
    """The endpoint failed (after retries where retrying made sense). ``body`` is the server's
    answer (API key redacted) when there was one."""

    def __init__(self, message: str, status: int | None = None, attempts: int = 1, body: str = "") -> None:
        super().__init__(message)
        self.status, self.attempts, self.body = status, attempts, body


# ----------------------------------------------------------------------------------------------
# Conversation -> OpenAI messages, response -> our turn text (pure functions).
# ----------------------------------------------------------------------------------------------
def image_data_url(image: Image.Image, max_side: int | None = 1024) -> str:
    """A ``data:image/png;base64,...`` URL of ``image`` (a copy is downscaled, never the original).

    >>> image_data_url(Image.new("L", (4, 4)))[:22]
    'data:image/png;base64,'
    """
    if image.mode not in ("RGB", "L", "RGBA"):
        image = image.convert("RGB")
    if max_side and max(image.size) > max_side:
        image = image.copy()
        image.thumbnail((max_side, max_side))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def native_calls(turn: str) -> tuple[list[dict[str, Any]], str]:
    """``(tool_calls, content)`` of an assistant turn we wrote from a response: the ``<tool_call>``
    blocks that carry an ``id`` as OpenAI ``tool_calls`` (arguments as the JSON string), and the
    text without them and without ``<think>`` blocks. Blocks without an id (a model that wrote
    the call as text) stay in the text.

    >>> calls, text = native_calls('<think>look</think>Zoom.\\n<tool_call>{"name": "zoom", '
    ...                            '"arguments": {"x": 1}, "id": "c7"}</tool_call>')
    >>> calls[0]["id"], calls[0]["function"], text
    ('c7', {'name': 'zoom', 'arguments': '{"x": 1}'}, 'Zoom.')
    """
    calls = []

    def take(match: re.Match) -> str:
        try:
            obj = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(obj, dict) or not obj.get("id"):
            return match.group(0)
        args = obj.get("arguments", {})
        calls.append({"id": str(obj["id"]), "type": "function", "function": {
            "name": str(obj.get("name", "")), "arguments": args if isinstance(args, str) else json.dumps(args)}})
        return ""

    text = TOOL_CALL_BLOCK.sub(take, turn)
    return calls, THINK_BLOCK.sub("", text).strip()


def split_tool_results(text: str, names: Sequence[str]) -> list[str] | None:
    """The env's observation text cut into one result per call, in order: each call's part starts
    at a line ``[name] ...`` (what the env writes); notes after the last part (turns left, format
    problems) stay with it. ``None`` when the parts are not found in order.

    >>> split_tool_results("[zoom] a crop. New image: image 1.\\n[ground] none\\nTool turns left: 1.", ["zoom", "ground"])
    ['[zoom] a crop. New image: image 1.', '[ground] none\\nTool turns left: 1.']
    """
    body = text.strip()
    if body.startswith("<observation>") and body.endswith("</observation>"):
        body = body[len("<observation>"):-len("</observation>")].strip()
    lines = body.split("\n")
    starts, at = [], 0
    for name in names:
        while at < len(lines) and not lines[at].startswith(f"[{name}]"):
            at += 1
        if at == len(lines):
            return None
        starts.append(at)
        at += 1
    if not starts or starts[0] != 0:
        return None
    ends = starts[1:] + [len(lines)]
    return ["\n".join(lines[a:b]).strip() for a, b in zip(starts, ends)]


def _image_part(index: int, conversation: Conversation, image_url) -> dict[str, Any]:
    """An ``image_url`` part, or the text ``[image i]`` when images are not sent (``image_url=None``)."""
    if image_url is None:
        return {"type": "text", "text": f"[image {index}]"}
    return {"type": "image_url", "image_url": {"url": image_url(conversation.images[index])}}


def _content_parts(content: Any, conversation: Conversation, image_url) -> Any:
    if not isinstance(content, list):
        return content
    return [_image_part(p["image_index"], conversation, image_url) if p.get("type") == "image"
            else {"type": "text", "text": p.get("text", "")} for p in content]


def _observation(message: Mapping[str, Any]) -> tuple[str, list[int]]:
    """The text and image indices of an env observation message (tool role or user message)."""
    if message["role"] == "tool":
        return str(message["content"]), list(message.get("images") or ())
    content = message["content"]
    if isinstance(content, str):
        return content, []
    text = "\n".join(p.get("text", "") for p in content if p.get("type") != "image")
    return text, [p["image_index"] for p in content if p.get("type") == "image"]


def to_openai_messages(conversation: Conversation, image_url=image_data_url,
                       tool_protocol: str = "native") -> list[dict[str, Any]]:
    """Our messages in OpenAI form (see the module docstring for each protocol); ``image_url``
    turns an image into a URL, or is ``None`` to send ``[image i]`` text instead (text models)."""
    if tool_protocol not in TOOL_PROTOCOLS:
        raise ConfigError(f"expected tool_protocol in {TOOL_PROTOCOLS}, got {tool_protocol!r}")
    msgs = conversation.messages
    out: list[dict[str, Any]] = []
    k = 0
    while k < len(msgs):
        m = msgs[k]
        role, content = m["role"], m["content"]
        if role == "system" and tool_protocol == "native" and conversation.info.get("tools"):
            from agents.text_llm import _tool_free_system

            out.append({"role": "system", "content": _tool_free_system(conversation)})
        elif role == "assistant" and tool_protocol == "native":
            calls, text = native_calls(str(content))
            if not calls:
                out.append({"role": "assistant", "content": text})
            else:
                out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
                if k + 1 < len(msgs) and msgs[k + 1]["role"] in ("tool", "user"):
                    k += 1
                    out.extend(_tool_messages(calls, msgs[k], conversation, image_url))
        elif role == "tool":  # results of calls written as text: a user turn
            text, images = _observation(m)
            parts = [_image_part(i, conversation, image_url) for i in images]
            out.append({"role": "user", "content": parts + [{"type": "text", "text": text}] if parts else text})
        else:
            out.append({"role": role, "content": _content_parts(content, conversation, image_url)})
        k += 1
    return out


def _tool_messages(calls: Sequence[Mapping[str, Any]], observation: Mapping[str, Any], conversation: Conversation,
                   image_url) -> list[dict[str, Any]]:
    """One ``tool`` message per call (its own result), then the images the tools returned."""
    text, images = _observation(observation)
    results = split_tool_results(text, [c["function"]["name"] for c in calls])
    if results is None:  # not the env's per-call layout (e.g. a format problem): all of it, once
        first = calls[0]["id"]
        results = [text] + [f"(this call's result is in the result of {first})"] * (len(calls) - 1)
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": c["id"], "content": r} for c, r in zip(calls, results)]
    if images and image_url is not None:  # (without images the tool's text names them already)
        parts = [_image_part(i, conversation, image_url) for i in images]
        names = ", ".join(f"image {i}" for i in images)
        out.append({"role": "user", "content": parts + [{"type": "text", "text": f"The tools returned {names}."}]})
    return out


def response_to_turn(response: Mapping[str, Any], keep_ids: bool = True) -> str:
    """The first choice of a chat completion as our turn text: reasoning as ``<think>``, the
    content, and each native tool call as a ``<tool_call>`` block (with its ``id`` when ``keep_ids``).

    >>> response_to_turn({"choices": [{"message": {"content": "Let me look.", "tool_calls": [
    ...     {"id": "c1", "type": "function", "function": {"name": "image_zoom_in",
    ...      "arguments": "{\\"bbox\\": [1, 2, 3, 4]}"}}]}}]})
    'Let me look.\\n<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [1, 2, 3, 4]}, "id": "c1"}</tool_call>'
    """
    try:
        message = response["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise EndpointError(f"expected a chat completion with choices[0].message, got {_short(response)}") from None
    parts = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        parts.append(f"<think>{reasoning}</think>")
    if message.get("content"):
        parts.append(str(message["content"]))
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        args: Any = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                pass  # keep the raw string: the env's parser reports the bad JSON to the model
        block = {"name": fn.get("name"), "arguments": args}
        if keep_ids and call.get("id"):
            block["id"] = call["id"]
        parts.append("<tool_call>" + json.dumps(block) + "</tool_call>")
    return "\n".join(parts)


def _short(value: Any, limit: int = 300) -> str:
    s = value if isinstance(value, str) else repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def rejected_parameter(body: str, sent: Sequence[str]) -> str | None:
    """The sent parameter a 400/422 answer names (OpenAI's ``error.param``, else the first of
    ``sent`` quoted or named in the message).

    >>> rejected_parameter('{"error": {"message": "Unsupported parameter: \\'max_tokens\\' is not '
    ...                    'supported with this model.", "param": "max_tokens"}}', ["temperature", "max_tokens"])
    'max_tokens'
    >>> rejected_parameter('{"detail": [{"loc": ["body", "tools"], "msg": "Extra inputs"}]}', ["tools", "top_p"])
    'tools'
    """
    try:
        data = json.loads(body)
    except (ValueError, TypeError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict) and data["error"].get("param") in sent:
        return data["error"]["param"]
    for name in sent:
        if re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", body):
            return name
    return None


# ----------------------------------------------------------------------------------------------
class _WaitNotes:
    """While an ``act_batch`` waits longer than ``agent.wait_note_s``, one line on stderr every
    ``wait_note_s``: the endpoint, the answers so far, the per-request timeout."""

    def __init__(self, agent: "OpenAIAgent", n: int) -> None:
        self.agent, self.n, self.answered = agent, n, 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def done(self, turn: str) -> str:
        with self._lock:
            self.answered += 1
        return turn

    def _watch(self) -> None:
        import sys

        start = time.monotonic()
        a = self.agent
        while not self._stop.wait(a.wait_note_s):
            with self._lock:
                answered = self.answered
            print(f"openai agent: waiting for {a.base_url} (model {a.model or 'not resolved yet'}): {answered} of "
                  f"{self.n} answers after {time.monotonic() - start:.0f} s (timeout_s={a.timeout_s:g} per attempt, "
                  f"retries={a.retries}, concurrency={a.concurrency})", file=sys.stderr, flush=True)

    def __enter__(self) -> "_WaitNotes":
        if self.agent.wait_note_s > 0:
            self._thread = threading.Thread(target=self._watch, daemon=True, name="openai-wait-notes")
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1)


class OpenAIAgent(Agent):
    """An agent behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (``vllm serve``) or ``https://api.openai.com/v1``.
        model: model id; ``None`` asks ``GET /models`` and takes the first.
        api_key_env: name of the environment variable holding the key (unset: no auth header).
        tool_protocol: ``"native"`` (OpenAI ``tools``/``tool_calls``) or ``"text"`` (``<tool_call>``
            text, for servers without tool parsing); see the module docstring.
        temperature, top_p, seed, stop: sent only when set (the server's defaults otherwise).
        max_tokens: the most tokens a turn may generate (``None``: the server's limit), sent as
            ``token_limit_field``: ``"auto"``, ``"max_tokens"`` or ``"max_completion_tokens"``.
        tool_choice: sent when set (e.g. ``"auto"``, ``"required"``).
        timeout_s, retries, backoff_s: per-request timeout; extra attempts; first backoff
            (doubling, capped at ``max_backoff_s``).
        concurrency: requests in flight during ``act_batch``.
        images: send the images as ``image_url`` parts (``False``: a text-only model; each image is
            the text ``[image i]``).
        max_image_side: images are downscaled to this before encoding.
        extra_body: more JSON fields for every request (e.g. ``{"top_k": 20}`` for vLLM).
        send_tools: deprecated; ``False`` is ``tool_protocol="text"``.
        wait_note_s: while requests are in flight longer than this, say on stderr every
            ``wait_note_s`` what is awaited (the endpoint, answers so far, the timeout), so a slow
            server is never a silent ``0/N``; ``0`` says nothing.
    """

    name = "openai"

    def __init__(self, base_url: str = "http://127.0.0.1:8000/v1", model: str | None = None,
                 api_key_env: str | None = "OPENAI_API_KEY", tool_protocol: str = "native",
                 temperature: float | None = None, top_p: float | None = None, max_tokens: int | None = None,
                 token_limit_field: str = "auto", seed: int | None = None, stop: Sequence[str] | None = None,
                 tool_choice: str | None = None, timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, concurrency: int = 8, images: bool = True,
                 max_image_side: int | None = 1024,
                 extra_body: Mapping[str, Any] | None = None, send_tools: bool | None = None,
                 wait_note_s: float = 15.0) -> None:
        import httpx

        if not str(base_url).startswith(("http://", "https://")):
            raise ValueError(f"expected base_url to start with http:// or https://, got {base_url!r}")
        if retries < 0 or timeout_s <= 0 or concurrency < 1 or (max_tokens is not None and max_tokens < 1):
            raise ValueError(f"expected retries >= 0, timeout_s > 0, concurrency >= 1, max_tokens >= 1 or None, got "
                             f"{retries!r}, {timeout_s!r}, {concurrency!r}, {max_tokens!r}")
        if send_tools is not None:
            log.warning("send_tools is deprecated: use tool_protocol='native' or 'text'")
            tool_protocol = "native" if send_tools else "text"
        if tool_protocol not in TOOL_PROTOCOLS:
            raise ConfigError(f"expected tool_protocol in {TOOL_PROTOCOLS}, got {tool_protocol!r}")
        if token_limit_field not in TOKEN_LIMIT_FIELDS:
            raise ConfigError(f"expected token_limit_field in {TOKEN_LIMIT_FIELDS}, got {token_limit_field!r}")
        self.base_url = str(base_url).rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.tool_protocol = tool_protocol
        self.sampling: dict[str, Any] = {k: v for k, v in (("temperature", temperature), ("top_p", top_p),
                                                            ("seed", seed), ("stop", list(stop) if stop else None),
                                                            ("tool_choice", tool_choice)) if v is not None}
        self.max_tokens, self.token_limit_field = max_tokens, token_limit_field
        self.timeout_s, self.retries = float(timeout_s), int(retries)
        self.backoff_s, self.max_backoff_s = float(backoff_s), float(max_backoff_s)
        self.concurrency, self.images, self.max_image_side = int(concurrency), bool(images), max_image_side
        self.extra_body = dict(extra_body or {})
        self.wait_note_s = float(wait_note_s)
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s),
                                    limits=httpx.Limits(max_connections=self.concurrency))
        self._model_lock = threading.Lock()
        self._lock = threading.Lock()  # stats, dropped parameters (act_batch runs in threads)
        self.dropped: dict[str, str] = {}  # parameter -> why the server rejected it
        self._limit_names_tried: set[str] = set()
        # requests: chat completions answered; http_requests: every HTTP attempt (retries, GET /models)
        self.stats = {"requests": 0, "http_requests": 0, "retries": 0, "prompt_tokens": 0, "completion_tokens": 0,
                      "total_tokens": 0}
        self.served_models: Counter = Counter()  # "model" of each response, as the server reported it

    def _count(self, **increments: int) -> None:
        with self._lock:
            for key, value in increments.items():
                self.stats[key] += value

    # ---- request building --------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _redact(self, text: str) -> str:
        """``text`` with the API key blanked out (an endpoint or proxy may echo request headers)."""
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return text.replace(key, "[api key]") if key else text

    def token_limit_name(self) -> str:
        """``max_completion_tokens`` for OpenAI's API and its reasoning models, else ``max_tokens``."""
        if self.token_limit_field != "auto":
            return self.token_limit_field
        if "api.openai.com" in self.base_url or COMPLETION_TOKENS_MODELS.match(str(self.model or "")):
            return "max_completion_tokens"
        return "max_tokens"

    def build_request(self, conversation: Conversation) -> dict[str, Any]:
        """The JSON body for one conversation (the model as resolved so far; nothing is fetched)."""
        body: dict[str, Any] = {"model": self.model,
                                "messages": to_openai_messages(conversation, self._image_url if self.images else None,
                                                               self.tool_protocol),
                                **self.sampling}
        if self.max_tokens is not None:
            body[self.token_limit_name()] = int(self.max_tokens)
        body.update(self.extra_body)
        tools = conversation.info.get("tools") or []
        if self.tool_protocol == "native" and tools:
            body["tools"] = list(tools)
        with self._lock:
            for name in self.dropped:
                body.pop(name, None)
        return body

    def _image_url(self, image: Image.Image) -> str:
        return image_data_url(image, self.max_image_side)

    def resolve_model(self) -> str:
        """The model id: the one given, else the first of ``GET /models``."""
        with self._model_lock:
            if self.model is None:
                data = self._request("GET", "/models")
                try:
                    self.model = str(data["data"][0]["id"])
                except (KeyError, IndexError, TypeError):
                    raise EndpointError(f"{self.base_url}/models listed no model: {_short(data)}") from None
            return self.model

    # ---- HTTP with retries ------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        url = self.base_url + path
        last = "no attempt made"
        status = None
        for attempt in range(self.retries + 1):
            if attempt:
                self._count(retries=1)
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** attempt)
            try:
                self._count(http_requests=1)
                r = self._client.request(method, url, json=body, headers=self._headers())
            except httpx.TimeoutException:
                last, status = f"timed out after {self.timeout_s:g} s", None
            except httpx.TransportError as e:
                last, status = f"connection failed ({type(e).__name__}: {e})", None
            else:
                if r.status_code < 400:
                    try:
                        return r.json()
                    except ValueError:
                        raise EndpointError(f"{method} {url} returned non-JSON: {_short(self._redact(r.text))}", r.status_code,
                                            attempt + 1) from None
                text = self._redact(r.text)
                status, last = r.status_code, f"HTTP {r.status_code}: {_short(text)}"
                if r.status_code not in RETRY_STATUS:
                    raise EndpointError(f"{method} {url} failed: {last}", status, attempt + 1, body=text)
                retry_after = r.headers.get("retry-after")
                if retry_after and retry_after.replace(".", "", 1).isdigit():
                    delay = min(self.max_backoff_s, float(retry_after))
            if attempt < self.retries:
                log.warning("%s %s: %s; retry %d/%d in %.2fs", method, url, last, attempt + 1, self.retries, delay)
                time.sleep(delay)
        raise EndpointError(f"{method} {url} failed after {self.retries + 1} attempts: {last}", status,
                            self.retries + 1)

    def _complete(self, conversation: Conversation) -> dict[str, Any]:
        """POST the conversation. A parameter the server rejects (HTTP 400/422 naming it) is left
        out -- the token limit renamed -- and the request sent again: once per parameter."""
        model = self.resolve_model()
        left_out: set[str] = set()
        while True:
            body = self.build_request(conversation)
            body["model"] = model
            try:
                return self._request("POST", "/chat/completions", body)
            except EndpointError as e:
                if e.status not in (400, 422):
                    raise
                optional = [k for k in (*SAMPLING_FIELDS, *self.extra_body, "tools") if k in body]
                name = rejected_parameter(e.body, optional)
                if name is None or name in left_out:
                    raise
                left_out.add(name)
                self._leave_out(name, e)

    def _leave_out(self, name: str, error: EndpointError) -> None:
        """Leave ``name`` out of later requests; warned once per run, however many concurrent
        requests were rejected for it at the same time."""
        why = _short(error.body, 200)
        with self._lock:
            if name in self.dropped or (name in self._limit_names_tried and self.token_limit_field != name):
                return  # a concurrent request already left it out (and said so)
            if name == "tools":
                if self.tool_protocol == "text":  # a concurrent request already switched
                    return
                self.tool_protocol = "text"
                log.warning("%s rejected 'tools' (%s); switching to tool_protocol='text' (tools described in the "
                            "system prompt, calls written as <tool_call> text)", self.base_url, why)
                return
            other = {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens"}.get(name)
            if other and other not in self._limit_names_tried and (self.token_limit_field == "auto" or other in why):
                self._limit_names_tried.add(name)
                self.token_limit_field = other
                log.warning("%s rejected %r (%s); sending the token limit as %r", self.base_url, name, why, other)
                return
            self.dropped[name] = why
        log.warning("%s rejected %r (%s); sending requests without it", self.base_url, name, why)

    # ---- the agent contract ------------------------------------------------------------------
    def act(self, conversation: Conversation) -> str:
        response = self._complete(conversation)
        usage = response.get("usage") or {}
        tokens = {k: int(usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        self._count(requests=1, **tokens)
        with self._lock:
            self.served_models[str(response.get("model"))] += 1
        for key, value in {**tokens, "requests": 1}.items():
            conversation.usage[key] = conversation.usage.get(key, 0) + value
        return response_to_turn(response, keep_ids=self.tool_protocol == "native")

    def act_batch(self, conversations: Sequence[Conversation]) -> list[str]:
        with _WaitNotes(self, len(conversations)) as notes:
            if len(conversations) <= 1 or self.concurrency == 1:
                return [notes.done(self.act(c)) for c in conversations]
            self.resolve_model()
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
                return list(pool.map(lambda c: notes.done(self.act(c)), conversations))

    def request_settings(self) -> dict[str, Any]:
        """What every request carries besides the messages and tools, as it will be sent: the model,
        the sampling fields that are set, the token limit under the name the server takes, the
        extra body (a parameter the server rejected is left out).

        >>> OpenAIAgent(base_url="http://127.0.0.1:9/v1", model="m", temperature=0, max_tokens=48).request_settings()
        {'model': 'm', 'temperature': 0, 'max_tokens': 48}
        """
        out: dict[str, Any] = {"model": self.model or "the first of GET /models", **self.sampling}
        if self.max_tokens is not None:
            out[self.token_limit_name()] = int(self.max_tokens)
        out.update(self.extra_body)
        with self._lock:
            for name in self.dropped:
                out.pop(name, None)
        return out

    def config(self) -> dict[str, Any]:
        """What identifies this agent in result files; the model id is resolved first (one
        ``GET /models`` when none was given), so two models on one URL are told apart."""
        self.resolve_model()
        out = {"name": self.name, "base_url": self.base_url, "model": self.model, "api_key_env": self.api_key_env,
               "tool_protocol": self.tool_protocol, "images": self.images, "timeout_s": self.timeout_s, "retries": self.retries,
               "concurrency": self.concurrency, **self.sampling, **self.extra_body}
        if self.max_tokens is not None:
            out[self.token_limit_name()] = self.max_tokens
        with self._lock:  # what was sent: a parameter the server rejected is not in the requests
            dropped = {name: {"requested": out.pop(name), "why": why} for name, why in self.dropped.items()
                       if name in out}
            renamed = {old: self.token_limit_field for old in self._limit_names_tried
                       if self.max_tokens is not None and old != self.token_limit_field}
        if dropped:
            out["dropped_parameters"] = dropped
        if renamed:
            out["renamed_parameters"] = renamed
        return out

    def usage(self) -> dict[str, Any]:
        """What the run cost and who answered: token totals, requests, retries, the models the
        server reported (response ``model`` -> count) and the parameters it rejected."""
        with self._lock:
            return {**self.stats, "served_models": dict(self.served_models), "dropped_parameters": dict(self.dropped),
                    "tool_protocol": self.tool_protocol}

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:  # never the key
        return f"OpenAIAgent(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"
