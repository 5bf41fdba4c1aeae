"""``eval.run`` on a trainer's checkpoint reproduces its training settings (issue 21): the agent
encodes a conversation into the very token ids and pixels the trainer's encoder made, the env gets
the checkpoint's tool turns and tools, and a flag that changes one is used and warned about."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from agents.models import load_policy
from medvqa_env.chat import Conversation
from medvqa_env.env import MedVQAEnv
from train import sft
from train.common import parse_args

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOOLS = "image_zoom_in,ground=oracle"
ZOOM = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 60, 60]}}</tool_call>'


def _train(policy, out):
    sft.main(parse_args(sft.Args, ["--policy", str(policy), "--answer-types", "CLOSED", "--eval-size", "2",
                                   "--max-new-tokens", "4", "--batch-size", "2", "--tools", TOOLS, "--steps", "1",
                                   "--max-turns", "1", "--no-tensorboard", "--out", str(out)]))
    return out / "final"


@pytest.fixture(scope="module")
def vlm_checkpoint(tmp_path_factory):
    return _train("tiny-qwen2-vl", tmp_path_factory.mktemp("vlm") / "sft")


def _conversation_with_a_tool_image():
    env = MedVQAEnv(tools=TOOLS, max_turns=1)
    obs, info = env.reset(options={"index": 1})
    conv = Conversation.start(obs, info)
    obs, *_ = env.step(ZOOM)
    conv.add_turn(ZOOM, obs)
    env.close()
    return conv


def test_a_vlm_checkpoint_is_encoded_as_the_trainer_encoded_it(vlm_checkpoint):
    from agents.vlm import VLMAgent

    conv = _conversation_with_a_tool_image()
    _, encoder, _ = load_policy(vlm_checkpoint)
    trained = encoder.conversation(conv)
    agent = VLMAgent(str(vlm_checkpoint), max_new_tokens=2, temperature=0.0)
    assert (agent.chat_format, agent.max_image_side) == ("chatml", 224)  # from medvqa_run.json, not 448
    batch = agent.encode([conv])
    assert batch["input_ids"][0].tolist() == trained.ids
    assert torch.equal(batch["pixel_values"].float(), trained.pixel_values)
    assert torch.equal(batch["image_grid_thw"], trained.image_grid_thw)
    # told another image size, the agent shows the model other pixels (and warns)
    other = VLMAgent(str(vlm_checkpoint), max_new_tokens=2, temperature=0.0, max_image_side=112)
    assert other.encode([conv])["input_ids"].shape[1] != len(trained.ids)


def test_a_text_checkpoint_is_encoded_as_the_trainer_encoded_it(tmp_path):
    from agents.text_llm import TextLLMAgent
    from train.verl_integration.tiny_policy import build

    build(tmp_path / "policy", kind="qwen2")
    ckpt = _train(tmp_path / "policy", tmp_path / "sft")
    conv = _conversation_with_a_tool_image()
    _, encoder, kind = load_policy(ckpt)
    agent = TextLLMAgent(str(ckpt), max_new_tokens=2, temperature=0.0)
    assert kind == "text" and agent.chat_format == "chatml" and agent.image_text == "<image>"
    assert agent.encode([conv])["input_ids"][0].tolist() == encoder.conversation(conv).ids


def _eval(ckpt, out, *flags):
    from eval.run import main

    return main(["--agent", "vlm", "--agent-opt", f"model={ckpt}", "--agent-opt", "max_new_tokens=3",
                 "--dataset", "embedded", "--limit", "2", "--workers", "0", "--no-open-metrics", "--no-progress",
                 "--bootstrap", "0", "--out", str(out), *flags])


def test_eval_run_takes_the_checkpoints_settings(vlm_checkpoint, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="eval.run"):
        assert _eval(vlm_checkpoint, tmp_path / "same", "--device", "cpu") == 0
    assert not [r for r in caplog.records if "differs from the checkpoint" in r.getMessage()]
    run = json.loads((tmp_path / "same" / "run.json").read_text())
    saved = json.loads((vlm_checkpoint / "medvqa_run.json").read_text())
    assert run["max_turns"] == 1 == saved["env"]["max_turns"]  # eval.run's own default is 3
    assert run["tools"] == saved["env"]["tools"] and set(run["tools"]) == {"image_zoom_in", "ground"}
    assert run["agent"]["chat_format"] == "chatml" and run["agent"]["max_image_side"] == 224


def test_a_flag_that_changes_a_trained_setting_is_used_and_warned_about(vlm_checkpoint, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert _eval(vlm_checkpoint, tmp_path / "other", "--max-turns", "2", "--tool-opt", "image_zoom_in.min_size=8",
                     "--agent-opt", "max_image_side=112") == 0
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "--max-turns 2 differs from the checkpoint's 1" in messages
    assert "--tools" in messages and "min_size" in messages  # a tool option changes the trained tools
    assert "max_image_side=112 differs from the 224 this checkpoint was trained with" in messages
    run = json.loads((tmp_path / "other" / "run.json").read_text())
    assert run["max_turns"] == 2 and run["tools"]["ground"]["engine"] == "oracle"  # trained tools + the option


def test_device_flag_and_agent_option_must_agree(vlm_checkpoint, tmp_path, capsys):
    assert _eval(vlm_checkpoint, tmp_path / "x", "--device", "cpu", "--agent-opt", "device=cuda") == 2
    assert "medvqa-eval: error: expected one device, got --device cpu and --agent-opt device=cuda" in capsys.readouterr().err


def test_a_trainers_prompt_override_travels_and_replacing_it_is_warned(tmp_path, caplog):
    from agents.vlm import VLMAgent
    from train.common import SHORT_SYSTEM_PROMPT

    sft.main(parse_args(sft.Args, ["--policy", "tiny-qwen2-vl", "--answer-types", "CLOSED", "--eval-size", "2",
                                   "--max-new-tokens", "4", "--batch-size", "2", "--tools", "ground=oracle",
                                   "--demo-prompt", "--steps", "1", "--no-tensorboard", "--out", str(tmp_path)]))
    saved = json.loads((tmp_path / "final" / "medvqa_run.json").read_text())
    assert saved["system_prompt_source"] == "override" and saved["system_prompt"] == SHORT_SYSTEM_PROMPT
    assert VLMAgent(str(tmp_path / "final"), max_new_tokens=2).system_prompt == SHORT_SYSTEM_PROMPT
    with caplog.at_level(logging.WARNING, logger="agents.text_llm"):
        agent = VLMAgent(str(tmp_path / "final"), max_new_tokens=2, system_prompt="Answer.")
    assert agent.system_prompt == "Answer." and "replaces the prompt this checkpoint was trained with" in caplog.text
