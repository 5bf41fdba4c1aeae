"""A tool server that stalls or dies mid-episode: the env gets an error observation within the
client's deadline and the episode goes on. Real server subprocesses, real signals."""

from __future__ import annotations

import threading

import pytest

from medvqa_env.env import MedVQAEnv
from medvqa_env.records import VQADataset
from rewards import RuleReward

SEGMENT_TURN = '<tool_call>{"name": "segment", "arguments": {"bbox": [36, 46, 65, 75]}}</tool_call>'
ZOOM_TURN = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [36, 46, 65, 75]}}</tool_call>'


@pytest.fixture(scope="module")
def servers(start_server):
    procs = [start_server(["serve", "--tools", "segment"], wait=False) for _ in range(2)]
    return [p.wait() for p in procs]


def make_env(scene, url):
    tools = {"segment": {"url": url, "timeout_s": 2.0, "retries": 2, "backoff_s": 0.05}, "image_zoom_in": "local"}
    env = MedVQAEnv(VQADataset([scene.record]), tools=tools, reward=RuleReward())
    env.reset(options={"index": 0})
    return env


@pytest.mark.timeout(60)
def test_an_episode_with_a_remote_segment(servers, scene):
    env = make_env(scene, servers[0].url)
    obs, reward, terminated, truncated, info = env.step(SEGMENT_TURN)
    assert info["tool_calls"][0]["error"] is None and "connected component" in obs["text"] and len(obs["images"]) == 1
    _, reward, terminated, _, info = env.step("\\boxed{yes}")
    assert terminated and reward == 1.0 and info["correct"]
    env.close()


@pytest.mark.timeout(60)
def test_a_stalled_server_times_out_and_the_episode_continues(servers, scene):
    server = servers[0]  # paused, then resumed
    env = make_env(scene, server.url)
    server.pause()
    try:
        obs, _, terminated, truncated, info = env.step(SEGMENT_TURN)
    finally:
        server.resume()
    assert not (terminated or truncated)
    assert "timed out after 2 s" in info["tool_calls"][0]["error"] and "timed out" in obs["text"]
    obs, _, _, _, info = env.step(SEGMENT_TURN)  # the server is back: the same call now works
    assert info["tool_calls"][0]["error"] is None
    _, reward, terminated, _, _ = env.step("\\boxed{yes}")
    assert terminated and reward == 1.0
    env.close()


@pytest.mark.timeout(60)
def test_a_server_that_dies_mid_call_gives_an_error_observation(servers, scene):
    server = servers[1]  # killed
    env = make_env(scene, server.url)
    server.pause()  # the call is in flight when the process is killed
    killer = threading.Timer(0.5, server.proc.kill)
    killer.start()
    obs, _, terminated, _, info = env.step(SEGMENT_TURN)
    killer.join()
    server.proc.wait()
    error = info["tool_calls"][0]["error"]
    assert not terminated and "segment" in error and ("unavailable" in error or "timed out" in error)
    obs, _, _, _, info = env.step(SEGMENT_TURN + ZOOM_TURN)  # dead server: refused at once, local tools still work
    errors = [c["error"] for c in info["tool_calls"]]
    assert "could not reach" in errors[0] and errors[1] is None
    _, reward, terminated, _, _ = env.step("\\boxed{yes}")
    assert terminated and reward == 1.0
    env.close()


@pytest.mark.timeout(60)
def test_a_pickled_env_reconnects_to_its_tool_server(servers, scene):
    import pickle

    env = make_env(scene, servers[0].url)
    env.step(SEGMENT_TURN)
    copy = pickle.loads(pickle.dumps(env))  # what Ray does when it ships an env to a worker
    copy.reset(options={"index": 0})
    _, _, _, _, info = copy.step(SEGMENT_TURN)
    assert info["tool_calls"][0]["error"] is None
    env.close(), copy.close()


def test_a_dead_server_at_make_time_tells_a_person_what_failed_and_what_to_check(scene):
    """The ConfigError a person reads names the URL, what failed and what to check -- not the
    advice meant for the model ("Try another tool or answer without it"), which stays in the
    observation when a server dies mid-episode (above)."""
    import socket

    from medvqa_env.errors import ConfigError

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(ConfigError) as e:
        MedVQAEnv(VQADataset([scene.record]), tools={"segment": {"url": url, "retries": 1, "backoff_s": 0.01}})
    message = str(e.value)
    assert url in message and "ConnectionRefusedError" in message and "2 attempts" in message
    assert f"medvqa-tools serve --tools segment --port {port}" in message and f"{url}/health" in message
    assert "answer without it" not in message and "Try another tool" not in message
