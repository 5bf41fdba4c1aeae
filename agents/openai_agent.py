"""``OpenAIAgent``: any OpenAI-compatible chat endpoint (``vllm serve``, SGLang, hosted APIs).

* Images go as base64 PNG data URLs (``image_url`` parts), downscaled to ``max_image_side``.
* The tools' JSON schemas go as ``tools=`` (unless ``send_tools=False``); the env's system prompt
  also describes them, so models without native tool calling still write ``<tool_call>`` text.
  Native ``tool_calls`` in a response are converted to our ``<tool_call>`` text, and a
  ``reasoning_content`` field (vLLM reasoning parsers) becomes ``<think>...</think>``.
* Timeouts per request; connection errors, timeouts, 408/409/429 and 5xx are retried with
  exponential backoff (honouring ``Retry-After``); other 4xx fail at once. After the last try an
  :class:`EndpointError` says what happened -- the harness decides what a failed episode means.
* ``act_batch`` sends up to ``concurrency`` requests at once (threads) and keeps the order.
* The API key is read from the environment variable ``api_key_env`` and is never logged, put in
  errors, or returned by :meth:`config`.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

from PIL import Image

from agents.base import Agent
from medvqa_env.chat import Conversation
from medvqa_env.errors import MedVQAError

log = logging.getLogger(__name__)
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class EndpointError(MedVQAError, RuntimeError):
    """The endpoint failed (after retries where retrying made sense)."""

    def __init__(self, message: str, status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.status, self.attempts = status, attempts


# ----------------------------------------------------------------------------------------------
# Conversation -> OpenAI request, response -> our turn text (pure functions).
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


def to_openai_messages(conversation: Conversation, image_url=image_data_url) -> list[dict[str, Any]]:
    """Our messages in OpenAI form. ``tool`` role observations (``observation_style="tool_role"``)
    become ``tool`` messages answering ``tool_calls`` attached to the previous assistant turn;
    images they return follow in a user message (OpenAI tool messages carry text only)."""
    from medvqa_env.parser import parse_action

    out: list[dict[str, Any]] = []
    pending_ids: list[str] = []
    for k, m in enumerate(conversation.messages):
        role, content = m["role"], m["content"]
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            nxt = conversation.messages[k + 1] if k + 1 < len(conversation.messages) else None
            calls = parse_action(content).tool_calls if nxt is not None and nxt["role"] == "tool" else ()
            pending_ids = [f"call_{k}_{i}" for i in range(len(calls))]
            if calls:
                msg["tool_calls"] = [{"id": cid, "type": "function", "function": {
                    "name": c.name, "arguments": json.dumps(c.arguments)}} for cid, c in zip(pending_ids, calls)]
            out.append(msg)
        elif role == "tool":
            if pending_ids:
                for i, cid in enumerate(pending_ids):
                    out.append({"role": "tool", "tool_call_id": cid,
                                "content": content if i == 0 else "(all results are in the first tool message)"})
                pending_ids = []
            else:
                out.append({"role": "user", "content": content})
            if m.get("images"):
                parts = [{"type": "image_url", "image_url": {"url": image_url(conversation.images[i])}}
                         for i in m["images"]]
                out.append({"role": "user", "content": parts + [{"type": "text", "text": "Images returned by the tools."}]})
        elif isinstance(content, list):
            parts = []
            for p in content:
                if p.get("type") == "image":
                    parts.append({"type": "image_url", "image_url": {"url": image_url(conversation.images[p["image_index"]])}})
                else:
                    parts.append({"type": "text", "text": p.get("text", "")})
            out.append({"role": role, "content": parts})
        else:
            out.append({"role": role, "content": content})
    return out


def response_to_turn(response: Mapping[str, Any]) -> str:
    """The first choice of a chat completion as our turn text.

    >>> response_to_turn({"choices": [{"message": {"content": "Let me look.", "tool_calls": [
    ...     {"id": "c1", "type": "function", "function": {"name": "image_zoom_in",
    ...      "arguments": "{\\"bbox\\": [1, 2, 3, 4]}"}}]}}]})
    'Let me look.\\n<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [1, 2, 3, 4]}}</tool_call>'
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
        parts.append("<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args}) + "</tool_call>")
    return "\n".join(parts)


def _short(value: Any, limit: int = 300) -> str:
    s = value if isinstance(value, str) else repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------------
class OpenAIAgent(Agent):
    """An agent behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (``vllm serve``) or ``https://api.openai.com/v1``.
        model: model id; ``None`` asks ``GET /models`` and takes the first.
        api_key_env: name of the environment variable holding the key (unset: no auth header).
        temperature, top_p, max_tokens, seed, stop: sampling settings sent with every request.
        send_tools: pass the tools' schemas as ``tools=`` (servers without tool support ignore it,
            or set it False for ones that reject it).
        timeout_s, retries, backoff_s: per-request timeout; extra attempts; first backoff
            (doubling, capped at ``max_backoff_s``).
        concurrency: requests in flight during ``act_batch``.
        max_image_side: images are downscaled to this before encoding.
        extra_body: more JSON fields for every request (e.g. ``{"top_k": 20}`` for vLLM).
    """

    name = "openai"

    def __init__(self, base_url: str = "http://127.0.0.1:8000/v1", model: str | None = None,
                 api_key_env: str | None = "OPENAI_API_KEY", temperature: float = 0.0, top_p: float = 1.0,
                 max_tokens: int = 512, seed: int | None = None, stop: Sequence[str] | None = None,
                 send_tools: bool = True, timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, concurrency: int = 8, max_image_side: int | None = 1024,
                 extra_body: Mapping[str, Any] | None = None) -> None:
        import httpx

        if not str(base_url).startswith(("http://", "https://")):
            raise ValueError(f"expected base_url to start with http:// or https://, got {base_url!r}")
        if retries < 0 or timeout_s <= 0 or concurrency < 1 or max_tokens < 1:
            raise ValueError(f"expected retries >= 0, timeout_s > 0, concurrency >= 1, max_tokens >= 1, got "
                             f"{retries!r}, {timeout_s!r}, {concurrency!r}, {max_tokens!r}")
        self.base_url = str(base_url).rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.sampling = {"temperature": float(temperature), "top_p": float(top_p), "max_tokens": int(max_tokens)}
        if seed is not None:
            self.sampling["seed"] = int(seed)
        if stop:
            self.sampling["stop"] = list(stop)
        self.send_tools = bool(send_tools)
        self.timeout_s, self.retries = float(timeout_s), int(retries)
        self.backoff_s, self.max_backoff_s = float(backoff_s), float(max_backoff_s)
        self.concurrency, self.max_image_side = int(concurrency), max_image_side
        self.extra_body = dict(extra_body or {})
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s),
                                    limits=httpx.Limits(max_connections=self.concurrency))
        self._model_lock = threading.Lock()
        self.stats = {"requests": 0, "retries": 0, "prompt_tokens": 0, "completion_tokens": 0}
        self._stats_lock = threading.Lock()

    def _count(self, **increments: int) -> None:
        with self._stats_lock:  # act_batch updates these from several threads
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

    def build_request(self, conversation: Conversation) -> dict[str, Any]:
        """The JSON body for one conversation (without ``model`` resolution side effects)."""
        body: dict[str, Any] = {"model": self.model,
                                "messages": to_openai_messages(conversation, self._image_url),
                                **self.sampling, **self.extra_body}
        tools = conversation.info.get("tools") or []
        if self.send_tools and tools:
            body["tools"] = list(tools)
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
                self._count(requests=1)
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
                status, last = r.status_code, f"HTTP {r.status_code}: {_short(self._redact(r.text))}"
                if r.status_code not in RETRY_STATUS:
                    raise EndpointError(f"{method} {url} failed: {last}", status, attempt + 1)
                retry_after = r.headers.get("retry-after")
                if retry_after and retry_after.replace(".", "", 1).isdigit():
                    delay = min(self.max_backoff_s, float(retry_after))
            if attempt < self.retries:
                log.warning("%s %s: %s; retry %d/%d in %.2fs", method, url, last, attempt + 1, self.retries, delay)
                time.sleep(delay)
        raise EndpointError(f"{method} {url} failed after {self.retries + 1} attempts: {last}", status,
                            self.retries + 1)

    # ---- the agent contract ------------------------------------------------------------------
    def act(self, conversation: Conversation) -> str:
        body = self.build_request(conversation)
        body["model"] = self.resolve_model()
        response = self._request("POST", "/chat/completions", body)
        usage = response.get("usage") or {}
        self._count(prompt_tokens=int(usage.get("prompt_tokens") or 0),
                    completion_tokens=int(usage.get("completion_tokens") or 0))
        return response_to_turn(response)

    def act_batch(self, conversations: Sequence[Conversation]) -> list[str]:
        if len(conversations) <= 1 or self.concurrency == 1:
            return [self.act(c) for c in conversations]
        self.resolve_model()
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(self.act, conversations))

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "base_url": self.base_url, "model": self.model, "api_key_env": self.api_key_env,
                "send_tools": self.send_tools, "timeout_s": self.timeout_s, "retries": self.retries,
                "concurrency": self.concurrency, **self.sampling, **self.extra_body}

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:  # never the key
        return f"OpenAIAgent(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"
