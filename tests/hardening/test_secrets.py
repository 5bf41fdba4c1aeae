"""Secrets (judge/endpoint API keys, tool tokens) come from the environment and never reach logs,
error messages, reprs, pickles or result files -- even when a misbehaving server echoes the
request's headers back in its error body (some proxies and debug servers do).

Each test first proves the secret was really sent (the server saw it), so "absent" means something.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hardening_helpers import REPO

SECRET = "sk-hardening-7f3a9c-DO-NOT-LEAK"
TOOL_SECRET = "tok-hardening-51be0d-DO-NOT-LEAK"


class EchoServer:
    """OpenAI-compatible and tool-server-shaped replies on loopback. ``mode``: ``ok`` answers;
    ``echo`` answers 500 (or ``status``) with every request header in the body."""

    def __init__(self, mode: str = "ok", status: int = 500, answer: str = "YES") -> None:
        self.mode, self.status, self.answer = mode, status, answer
        self.seen_auth: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                owner.seen_auth.append(self.headers.get("Authorization", ""))
                if self.path.endswith("/health"):
                    return self._send(200, {"status": "ok"})
                if self.path.endswith("/tools"):  # listing works; calls are where it misbehaves
                    return self._send(200, {"tools": [{"type": "function", "function": {
                        "name": name, "description": "d", "parameters": {"type": "object"}}}
                        for name in ("segment", "image_zoom_in")]})
                if owner.mode == "echo":  # the Authorization header first, so no truncation hides it
                    echoed = f"Authorization: {self.headers.get('Authorization')}; all headers: {dict(self.headers)}"
                    return self._send(owner.status, {"detail": echoed, "error": {"message": echoed}})
                if self.path.endswith("/models"):
                    return self._send(200, {"data": [{"id": "stub"}]})
                return self._send(200, {"choices": [{"message": {"role": "assistant", "content": owner.answer}}]})

            do_GET = do_POST = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def secrets_env(monkeypatch):
    monkeypatch.setenv("HARDEN_API_KEY", SECRET)
    monkeypatch.setenv("HARDEN_TOOL_TOKEN", TOOL_SECRET)


@pytest.fixture
def debug_logs(caplog):
    caplog.set_level(logging.DEBUG)  # httpx/httpcore debug logging included
    return caplog


def assert_absent(*texts: object) -> None:
    for text in texts:
        blob = text if isinstance(text, (bytes, str)) else repr(text)
        blob = blob if isinstance(blob, bytes) else blob.encode("utf-8", "replace")
        assert SECRET.encode() not in blob and TOOL_SECRET.encode() not in blob, blob[:400]


def test_judge_client_keeps_its_key_out_of_verdicts_logs_and_pickles(secrets_env, debug_logs):
    from rewards.judge import JudgeClient, JudgeConfig

    with EchoServer("ok") as ok, EchoServer("echo", status=500) as bad, EchoServer("echo", status=401) as refused:
        verdicts = []
        for server in (ok, bad, refused):
            client = JudgeClient(JudgeConfig(base_url=server.url, api_key_env="HARDEN_API_KEY", max_retries=1,
                                             backoff_s=0.01, cache_size=0))
            verdicts += client.judge([("Is it?", "yes", "yes")])
            assert_absent(repr(client), pickle.dumps(client), client.config)
            client.close()
        assert all(a == f"Bearer {SECRET}" for s in (ok, bad, refused) for a in s.seen_auth)
    assert verdicts[0].score == 1.0 and verdicts[1].error and verdicts[2].error
    assert_absent(verdicts, debug_logs.text)


def _conversation():
    from medvqa_env.chat import Conversation
    from medvqa_env.env import MedVQAEnv
    from rewards import RuleReward

    env = MedVQAEnv(dataset="embedded", reward=RuleReward())
    obs, info = env.reset(seed=0)
    return Conversation.start(obs, info)


def test_openai_agent_keeps_its_key_out_of_errors_logs_and_config(secrets_env, debug_logs):
    from agents.openai_agent import EndpointError, OpenAIAgent

    conv = _conversation()
    with EchoServer("ok", answer="\\boxed{yes}") as ok, EchoServer("echo", status=503) as bad, \
            EchoServer("echo", status=401) as refused:
        agent = OpenAIAgent(base_url=ok.url + "/v1", model="stub", api_key_env="HARDEN_API_KEY", retries=1,
                            backoff_s=0.01)
        assert agent.act(conv) == "\\boxed{yes}"
        assert_absent(repr(agent), agent.config())
        agent.close()
        errors = []
        for server in (bad, refused):
            agent = OpenAIAgent(base_url=server.url + "/v1", model="stub", api_key_env="HARDEN_API_KEY", retries=1,
                                backoff_s=0.01)
            with pytest.raises(EndpointError) as info:
                agent.act(conv)
            errors.append(str(info.value))
            agent.close()
        assert all(a == f"Bearer {SECRET}" for s in (ok, bad, refused) for a in s.seen_auth)
    assert_absent(errors, debug_logs.text)


def test_http_tool_client_keeps_its_token_out_of_observations_logs_and_pickles(secrets_env, debug_logs):
    from medvqa_env.parser import ToolCall
    from PIL import Image
    from tool_backends.base import ToolContext
    from tool_backends.http_client import HTTPToolBackend
    from tool_backends.toolbox import Toolbox

    image = Image.new("RGB", (32, 32))
    with EchoServer("ok") as ok, EchoServer("echo", status=500) as bad, EchoServer("echo", status=401) as refused:
        specs = HTTPToolBackend(["segment"], url=ok.url, token_env="HARDEN_TOOL_TOKEN").specs()
        texts = []
        for server in (bad, refused):
            box = Toolbox({"segment": HTTPToolBackend(["segment"], url=server.url, token_env="HARDEN_TOOL_TOKEN",
                                                      retries=1, backoff_s=0.01)})
            record = box.call(ToolCall("segment", {"bbox": [0, 0, 9, 9]}), [image], ToolContext())
            texts.append(record.result.text)
            assert_absent(record.to_dict(), pickle.dumps(box._backends["segment"]), repr(box._backends["segment"]))
            box.close()
        assert specs[0].name == "segment" and all("refused" in t for t in texts), texts
        assert all(a == f"Bearer {TOOL_SECRET}" for s in (ok, bad, refused) for a in s.seen_auth)
    assert_absent(texts, debug_logs.text)


@pytest.mark.slow
def test_an_eval_run_writes_no_secret_anywhere(server_factory, tmp_path):
    """``python -m eval.run`` with a token-protected tool server, an echoing tool server and an
    LLM judge: stdout, stderr and every file written under ``--out`` are free of both secrets."""
    env = {**os.environ, "HARDEN_API_KEY": SECRET, "HARDEN_TOOL_TOKEN": TOOL_SECRET, "HF_HUB_OFFLINE": "1"}
    server = server_factory("serve", ["--tools", "image_zoom_in", "--token-env", "HARDEN_TOOL_TOKEN"],
                            env={"HARDEN_TOOL_TOKEN": TOOL_SECRET})
    outputs = []
    with EchoServer("ok", answer='{"correct": true, "reason": "same"}') as judge, EchoServer("echo") as hostile:
        for name, url in (("good", server.url), ("hostile", hostile.url)):
            tools = json.dumps({"image_zoom_in": {"url": url, "token_env": "HARDEN_TOOL_TOKEN", "retries": 0}})
            out = tmp_path / name
            cmd = [sys.executable, "-m", "eval.run", "--agent", "scripted", "--dataset", "embedded", "--limit", "4",
                   "--workers", "0", "--tools", tools, "--out", str(out), "--no-open-metrics", "--bootstrap", "0",
                   "--no-progress", "--judge-url", judge.url, "--judge-api-key-env", "HARDEN_API_KEY"]
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr[-2000:]
            outputs += [proc.stdout, proc.stderr] + [p.read_bytes() for p in out.rglob("*") if p.is_file()]
            rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
            calls = [c for r in rows for t in r["trace"] for c in t["tool_calls"]]
            assert calls and all((c["error"] is None) == (name == "good") for c in calls), (name, calls[:1])
        assert judge.seen_auth and all(a == f"Bearer {SECRET}" for a in judge.seen_auth)
        assert hostile.seen_auth and all(a == f"Bearer {TOOL_SECRET}" for a in hostile.seen_auth)
    assert_absent(*outputs)


def test_the_router_does_not_pass_on_its_upstream_token(server_factory):
    """A router forwards upstream bodies unchanged -- except its own upstream token, if echoed."""
    import httpx

    with EchoServer("echo", status=500) as upstream:
        router = server_factory("router", ["--upstream", f"segment={upstream.url}", "--upstream-token-env",
                                           "HARDEN_TOOL_TOKEN", "--wait-s", "10"],
                                env={"HARDEN_TOOL_TOKEN": TOOL_SECRET})
        r = httpx.post(router.url + "/call", json={"tool": "segment", "arguments": {}, "images": []}, timeout=30)
        assert upstream.seen_auth[-1] == f"Bearer {TOOL_SECRET}"
    assert r.status_code == 500 and "[token]" in r.text
    assert_absent(r.text, router.log())
