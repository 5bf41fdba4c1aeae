"""agents.openai_server: the OpenAI chat API over SmolLM2-135M, served by uvicorn on loopback."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

KEY = "sk-local-test"


@pytest.fixture(scope="module")
def server():
    import torch
    import uvicorn

    from agents import openai_server as srv

    os.environ.setdefault("MEDVQA_TEST_LLM_CACHE", str(Path.home() / ".cache" / "medvqa-gym"))
    old = os.environ.get("MEDVQA_CACHE")
    os.environ["MEDVQA_CACHE"] = os.environ["MEDVQA_TEST_LLM_CACHE"]
    try:
        folder = srv.smollm2_folder()
    finally:
        if old is not None:
            os.environ["MEDVQA_CACHE"] = old
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two OpenMP threads on a shared 2-core CPU make generation ~20x slower
    app = srv.build_app(srv.ChatModel(folder, "smollm2-135m-instruct"), api_key=KEY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(url + "/health", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    yield client
    client.close()
    uv.should_exit = True
    thread.join(timeout=10)
    torch.set_num_threads(threads)


def _chat(client, **body):
    body.setdefault("messages", [{"role": "user", "content": "Name one organ."}])
    body.setdefault("max_tokens", 4)
    return client.post("/v1/chat/completions", json=body)


def test_models_and_health(server):
    data = server.get("/v1/models").json()
    assert data["object"] == "list" and data["data"][0]["id"] == "smollm2-135m-instruct"
    assert server.get("/health").json()["status"] == "ok"


def test_chat_completion_shape_n_and_seed(server):
    r = _chat(server, model="anything", n=2, temperature=0.9, seed=7)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion" and data["model"] == "smollm2-135m-instruct"
    assert [c["index"] for c in data["choices"]] == [0, 1]
    assert all(c["message"]["role"] == "assistant" and c["finish_reason"] in ("stop", "length") for c in data["choices"])
    assert 0 < data["usage"]["completion_tokens"] <= 8
    again = _chat(server, n=2, temperature=0.9, seed=7).json()
    assert [c["message"]["content"] for c in again["choices"]] == [c["message"]["content"] for c in data["choices"]]


def test_image_parts_are_ignored_and_system_messages_work(server):
    parts = [{"type": "text", "text": "Say hi."}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    r = _chat(server, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}],
              temperature=0)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    plain = _chat(server, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}],
                  temperature=0)
    assert plain.json()["choices"][0]["message"]["content"] == r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body,status", [
    ({"messages": []}, 422), ({"messages": [{"role": "robot", "content": "x"}]}, 422),
    ({"n": 0}, 422), ({"temperature": 3}, 422), ({"stream": True}, 400),
    ({"max_tokens": 4096, "messages": [{"role": "user", "content": "word " * 5000}]}, 400),
])
def test_bad_requests_are_rejected_clearly(server, body, status):
    r = _chat(server, **body)
    assert r.status_code == status


def test_api_key_is_required(server):
    r = httpx.post(str(server.base_url) + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 401
    assert httpx.get(str(server.base_url) + "/v1/models").status_code == 401
