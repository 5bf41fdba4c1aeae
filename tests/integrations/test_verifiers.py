"""MedVQA-v0 as a verifiers 0.4 environment (train/verifiers_env.py; verifiers lives in
.venv-integrations: scripts/setup_integrations.sh): verifiers' own loader builds it, its tasks carry
the env's system prompt, question and image (pixel-equal through the image_url data URL), and
verifiers' own eval runner, driving the project's OpenAI-compatible server over SmolLM2, gives the
same per-question reward (and the same replies) as ``eval.run`` on the same questions."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image

vf = pytest.importorskip("verifiers.v1", reason="verifiers lives in .venv-integrations (scripts/setup_integrations.sh)")

import medvqa_env  # noqa: F401,E402
from integration_helpers import subprocess_env  # noqa: E402
from train.verifiers_env import REWARD_NAME, TASKSET_ID, load_environment  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
INDICES = [0, 1]  # the first two test questions (MCQ, CLOSED), as eval.run --limit 2 picks them


def decode(url: str) -> np.ndarray:
    head, _, data = url.partition(",")
    assert head == "data:image/png;base64"
    with Image.open(io.BytesIO(base64.b64decode(data))) as im:
        return np.array(im.convert("RGB"))


def test_load_environment_gives_the_env_prompt_and_images():
    env = load_environment(indices=INDICES)
    assert isinstance(env, vf.Env) and type(env).__name__ == "MedVQAVerifiersEnv"
    tasks = list(env.taskset)
    assert [t.data.info["index"] for t in tasks] == INDICES
    ref = gym.make("MedVQA-v0")
    for task, index in zip(tasks, INDICES):
        obs, info = ref.reset(seed=0, options={"index": index})
        assert task.data.system_prompt == info["system_prompt"] and task.data.id == info["record_id"]
        (message,) = task.data.prompt
        parts = message.content
        assert parts[-1].text == obs["text"]
        images = [decode(p.image_url.url) for p in parts[:-1]]
        assert len(images) == len(obs["images"]) == 1
        assert all(np.array_equal(a, b) for a, b in zip(images, obs["images"]))


def _python_with_smollm2() -> str:
    """The interpreter that can serve SmolLM2 (its GGUF package is in the main venv)."""
    main = REPO / ".venv" / "bin" / "python"
    return str(main) if main.exists() else sys.executable


@pytest.fixture(scope="module")
def smollm2_server():
    import time

    import httpx

    from integration_helpers import Served, free_port

    port = free_port()
    env = subprocess_env(MEDVQA_CACHE=os.environ.get("MEDVQA_TEST_LLM_CACHE", str(Path.home() / ".cache" / "medvqa-gym")))
    served = Served(["-m", "agents.openai_server", "--port", str(port), "--torch-threads", "1"], port, env=env,
                    python=_python_with_smollm2()).wait(300)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the port may open before the model is loaded
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    yield f"http://127.0.0.1:{port}/v1"
    served.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vf_eval_of_smollm2_scores_what_eval_run_scores(smollm2_server, tmp_path):
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig

    os.environ.setdefault("MEDVQA_TEST_KEY", "unused")  # the server needs no key; verifiers' client wants one
    config = EvalConfig(env={"taskset": {"id": TASKSET_ID, "indices": INDICES}}, model="smollm2-135m-instruct",
                        client={"base_url": smollm2_server, "api_key_var": "MEDVQA_TEST_KEY"},
                        sampling={"temperature": 0.0, "max_tokens": 8}, num_rollouts=1, max_concurrent=1,
                        rich=None, run={"dir": str(tmp_path / "vf")})
    episodes = asyncio.run(run_eval(config))
    vf_rows = {}
    for episode in episodes:
        assert episode.ok, episode.errors
        (trace,) = episode.traces
        replies = [n.message.content for n in trace.nodes if n.message.role == "assistant"]
        vf_rows[trace.task.data.id] = (trace.rewards[REWARD_NAME].score, replies, trace.info["medvqa"])

    out = tmp_path / "eval_run"
    cmd = [sys.executable, "-m", "eval.run", "--agent", "openai", "--agent-opt", f"base_url={smollm2_server}",
           "--agent-opt", "api_key_env=MEDVQA_TEST_KEY", "--agent-opt", "temperature=0", "--agent-opt", "max_tokens=8",
           "--agent-opt", "tool_protocol=text", "--dataset", "embedded", "--split", "test", "--limit", str(len(INDICES)),
           "--reward", "default", "--workers", "0", "--bootstrap", "0", "--no-progress", "--max-error-rate", "1.0",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(MEDVQA_TEST_KEY="unused"), capture_output=True, text=True,
                          timeout=600)
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines() if line.strip()]
    assert rows, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_rows = {r["record_id"]: r for r in rows}
    assert sorted(run_rows) == sorted(vf_rows)
    for record_id, (score, replies, info) in vf_rows.items():
        row = run_rows[record_id]
        assert score == pytest.approx(row["reward"]), (record_id, score, row["reward"])
        assert info["answer"] == row.get("answer") and info["end_reason"] == row.get("end_reason")
        assert replies and replies == [t["action"] for t in row["trace"]][: len(replies)], (replies, row["trace"])
