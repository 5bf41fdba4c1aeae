"""The warm start is chosen by what RL will use (issue 42), on a case like CLOSED build 2: one
candidate cannot read the tool, the other can, and greedily both answer without calling it -- the
one that cannot read is a question ahead on greedy val accuracy. Probed through the real env and
the real ``ground`` tool (its oracle engine), the forced-call figure tells them apart and the
choice is the reader; choosing by greedy accuracy (the protocol before issue 42) picks the other."""

from __future__ import annotations

import os

import pytest

from agents.models import load_policy
from medvqa_env.datasets import load_dataset
from medvqa_env.pool import EnvPool
from train import protocol
from train.common import SHORT_SYSTEM_PROMPT, env_kwargs, select_indices
from train.probe import gold_calls, probe
from train.rollout import ScriptedGenerator

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _last_text(conv) -> str:
    content = conv.messages[-1]["content"]
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content if isinstance(p, dict))


def policy(encoder, constant: str, reads_tool: bool, calls_every: int = 0):
    """A scripted stand-in for a checkpoint: answers ``constant`` directly, or (``calls_every`` k)
    calls ``ground`` on every k-th question first; after a tool's answer it reads it (yes iff
    something was found) when ``reads_tool``, else answers ``constant`` anyway."""
    call = '<tool_call>{"name": "ground", "arguments": {"text": "lesion"}}</tool_call>'

    def script(conv):
        if conv.turns == 0:
            rid = conv.info["record_id"]
            return call if calls_every and sum(map(ord, rid)) % calls_every == 0 else f"\\boxed{{{constant}}}"
        if not reads_tool:
            return f"\\boxed{{{constant}}}"
        return "\\boxed{no}" if "Found nothing" in _last_text(conv) else "\\boxed{yes}"
    return ScriptedGenerator(encoder, script)


@pytest.fixture(scope="module")
def probed():
    indices = select_indices("embedded", "val", "CLOSED", limit=15)
    dataset = load_dataset("embedded", split="val")
    golds = [dataset[i].answer for i in indices]
    majority = max(("yes", "no"), key=golds.count)
    minority = "no" if majority == "yes" else "yes"
    assert golds.count(majority) > golds.count(minority)  # so greedy accuracy has a leader
    _, encoder, _ = load_policy("tiny-qwen2-vl", system_prompt=SHORT_SYSTEM_PROMPT)
    pool = EnvPool(env_kwargs("embedded", "val", "ground=oracle", 1), 15)
    try:
        calls = gold_calls(dataset, indices, pool.tool_names)
        blind = probe(policy(encoder, majority, False), policy(encoder, majority, False, calls_every=3),
                      encoder, pool, indices, calls, samples=2)
        reader = probe(policy(encoder, minority, True), policy(encoder, minority, True, calls_every=3),
                       encoder, pool, indices, calls, samples=2)
    finally:
        pool.close()
    return {50: blind, 150: reader}


def test_the_probe_sees_which_checkpoint_reads_the_tool(probed):
    blind, reader = probed[50], probed[150]
    assert blind["greedy"] > reader["greedy"]                       # greedy: the blind one is ahead
    assert blind["greedy_call_rate"] == reader["greedy_call_rate"] == 0.0
    assert reader["forced_questions"] == blind["forced_questions"] == 15  # every question has a gold call
    assert reader["forced"] >= 0.9 and blind["forced"] == blind["greedy"]  # the oracle's answer read, or not
    assert reader["forced"] - 2 * reader["forced_se"] > blind["forced"]   # outside the val noise
    assert 0.0 < reader["call_rate"] < 1.0 and reader["calling"] > reader["direct"]  # a sampled call pays
    assert blind["calling"] <= blind["direct"] + 0.3 and reader["calling"] > blind["calling"]


def test_the_warm_start_is_the_checkpoint_that_reads_the_tool(probed):
    choice = protocol.choose_warm_start(probed)
    assert choice["chosen_step"] == 150
    assert choice["stages"][0]["measure"] == "forced" and choice["stages"][0]["kept"] == [150]
    # the greedy rule the protocol used before would have chosen the other one
    assert protocol.greedy_lead({s: p["greedy"] for s, p in probed.items()}, 15)["step"] == 50


def test_candidates_the_probe_cannot_tell_apart_go_to_the_latest():
    same = {"forced": 0.7, "forced_se": 0.03, "sampled": 0.6, "sampled_se": 0.03}
    choice = protocol.choose_warm_start({25: same, 100: {**same, "forced": 0.69}, 75: same})
    assert choice["chosen_step"] == 100 and choice["within_noise"]
    outside = protocol.choose_warm_start({25: same, 100: {**same, "sampled": 0.4}})  # sampled far below: out
    assert outside["chosen_step"] == 25 and not outside["within_noise"]
    with pytest.raises(ValueError, match="at least one"):
        protocol.choose_warm_start({})
