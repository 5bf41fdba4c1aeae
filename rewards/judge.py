"""A YES/NO LLM judge over any OpenAI-compatible ``/v1/chat/completions`` endpoint.

MediX-R1 (seed 001) scores answer correctness with a strict reference-based YES/NO judgment.
:class:`JudgeClient` sends one chat request per (question, prediction, reference), with

* a per-request timeout, retries with exponential backoff on timeouts, connection errors, 429
  and 5xx (other 4xx fail at once: retrying a bad request does not help),
* a bounded thread pool for concurrency, and an LRU cache keyed by (model, prompt),
* the API key read from the environment variable ``api_key_env`` at request time -- it is never
  stored in the config, logged, or shown in ``repr``.

A failed request yields a verdict with ``score=None`` and the error text; a reply that is neither
YES nor NO yields ``score=0.0`` (strict: only a clear YES earns credit).

>>> parse_yes_no("YES.")
1.0
>>> parse_yes_no("  no, the answers differ")
0.0
>>> parse_yes_no("Answer: Yes") , parse_yes_no("maybe")
(1.0, None)
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import httpx

DEFAULT_PROMPT = (
    "You are grading a medical visual question answering system. Decide whether the predicted answer "
    "means the same as the reference answer for this question (paraphrases, synonyms and abbreviations "
    "count as the same).\nQuestion: {question}\nReference answer: {reference}\nPredicted answer: {prediction}\n"
    "Reply with exactly one word: YES or NO."
)
_WORD = re.compile(r"\b(yes|no)\b", re.I)


def parse_yes_no(text: str) -> float | None:
    """1.0 for YES, 0.0 for NO (first such word wins), ``None`` if neither appears."""
    m = _WORD.search(text or "")
    if m is None:
        return None
    return 1.0 if m.group(1).lower() == "yes" else 0.0


@dataclass
class JudgeConfig:
    """Where and how to ask the judge."""

    base_url: str
    """Server root, e.g. ``http://127.0.0.1:8011`` (``/v1`` is added unless present)."""
    model: str = "judge"
    """Model name sent in requests."""
    api_key_env: str | None = "MEDVQA_JUDGE_API_KEY"
    """Environment variable holding the API key (None or unset = no Authorization header)."""
    timeout_s: float = 30.0
    """Per-request timeout (connect + read)."""
    max_retries: int = 3
    """Retries after the first try on retryable failures."""
    backoff_s: float = 0.5
    """First backoff; doubles each retry (plus up to 10% jitter)."""
    max_concurrency: int = 4
    """Requests in flight at once."""
    cache_size: int = 10000
    """Verdicts remembered (LRU); 0 disables the cache."""
    temperature: float = 0.0
    """Sampling temperature (0 = deterministic judge)."""
    max_tokens: int = 4
    """Tokens the judge may write (one word suffices)."""
    prompt: str = DEFAULT_PROMPT
    """Template with ``{question}``, ``{reference}``, ``{prediction}``."""

    def __post_init__(self) -> None:
        if not str(self.base_url).startswith(("http://", "https://")):
            raise ValueError(f"expected an http(s) base_url, got {self.base_url!r}")
        if self.max_retries < 0 or self.max_concurrency < 1 or self.timeout_s <= 0:
            raise ValueError(f"expected max_retries >= 0, max_concurrency >= 1, timeout_s > 0, got "
                             f"{self.max_retries!r}, {self.max_concurrency!r}, {self.timeout_s!r}")

    @property
    def endpoint(self) -> str:
        root = self.base_url.rstrip("/")
        return (root if root.endswith("/v1") else root + "/v1") + "/chat/completions"


@dataclass(frozen=True)
class Verdict:
    score: float | None
    raw: str = ""
    error: str | None = None
    cached: bool = False


class JudgeClient:
    """Batch YES/NO judge; thread-safe; picklable (connections are reopened lazily)."""

    _RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}

    def __init__(self, config: JudgeConfig) -> None:
        self.config = config
        self._cache: OrderedDict[str, Verdict] = OrderedDict()
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self.requests_sent = 0

    def __repr__(self) -> str:
        return f"JudgeClient(endpoint={self.config.endpoint!r}, model={self.config.model!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_lock": None, "_cache": OrderedDict()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                limits = httpx.Limits(max_connections=self.config.max_concurrency)
                self._client = httpx.Client(timeout=self.config.timeout_s, limits=limits)
            return self._client

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.config.api_key_env) if self.config.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _redact(self, text: str) -> str:
        """``text`` with the API key blanked out (an endpoint or proxy may echo request headers)."""
        key = os.environ.get(self.config.api_key_env) if self.config.api_key_env else None
        return text.replace(key, "[api key]") if key else text

    def prompt(self, question: str, prediction: str, reference: str) -> str:
        return self.config.prompt.format(question=question, prediction=prediction, reference=reference)

    def judge(self, items: Sequence[tuple[str, str, str]]) -> list[Verdict]:
        """Verdicts for ``(question, prediction, reference)`` triples, in order."""
        prompts = [self.prompt(q, p, r) for q, p, r in items]
        keys = [hashlib.sha256(f"{self.config.model}\0{p}".encode()).hexdigest() for p in prompts]
        out: list[Verdict | None] = [None] * len(items)
        todo: dict[str, list[int]] = {}
        with self._lock:
            for i, k in enumerate(keys):
                if k in self._cache:
                    self._cache.move_to_end(k)
                    v = self._cache[k]
                    out[i] = Verdict(v.score, v.raw, v.error, cached=True)
                else:
                    todo.setdefault(k, []).append(i)
        if todo:
            firsts = [idx[0] for idx in todo.values()]
            workers = min(self.config.max_concurrency, len(firsts))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                verdicts = list(pool.map(lambda i: self._ask(prompts[i]), firsts))
            with self._lock:
                for (k, idx), v in zip(todo.items(), verdicts):
                    for i in idx:
                        out[i] = v
                    if v.error is None and self.config.cache_size > 0:
                        self._cache[k] = v
                        while len(self._cache) > self.config.cache_size:
                            self._cache.popitem(last=False)
        return out  # type: ignore[return-value]

    def _ask(self, prompt: str) -> Verdict:
        c = self.config
        body = {"model": c.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": c.temperature, "max_tokens": c.max_tokens, "n": 1}
        error = "no attempt"
        for attempt in range(c.max_retries + 1):
            if attempt:
                delay = c.backoff_s * 2 ** (attempt - 1)
                time.sleep(delay * (1 + 0.1 * random.random()))
            try:
                with self._lock:
                    self.requests_sent += 1
                resp = self._http().post(c.endpoint, json=body, headers=self._headers())
            except (httpx.TimeoutException, httpx.TransportError) as e:
                error = f"{type(e).__name__}: {e}"
                continue
            if resp.status_code == 200:
                try:
                    text = resp.json()["choices"][0]["message"]["content"] or ""
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    return Verdict(None, self._redact(resp.text)[:200], f"malformed response: {e!r}")
                score = parse_yes_no(text)
                return Verdict(0.0 if score is None else score, text)
            error = f"HTTP {resp.status_code}: {self._redact(resp.text)[:200]}"
            if resp.status_code not in self._RETRY_STATUS:
                break
        return Verdict(None, "", error)
