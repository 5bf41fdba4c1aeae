"""OpenAIAgent against real loopback HTTP servers: a scripted one (``FakeChatServer``: every message
shape of OpenAI's tool protocol, rejected parameters, retries) and the SmolLM2 OpenAI server.
The same agent against vLLM's own OpenAI server is tests/agents/test_openai_vllm.py."""

from __future__ import annotations

import json
import logging
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
TOOLS = "image_zoom_in,ground=oracle"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- a scripted OpenAI-compatible server (a fake at the HTTP boundary; the real ones are below) --
class FakeChatHandler(BaseHTTPRequestHandler):
    """``POST`` answers from ``server.script`` (``(status, body, delay_s)`` or a function of the
    request body returning one) and records each request; ``GET /models`` lists ``server.models``."""

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):  # noqa: N802
        self.server.gets.append(self.path)
        self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.server.models]})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"body": body, "auth": self.headers.get("Authorization")})
        item = self.server.script.pop(0) if self.server.script else (500, {"error": "script ran out"}, 0)
        status, payload, delay = item(body) if callable(item) else item
        time.sleep(delay)
        self._send(status, payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeChatHandler)
    server.script, server.requests, server.gets, server.models = [], [], [], ["served-model-1"]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def completion(content=None, tool_calls=None, model="Qwen/Qwen2.5-VL-7B-Instruct", reasoning=None, usage=(10, 5)):
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                                 for cid, name, args in tool_calls]
    if reasoning:
        message["reasoning_content"] = reasoning
    return (200, {"id": "chatcmpl-1", "object": "chat.completion", "model": model, "choices": [
        {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}, 0)


ZOOM = ("call_zoom_7", "image_zoom_in", {"bbox": [0, 0, 64, 64]})
GROUND = ("call_ground_8", "ground", {"text": "lesion"})


@pytest.fixture
def env():
    e = MedVQAEnv(tools=TOOLS, reward=RuleReward(), max_turns=2)
    yield e
    e.close()


def play(env, agent, index=1, observation_style="observation_tag"):
    """One episode, act by act; returns the final step's info."""
    obs, info = env.reset(options={"index": index})
    conv = Conversation.start(obs, info, observation_style=observation_style)
    while True:
        action = agent.act(conv)
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return conv, info
        conv.add_turn(action, obs)


# ---- native tool protocol -------------------------------------------------------------------
def test_native_tool_calls_keep_their_ids_and_each_gets_its_own_tool_message(fake, env):
    server, url = fake
    server.script = [completion("Let me look.", [ZOOM, GROUND], reasoning="small, zoom in"),
                     completion("\\boxed{yes}")]
    agent = OpenAIAgent(url, model="qwen-vl", api_key_env=None)
    conv, info = play(env, agent)
    assert info["end_reason"] == "answer"
    first, second = (r["body"] for r in server.requests)
    # tools described once: in `tools`, not as <tool_call> instructions in the system prompt
    assert [t["function"]["name"] for t in first["tools"]] == ["image_zoom_in", "ground"]
    system = first["messages"][0]
    assert system["role"] == "system" and "<tools>" not in system["content"] and "<tool_call>" not in system["content"]
    assert "\\boxed" in system["content"]  # the answer protocol stays
    # sampling fields only when set
    assert not {"temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop"} & set(first)
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]
    assistant, zoom_result, ground_result, images = second["messages"][2:]
    assert assistant["content"] == "Let me look." and "small, zoom in" not in json.dumps(assistant)  # reasoning not sent back
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in assistant["tool_calls"]] \
        == [ZOOM, GROUND]
    assert zoom_result["tool_call_id"] == "call_zoom_7" and zoom_result["content"].startswith("[image_zoom_in]")
    assert "[ground]" not in zoom_result["content"]
    assert ground_result["tool_call_id"] == "call_ground_8" and ground_result["content"].startswith("[ground]")
    # the crop goes as an image_url part of a user message after every tool message
    assert [p["type"] for p in images["content"]] == ["image_url", "text"]
    assert images["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    # the env saw the calls (ids ride along in the <tool_call> JSON, ignored by its parser)
    turn = conv.messages[2]["content"]
    assert turn.startswith("<think>small, zoom in</think>") and '"id": "call_zoom_7"' in turn


def test_tool_role_observations_give_the_same_messages(fake):
    server, url = fake
    server.script = [completion(None, [ZOOM]), completion("\\boxed{no}")]
    e = MedVQAEnv(tools=TOOLS, reward=RuleReward(), max_turns=2, observation_style="tool_role")
    agent = OpenAIAgent(url, model="m", api_key_env=None)
    play(e, agent, observation_style="tool_role")
    e.close()
    messages = server.requests[1]["body"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[2]["content"] is None and messages[3]["tool_call_id"] == "call_zoom_7"
    assert messages[4]["content"][0]["type"] == "image_url"


def test_a_server_without_tool_parsing_works_with_text_calls(fake, env):
    server, url = fake  # the model writes Hermes text; the server does not parse it into tool_calls
    server.script = [completion('<tool_call>{"name": "ground", "arguments": {"text": "lesion"}}</tool_call>'),
                     completion("\\boxed{yes}")]
    play(env, OpenAIAgent(url, model="m", api_key_env=None))
    messages = server.requests[1]["body"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "<tool_call>" in messages[2]["content"] and "tool_calls" not in messages[2]
    assert "[ground]" in messages[3]["content"][-1]["text"]  # the result as the env wrote it


def test_text_protocol_sends_no_tools_and_keeps_the_envs_prompt(fake, env):
    server, url = fake
    server.script = [completion(None, [GROUND]), completion("\\boxed{yes}")]
    conv, _ = play(env, OpenAIAgent(url, model="m", api_key_env=None, tool_protocol="text"))
    first, second = (r["body"] for r in server.requests)
    assert "tools" not in first and "<tools>" in first["messages"][0]["content"]
    assert '"id"' not in conv.messages[2]["content"]  # a text history has no ids
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]


# ---- parameters ------------------------------------------------------------------------------
def test_set_sampling_fields_are_sent_and_the_token_limit_takes_the_models_name(fake, env):
    server, url = fake
    server.script = [completion("\\boxed{yes}"), completion("\\boxed{yes}")]
    play(env, OpenAIAgent(url, model="m", api_key_env=None, temperature=0.0, top_p=0.9, seed=3, max_tokens=64))
    assert {k: server.requests[0]["body"][k] for k in ("temperature", "top_p", "seed", "max_tokens")} == \
        {"temperature": 0.0, "top_p": 0.9, "seed": 3, "max_tokens": 64}
    play(env, OpenAIAgent(url, model="o3-mini", api_key_env=None, max_tokens=64))
    assert server.requests[1]["body"]["max_completion_tokens"] == 64 and "max_tokens" not in server.requests[1]["body"]


def test_a_rejected_parameter_is_dropped_retried_once_and_named(fake, env, caplog):
    server, url = fake
    reject_temperature = (400, {"error": {"message": "Unsupported value: 'temperature' does not support 0.0 with this "
                                          "model. Only the default (1) value is supported.",
                                          "type": "invalid_request_error", "param": "temperature"}}, 0)
    reject_max_tokens = (400, {"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this "
                                         "model. Use 'max_completion_tokens' instead.", "param": "max_tokens"}}, 0)
    server.script = [reject_temperature, reject_max_tokens, completion("\\boxed{yes}"), completion("\\boxed{no}"),
                     reject_temperature, reject_temperature]
    agent = OpenAIAgent(url, model="reasoner", api_key_env=None, temperature=0.0, max_tokens=32)
    with caplog.at_level(logging.WARNING, logger="agents.openai_agent"):
        conv = Conversation.start(*env.reset(options={"index": 0}))
        assert agent.act(conv) == "\\boxed{yes}"  # after one retry per rejected parameter
        assert agent.act(conv) == "\\boxed{no}"
        stubborn = OpenAIAgent(url, model="reasoner", api_key_env=None, temperature=0.0, retries=0)
        with pytest.raises(EndpointError, match="HTTP 400"):  # rejected again without it: the error stands
            stubborn.act(conv)
    assert len(server.requests) == 6
    sent = [r["body"] for r in server.requests[:4]]
    assert "temperature" in sent[0] and "temperature" not in sent[1]
    assert "max_tokens" in sent[1] and sent[2]["max_completion_tokens"] == 32 and "max_tokens" not in sent[2]
    assert "temperature" not in sent[3] and sent[3]["max_completion_tokens"] == 32  # remembered
    text = caplog.text
    assert "rejected 'temperature'" in text and "rejected 'max_tokens'" in text and "'max_completion_tokens'" in text
    assert set(agent.usage()["dropped_parameters"]) == {"temperature"}


def test_a_server_that_rejects_tools_switches_to_the_text_protocol(fake, env, caplog):
    server, url = fake  # what a pydantic server with extra="forbid" (our SmolLM2 server) answers
    server.script = [(422, {"detail": [{"type": "extra_forbidden", "loc": ["body", "tools"],
                                        "msg": "Extra inputs are not permitted"}]}, 0), completion("\\boxed{yes}")]
    agent = OpenAIAgent(url, model="m", api_key_env=None)
    with caplog.at_level(logging.WARNING, logger="agents.openai_agent"):
        play(env, agent)
    assert "tools" in server.requests[0]["body"] and "tools" not in server.requests[1]["body"]
    assert "<tools>" in server.requests[1]["body"]["messages"][0]["content"]
    assert agent.tool_protocol == "text" and "switching to tool_protocol='text'" in caplog.text


# ---- what is recorded ------------------------------------------------------------------------
def test_the_resolved_model_the_served_model_and_tokens_are_recorded(fake, tmp_path):
    from eval.runner import EvalConfig, evaluate
    from medvqa_env.datasets import load_dataset

    server, url = fake
    server.script = [lambda body: completion("\\boxed{yes}", usage=(100, 7), model="org/served-model-1@rev")] * 3
    agent = OpenAIAgent(url, api_key_env=None, concurrency=1)  # no model given: GET /models decides
    summary = evaluate(agent, load_dataset("embedded", split="test"),
                       EvalConfig(limit=3, workers=0, open_metrics=False, progress=False, bootstrap=0, tools=TOOLS),
                       out_dir=tmp_path / "run")
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["agent"]["model"] == "served-model-1" and server.gets == ["/v1/models"]
    assert run["agent_usage"]["served_models"] == {"org/served-model-1@rev": 3}
    assert run["agent_usage"]["total_tokens"] == 321 and run["agent_usage"]["requests"] == 3
    rows = [json.loads(x) for x in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert [r["usage"] for r in rows] == [{"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107,
                                           "requests": 1}] * 3
    assert summary.usage["total_tokens"] == 321 and summary.usage["mean_per_episode"]["completion_tokens"] == 7
    report = (tmp_path / "run" / "report.md").read_text()
    assert "`served-model-1` (the server reported `org/served-model-1@rev` in 3 responses)" in report
    assert "300 prompt + 21 completion = 321 in 3 requests over 3 episodes" in report
    # another model on the same URL is another run: a resume refuses to mix them
    server.models = ["served-model-2"]
    from medvqa_env.errors import ConfigError

    with pytest.raises(ConfigError, match="differs in \\['agent'\\]"):
        evaluate(OpenAIAgent(url, api_key_env=None), load_dataset("embedded", split="test"),
                 EvalConfig(limit=3, workers=0, open_metrics=False, progress=False, bootstrap=0, tools=TOOLS),
                 out_dir=tmp_path / "run")


# ---- transport -------------------------------------------------------------------------------
def test_retries_honour_status_codes_and_send_the_key(fake, env, monkeypatch):
    server, url = fake
    server.script = [(503, {"error": "busy"}, 0), (429, {"error": "slow down"}, 0), completion("\\boxed{yes}")]
    monkeypatch.setenv(KEY_VAR, KEY)
    agent = OpenAIAgent(url, model="m", api_key_env=KEY_VAR, retries=2, backoff_s=0.01)
    assert agent.act(Conversation.start(*env.reset(options={"index": 0}))) == "\\boxed{yes}"
    assert agent.stats["retries"] == 2 and len(server.requests) == 3
    assert server.requests[-1]["auth"] == f"Bearer {KEY}"


def test_timeouts_and_dead_servers_raise_clear_errors_after_retries(fake):
    server, url = fake
    server.script = [completion("x")[:2] + (1.0,), completion("x")[:2] + (1.0,)]
    conv = Conversation.start({"text": "Question: hi?", "images": ()}, {})
    agent = OpenAIAgent(url, model="m", timeout_s=0.2, retries=1, backoff_s=0.01)
    with pytest.raises(EndpointError, match="after 2 attempts: timed out") as e:
        agent.act(conv)
    assert e.value.attempts == 2
    dead = OpenAIAgent(f"http://127.0.0.1:{_free_port()}/v1", model="m", retries=1, backoff_s=0.01)
    with pytest.raises(EndpointError, match="connection failed"):
        dead.act(conv)


def test_act_batch_keeps_order_under_concurrency(fake):
    server, url = fake
    server.script = [(200, {"choices": [{"message": {"content": f"\\boxed{{{i}}}"}}]}, 0.05 * (3 - i)) for i in range(3)]
    convs = [Conversation.start({"text": f"Question: {i}?", "images": ()}, {}) for i in range(3)]
    agent = OpenAIAgent(url, model="m", concurrency=3)
    turns = agent.act_batch(convs)
    order = [r["body"]["messages"][0]["content"][0]["text"] for r in server.requests]
    assert sorted(turns) == ["\\boxed{0}", "\\boxed{1}", "\\boxed{2}"]
    # each turn went back to the conversation that asked for it, whatever the arrival order
    assert [turns[int(o.split()[1][0])] for o in order] == [f"\\boxed{{{k}}}" for k in range(3)]


def test_bad_responses_and_arguments():
    with pytest.raises(EndpointError, match="choices"):
        response_to_turn({"error": "x"})
    with pytest.raises(ValueError, match="http"):
        OpenAIAgent("localhost:8000")
    with pytest.raises(ValueError, match="tool_protocol"):
        OpenAIAgent(tool_protocol="hermes")
    conv = Conversation.start({"text": "Q?", "images": ()}, {})
    with pytest.raises(ValueError, match="tool_protocol"):
        to_openai_messages(conv, tool_protocol="xml")


# ---- the SmolLM2 OpenAI server (a real model behind our own server) --------------------------
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


@pytest.mark.slow
def test_episodes_through_the_real_smollm2_server(smollm2_server, episodes, monkeypatch, caplog):
    monkeypatch.setenv(KEY_VAR, KEY)
    agent = OpenAIAgent(smollm2_server, api_key_env=KEY_VAR, max_tokens=24, temperature=0.0, concurrency=2)
    env = MedVQAEnv(reward=RuleReward(), max_turns=1)
    with caplog.at_level(logging.WARNING, logger="agents.openai_agent"):
        results = episodes(env, agent, [0, 1])
    assert agent.config()["model"] == "smollm2-135m-instruct"
    assert all(r["end_reason"] in ("answer", "max_turns") for r in results)
    assert all(isinstance(a, str) and a for r in results for a in r["actions"])
    usage = agent.usage()
    assert usage["completion_tokens"] > 0 and usage["retries"] == 0
    assert usage["served_models"] == {"smollm2-135m-instruct": usage["requests"]}
    # our SmolLM2 server has no tool calling and refuses `tools`: the agent said so and wrote text calls
    assert agent.tool_protocol == "text" and caplog.text.count("rejected 'tools'") == 1
    agent.close()


def test_a_wrong_key_fails_at_once_without_leaking_it(smollm2_server, monkeypatch):
    monkeypatch.setenv(KEY_VAR, "sk-wrong-key-456")
    agent = OpenAIAgent(smollm2_server, model="m", api_key_env=KEY_VAR, retries=3, backoff_s=5)
    conv = Conversation.start({"text": "Question: hi?", "images": ()}, {"system_prompt": "Be brief."})
    with pytest.raises(EndpointError, match="HTTP 401") as e:
        agent.act(conv)
    assert e.value.attempts == 1 and e.value.status == 401
    assert "sk-wrong" not in str(e.value) and "sk-wrong" not in repr(agent) and "sk-wrong" not in str(agent.config())


def test_a_parameter_rejected_by_concurrent_requests_is_warned_once_and_recorded_as_not_sent(fake, tmp_path, caplog):
    """Four requests in flight all rejected for ``temperature``: one warning, not four; the run's
    recorded agent config holds what was sent (no temperature; it is under dropped_parameters),
    and the same command resumes the finished run instead of calling it another setup."""
    from eval.runner import EvalConfig, evaluate
    from medvqa_env.datasets import load_dataset

    server, url = fake
    lock = threading.Lock()

    def answer(body):
        with lock:
            if "temperature" in body:
                return (400, {"error": {"message": "Unsupported value: 'temperature' does not support 0.0 with this "
                                                   "model.", "param": "temperature"}}, 0.2)  # all four arrive first
        return completion("\\boxed{yes}")

    server.script = [answer] * 8
    config = EvalConfig(limit=4, workers=0, open_metrics=False, progress=False, bootstrap=0, tools="none",
                        batch_size=4)
    dataset = load_dataset("embedded", split="test")
    with caplog.at_level(logging.WARNING, logger="agents.openai_agent"):
        evaluate(OpenAIAgent(url, model="m", api_key_env=None, temperature=0.0, concurrency=4), dataset, config,
                 out_dir=tmp_path / "run")
    assert sum(r["body"].get("temperature") == 0.0 for r in server.requests) == 4  # the four concurrent ones
    assert caplog.text.count("rejected 'temperature'") == 1
    agent = json.loads((tmp_path / "run" / "run.json").read_text())["agent"]
    assert "temperature" not in agent and agent["dropped_parameters"]["temperature"]["requested"] == 0.0
    evaluate(OpenAIAgent(url, model="m", api_key_env=None, temperature=0.0, concurrency=4), dataset, config,
             out_dir=tmp_path / "run")  # a resume: the same request, nothing left to run


# ---- issue 41 item 6: a long wait says what it waits for; settings shown as sent -------------------
def test_eval_run_prints_the_generation_settings_as_each_request_sends_them(fake, tmp_path, capsys):
    """Before: ``decoding: greedy, max_new_tokens=None (None)`` although ``max_tokens=48`` was set."""
    from eval.run import main

    server, url = fake
    server.script = [completion("\\boxed{yes}")] * 2
    assert main(["--agent", "openai", "--agent-opt", f"base_url={url}", "--agent-opt", "model=m",
                 "--agent-opt", "max_tokens=48", "--agent-opt", "temperature=0", "--agent-opt", "api_key_env=null",
                 "--dataset", "embedded", "--limit", "2", "--workers", "0", "--tools", "none", "--out",
                 str(tmp_path / "run"), "--no-open-metrics", "--no-progress", "--bootstrap", "0"]) == 0
    err = capsys.readouterr().err
    assert f"generation settings, as each request to {url} will send them: model='m', temperature=0, max_tokens=48" \
        in err, err
    assert "None (None)" not in err
    body = server.requests[0]["body"]
    assert (body["model"], body["temperature"], body["max_tokens"]) == ("m", 0, 48)


def test_a_slow_endpoint_is_never_a_silent_wait(fake, capsys):
    """Before: the agent sat at 0/N for minutes with no word."""
    server, url = fake
    server.script = [(200, completion("\\boxed{yes}")[1], 1.2)] * 2
    agent = OpenAIAgent(url, model="m", api_key_env=None, wait_note_s=0.3, concurrency=2)
    convs = [Conversation.start({"text": "Is it normal?", "images": ()}, {"answer_type": "CLOSED"}) for _ in range(2)]
    assert agent.act_batch(convs) == ["\\boxed{yes}"] * 2
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("openai agent: waiting for")]
    assert notes and notes[0].startswith(f"openai agent: waiting for {url} (model m): 0 of 2 answers after "), notes
    assert "timeout_s=60 per attempt, retries=3" in notes[0]
    quiet = OpenAIAgent(url, model="m", api_key_env=None, wait_note_s=0)  # 0: says nothing
    server.script = [(200, completion("\\boxed{no}")[1], 0.5)]
    assert quiet.act_batch(convs[:1]) == ["\\boxed{no}"]
    assert "waiting for" not in capsys.readouterr().err
