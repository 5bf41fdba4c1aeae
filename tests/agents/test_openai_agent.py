"""OpenAIAgent against real loopback servers: the SmolLM2 OpenAI server and a scripted one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from agents.openai_agent import EndpointError, OpenAIAgent, response_to_turn, to_openai_messages
from medvqa_env.chat import Conversation
from medvqa_env.env import MedVQAEnv
from rewards import RuleReward

KEY_VAR = "MEDVQA_TEST_ENDPOINT_KEY"
KEY = "sk-test-not-a-secret-123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def smollm2_server():
    """``python -m agents.openai_server`` (SmolLM2-135M-Instruct) on a free loopback port."""
    port = _free_port()
    env = dict(os.environ, **{KEY_VAR: KEY, "OMP_NUM_THREADS": "1"})  # one thread: no OpenMP spinning on a busy CPU
    proc = subprocess.Popen([sys.executable, "-m", "agents.openai_server", "--port", str(port),
                             "--api-key-env", KEY_VAR], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited: {proc.stdout.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("server did not come up in 180 s")
    yield url + "/v1"
    proc.terminate()
    proc.wait(10)


class Scripted(BaseHTTPRequestHandler):
    """Answers from ``server.script`` (a list of (status, body, delay_s)); records request bodies."""

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"body": body, "auth": self.headers.get("Authorization")})
        status, payload, delay = self.server.script.pop(0) if self.server.script else (500, {}, 0)
        time.sleep(delay)
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.script, server.requests = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


NATIVE = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
    "role": "assistant", "content": None, "reasoning_content": "small finding, zoom",
    "tool_calls": [{"id": "x", "type": "function", "function": {
        "name": "image_zoom_in", "arguments": json.dumps({"bbox": [0.2, 0.2, 0.6, 0.6], "coordinates": "normalized"})}}]}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5}}


def test_episodes_through_the_real_smollm2_server(smollm2_server, rad_test, episodes, monkeypatch):
    monkeypatch.setenv(KEY_VAR, KEY)
    agent = OpenAIAgent(smollm2_server, api_key_env=KEY_VAR, max_tokens=24, temperature=0.0, concurrency=2)
    env = MedVQAEnv(dataset=rad_test, reward=RuleReward(), max_turns=1)
    results = episodes(env, agent, [0, 1])
    assert agent.model == "smollm2-135m-instruct"
    assert all(r["end_reason"] in ("answer", "max_turns") for r in results)
    assert all(isinstance(a, str) and a for r in results for a in r["actions"])
    assert agent.stats["completion_tokens"] > 0 and agent.stats["retries"] == 0
    agent.close()


def test_a_wrong_key_fails_at_once_without_leaking_it(smollm2_server, monkeypatch):
    monkeypatch.setenv(KEY_VAR, "sk-wrong-key-456")
    agent = OpenAIAgent(smollm2_server, model="m", api_key_env=KEY_VAR, retries=3, backoff_s=5)
    conv = Conversation.start({"text": "Question: hi?", "images": ()}, {"system_prompt": "Be brief."})
    with pytest.raises(EndpointError, match="HTTP 401") as e:
        agent.act(conv)
    assert e.value.attempts == 1 and e.value.status == 401
    assert "sk-wrong" not in str(e.value) and "sk-wrong" not in repr(agent) and "sk-wrong" not in str(agent.config())


def test_retries_then_converts_native_tool_calls_for_the_env(scripted, rad_test, monkeypatch):
    server, url = scripted
    server.script = [(503, {"error": "busy"}, 0), (429, {"error": "slow down"}, 0), (200, NATIVE, 0)]
    monkeypatch.setenv(KEY_VAR, KEY)
    agent = OpenAIAgent(url, model="qwen", api_key_env=KEY_VAR, retries=2, backoff_s=0.01)
    env = MedVQAEnv(dataset=rad_test, reward=RuleReward())
    obs, info = env.reset(options={"index": 0})
    turn = agent.act(Conversation.start(obs, info))
    assert turn.startswith("<think>small finding, zoom</think>") and "<tool_call>" in turn
    _, _, done, _, step_info = env.step(turn)
    assert not done and step_info["tool_calls"][0]["error"] is None  # the env ran the zoom
    assert agent.stats["retries"] == 2 and len(server.requests) == 3
    sent = server.requests[-1]
    assert sent["auth"] == f"Bearer {KEY}"
    assert sent["body"]["tools"][0]["function"]["name"] == "image_zoom_in"
    image_parts = [p for m in sent["body"]["messages"] if isinstance(m["content"], list)
                   for p in m["content"] if p["type"] == "image_url"]
    assert len(image_parts) == 1 and image_parts[0]["image_url"]["url"].startswith("data:image/png;base64,")


def test_timeouts_and_dead_servers_raise_clear_errors_after_retries(scripted):
    server, url = scripted
    server.script = [(200, NATIVE, 1.0), (200, NATIVE, 1.0)]
    conv = Conversation.start({"text": "Question: hi?", "images": ()}, {})
    agent = OpenAIAgent(url, model="m", timeout_s=0.2, retries=1, backoff_s=0.01)
    with pytest.raises(EndpointError, match="after 2 attempts: timed out") as e:
        agent.act(conv)
    assert e.value.attempts == 2
    dead = OpenAIAgent(f"http://127.0.0.1:{_free_port()}/v1", model="m", retries=1, backoff_s=0.01)
    with pytest.raises(EndpointError, match="connection failed"):
        dead.act(conv)


def test_act_batch_keeps_order_under_concurrency(scripted):
    server, url = scripted
    server.script = [(200, {"choices": [{"message": {"content": f"\\boxed{{{i}}}"}}]}, 0.05 * (3 - i)) for i in range(3)]
    convs = [Conversation.start({"text": f"Question: {i}?", "images": ()}, {}) for i in range(3)]
    agent = OpenAIAgent(url, model="m", concurrency=3)
    turns = agent.act_batch(convs)
    order = [r["body"]["messages"][0]["content"][0]["text"] for r in server.requests]
    assert sorted(turns) == ["\\boxed{0}", "\\boxed{1}", "\\boxed{2}"]
    # each turn went back to the conversation that asked for it, whatever the arrival order
    assert [turns[int(o.split()[1][0])] for o in order] == [f"\\boxed{{{k}}}" for k in range(3)]


def test_tool_role_conversations_become_tool_messages(rad_test):
    env = MedVQAEnv(dataset=rad_test, reward=RuleReward(), observation_style="tool_role")
    obs, info = env.reset(options={"index": 0})
    conv = Conversation.start(obs, info, observation_style="tool_role")
    action = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 50, 50]}}</tool_call>'
    obs, *_ = env.step(action)
    conv.add_turn(action, obs)
    msgs = to_openai_messages(conv, image_url=lambda im: "data:x")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "user"]
    assert msgs[3]["tool_call_id"] == msgs[2]["tool_calls"][0]["id"]
    assert msgs[4]["content"][0] == {"type": "image_url", "image_url": {"url": "data:x"}}


def test_bad_responses_and_arguments():
    with pytest.raises(EndpointError, match="choices"):
        response_to_turn({"error": "x"})
    with pytest.raises(ValueError, match="http"):
        OpenAIAgent("localhost:8000")
