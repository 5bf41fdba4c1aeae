"""MedVQA-v0 through OpenEnv (openenv-core, in .venv-integrations: scripts/setup_integrations.sh):
the server the manifest names, on loopback in a subprocess, driven by OpenEnv's own WebSocket
client; OpenEnv's runtime validation passes; every observation (text and image pixels), reward and
info equal ``gym.make``'s on the same seed and index; a GRPO group of 8 sessions plays at once and
a 9th is refused with OpenEnv's capacity error."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("openenv", reason="openenv-core lives in .venv-integrations (scripts/setup_integrations.sh)")
yaml = pytest.importorskip("yaml")

import medvqa_env  # noqa: F401,E402
from integration_helpers import Served, free_port, subprocess_env  # noqa: E402
from medvqa_env.openenv_adapter import (MedVQAAction, MedVQAClient, gym_observation,  # noqa: E402
                                        json_info)

REPO = Path(__file__).resolve().parents[2]
ENV = {"dataset": "embedded", "split": "test",
       "tools": {"image_zoom_in": "local", "segment": {"engine": "classical"}}}
TOOL_TURN = ('<think>look closer</think><tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [40, 60, 140, 160]}}'
             '</tool_call><tool_call>{"name": "segment", "arguments": {"point": [90, 120]}}</tool_call>')
TIMING = ("latency_s", "cached")  # how long a tool took and whether a cache answered: not the episode


def comparable(info: dict) -> dict:
    """The info with the per-call timing and cache flags left out (they differ run to run)."""
    info = json_info(info)
    for call in info.get("tool_calls", []):
        for key in TIMING:
            call.pop(key, None)
    return info


@pytest.fixture(scope="module")
def server():
    manifest = yaml.safe_load((REPO / "openenv.yaml").read_text())
    assert manifest["runtime"] == "fastapi" and manifest["spec_version"] == 1
    port = free_port()
    env = subprocess_env(MEDVQA_OPENENV_ENV=json.dumps(ENV), MEDVQA_OPENENV_MAX_SESSIONS="8")
    served = Served(["-m", "uvicorn", manifest["app"], "--host", "127.0.0.1", "--port", str(port),
                     "--log-level", "warning"], port, env=env).wait(90)
    yield f"http://127.0.0.1:{port}"
    served.stop()


def gym_episode(seed: int, index: int, actions: list[str]):
    env = gym.make("MedVQA-v0", **ENV)
    out = [env.reset(seed=seed, options={"index": index})]
    for action in actions:
        out.append(env.step(action))
    env.close()
    return out


async def client_episode(url: str, seed: int, index: int, actions: list[str]):
    async with MedVQAClient(base_url=url) as client:
        out = [await client.reset(seed=seed, index=index)]
        for action in actions:
            out.append(await client.step(MedVQAAction(text=action)))
        return out, await client.state()


def assert_same_episode(got, want):
    (r0, *steps), ((obs0, info0), *gym_steps) = got, want
    assert_same_observation(gym_observation(r0.observation), obs0)
    assert r0.observation.info == json_info(info0)
    for result, (obs, reward, terminated, truncated, info) in zip(steps, gym_steps, strict=True):
        o = result.observation
        assert_same_observation(gym_observation(o), obs)
        assert (result.reward, o.terminated, o.truncated, result.done) == (reward, terminated, truncated,
                                                                            terminated or truncated)
        assert comparable(o.info) == comparable(info)


def assert_same_observation(got, want):
    assert got["text"] == want["text"]
    assert len(got["images"]) == len(want["images"])
    for a, b in zip(got["images"], want["images"]):
        assert a.dtype == b.dtype == np.uint8 and a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.timeout(180)
def test_openenv_validation_passes_and_an_episode_equals_gym_make(server):
    from openenv.cli._validation import validate_running_environment

    report = validate_running_environment(server, timeout_s=30)
    assert report["passed"], [c for c in report["criteria"] if not c["passed"]]
    assert report["mode"] == "simulation"

    actions = [TOOL_TURN, r"\boxed{no}"]
    got, state = asyncio.run(client_episode(server, seed=0, index=1, actions=actions))
    want = gym_episode(0, 1, actions)
    assert_same_episode(got, want)
    assert len(got[0].observation.images) == 1 and len(got[1].observation.images) == 2  # question image; crop + overlay
    final = got[-1].observation
    assert final.terminated and final.info["reward_components"] and final.info["ground_truth"]
    assert (state.index, state.turn, state.tool_turns, state.finished) == (1, 2, 1, True)
    assert state.record_id == want[0][1]["record_id"]


@pytest.mark.timeout(180)
def test_a_grpo_group_of_8_sessions_at_once_and_the_9th_is_refused(server):
    actions = [TOOL_TURN, r"\boxed{yes}"]

    async def group():
        clients = [MedVQAClient(base_url=server) for _ in range(8)]
        for c in clients:
            await c.connect()
        try:
            async def play(k: int, client: MedVQAClient):
                out = [await client.reset(seed=k, index=k)]
                for action in actions:
                    out.append(await client.step(MedVQAAction(text=action)))
                return out

            results = await asyncio.gather(*(play(k, c) for k, c in enumerate(clients)))
            # a 9th session: OpenEnv's server answers its connection with CAPACITY_REACHED and closes it
            from websockets.asyncio.client import connect

            async with connect(server.replace("http://", "ws://") + "/ws") as ws:
                refused = json.loads(await ws.recv())
            ninth = MedVQAClient(base_url=server)  # and OpenEnv's own client cannot play on it
            try:
                await ninth.reset(seed=0, index=0)
                refused["client"] = "played"
            except Exception as e:  # noqa: BLE001 - the connection is closed on it
                refused["client"] = type(e).__name__
            finally:
                await ninth.close()
            return results, refused
        finally:
            for c in clients:
                await c.close()

    results, refused = asyncio.run(group())
    assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED", refused
    assert refused["client"] != "played"
    for k, got in enumerate(results):
        assert_same_episode(got, gym_episode(k, k, actions))
    # the sessions are free again: a new one plays
    got, _ = asyncio.run(client_episode(server, seed=3, index=3, actions=[r"\boxed{no}"]))
    assert_same_episode(got, gym_episode(3, 3, [r"\boxed{no}"]))


@pytest.mark.timeout(120)
def test_bad_input_is_a_clear_error_and_the_server_keeps_serving(server):
    async def bad():
        errors = []
        async with MedVQAClient(base_url=server) as client:
            for send in (lambda: client.step(MedVQAAction(text=r"\boxed{no}")),  # before reset
                         lambda: client._send_and_receive({"type": "step", "data": {"txt": 1}}),  # not an action
                         lambda: client.reset(seed=0, index=10_000)):  # no such record
                try:
                    reply = await send()
                    errors.append(str(reply))
                except Exception as e:  # noqa: BLE001
                    errors.append(str(e))
        return errors

    before_reset, not_an_action, no_record = asyncio.run(bad())
    assert "before reset()" in before_reset
    assert "VALIDATION_ERROR" in not_an_action  # OpenEnv checks the action against MedVQAAction
    assert "expected an index in 0.." in no_record
    got, _ = asyncio.run(client_episode(server, seed=0, index=2, actions=[r"\boxed{CT}"]))
    assert_same_episode(got, gym_episode(0, 2, [r"\boxed{CT}"]))


def test_the_command_refuses_a_non_loopback_bind():
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "medvqa_env.openenv_adapter", "--host", "0.0.0.0", "--port", "1"],
                          cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "OpenEnv's protocol has no authentication" in proc.stderr
    assert "Traceback" not in proc.stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
