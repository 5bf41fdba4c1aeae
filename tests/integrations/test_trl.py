"""TRL's own GRPOTrainer with ``environment_factory`` and image-returning tools, end to end on a tiny
randomly-initialised Qwen2-VL: the prompt carries the question's image, the policy's tool call runs
the env's ``image_zoom_in`` (through ``train.trl_hook.environment_class(..., images=True)``), the
crop comes back as an image block, TRL feeds both through the Qwen2-VL processor to the model
(asserted on the vision tower's pixel values, against the processor applied to ``gym.make``'s own
question image and tool image), and the reward is the env's episode return (equal to
``gym.make``'s on the same record and turns).

The random model cannot choose to call a tool, so its turns are scripted with generation's own
``sequence_bias`` (TRL's ``generation_kwargs``): every token is still sampled by ``generate`` inside
TRL, the tool call is parsed by TRL's response parser, run by TRL's tool loop, and trained on.

Needs ``jmespath`` (TRL's tool parser below transformers 5.13): in .venv-integrations
(scripts/setup_integrations.sh), not in the main venv."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("trl")
pytest.importorskip("jmespath", reason="TRL's tool-calling GRPO needs jmespath below transformers 5.13 "
                                       "(in .venv-integrations: scripts/setup_integrations.sh)")

import medvqa_env  # noqa: F401,E402
from train.trl_hook import EpisodeReward, environment_class, prompt_dataset  # noqa: E402

ENV = {"dataset": "embedded", "split": "test", "tools": {"image_zoom_in": "local"}, "reward": "rule"}
INDEX = 1  # "Is there a lesion in the left kidney?" (CLOSED): rule reward +-1
BBOX = [40, 60, 140, 160]
CALL_TEXT = '<tool_call>\n{"name": "image_zoom_in", "arguments": {"bbox": %s}}\n</tool_call><|im_end|>' % json.dumps(BBOX)
ANSWER_TEXT = "\\boxed{no}<|im_end|>"


def tiny_qwen2_vl():
    """The project's tiny Qwen2-VL (agents.models) with a Qwen2-VL processor TRL can drive: the PIL
    image processor (no torchvision), a video processor that is never used, and TRL's Qwen3-VL chat
    template (it renders tools, tool calls and image blocks in tool messages; TRL knows its parser)."""
    from transformers import Qwen2VLProcessor
    from transformers.video_processing_utils import BaseVideoProcessor
    from trl.chat_template_utils import qwen3_vl_chat_template

    from agents.models import build_tiny_vlm

    class ImageOnlyProcessor(Qwen2VLProcessor):  # without torchvision transformers' video class is a dummy
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name != "video_processor":
                return super().check_argument_for_proper_class(argument_name, argument)
            return type(argument)

    model, encoder = build_tiny_vlm("tiny-qwen2-vl", seed=0)
    tok = encoder.tokenizer
    tok.padding_side = "left"
    tok.chat_template = qwen3_vl_chat_template
    processor = ImageOnlyProcessor(image_processor=encoder.image_processor, tokenizer=tok,
                                   video_processor=BaseVideoProcessor(), chat_template=qwen3_vl_chat_template)
    return model, processor


def scripted_turns(tok) -> dict:
    """``sequence_bias`` entries that make ``generate`` write CALL_TEXT after the prompt and
    ANSWER_TEXT after a tool response (the longer context's bias wins where both match)."""
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    turns = [(ids("<|im_end|>\n<|im_start|>assistant\n"), ids(CALL_TEXT)),
             (ids("</tool_response><|im_end|>\n<|im_start|>assistant\n"), ids(ANSWER_TEXT))]
    bias = {}
    for context, text in turns:
        for k in range(1, len(text) + 1):
            bias[tuple(context + text[:k])] = 10.0 * (len(context) + k)
    return bias


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grpo_step_with_image_returning_env_tools_on_a_tiny_qwen2_vl(tmp_path):
    import torch
    from PIL import Image
    from trl import GRPOConfig, GRPOTrainer

    model, processor = tiny_qwen2_vl()
    seen, backward = [], []  # what the vision tower received (generation and loss forwards); its gradients

    def look(module, args, kwargs, output):
        seen.append((args[0].detach().clone(), kwargs["grid_thw"].clone(), torch.is_grad_enabled()))
        features = getattr(output, "pooler_output", output)
        if isinstance(features, torch.Tensor) and features.requires_grad:
            features.register_hook(lambda grad: backward.append(tuple(grad.shape)))

    model.model.visual.register_forward_hook(look, with_kwargs=True)
    data = prompt_dataset(ENV, indices=[INDEX], images=True)  # the question's image in the user turn
    reward = EpisodeReward()
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=512, max_steps=1, learning_rate=1e-2, logging_steps=1,
                      save_strategy="no", report_to=[], use_cpu=True, seed=0, temperature=1.0, beta=0.0,
                      gradient_checkpointing=False, dataloader_num_workers=0, max_tool_calling_iterations=2,
                      generation_kwargs={"sequence_bias": scripted_turns(processor.tokenizer)})
    trainer = GRPOTrainer(model=model, processing_class=processor, reward_funcs=reward, train_dataset=data,
                          args=args, environment_factory=environment_class(ENV, images=True))
    trainer.train()

    # the same record and turns through gym.make: its tool image and its episode return
    env = gym.make("MedVQA-v0", **ENV)
    first, _ = env.reset(seed=0, options={"index": INDEX})
    call = json.dumps({"name": "image_zoom_in", "arguments": {"bbox": BBOX}})
    obs, r1, *_ = env.step(f"<tool_call>{call}</tool_call>")
    _, r2, terminated, _, info = env.step("\\boxed{no}")
    assert terminated and len(obs["images"]) == 1 and len(first["images"]) == 1
    crop = Image.fromarray(obs["images"][0])
    want = processor.image_processor(images=[crop], return_tensors="pt")
    question = processor.image_processor(images=[Image.fromarray(first["images"][0])], return_tensors="pt")

    # both rollouts called the tool, got the env's image back, answered; the reward is the env's
    assert reward.calls == [[r1 + r2] * 2], (reward.calls, r1 + r2, info["reward_components"])
    logged = trainer.state.log_history[0]
    assert float(logged["rewards/medvqa_episode/mean"]) == pytest.approx(r1 + r2)
    assert float(logged["tools/call_frequency"]) > 0 and float(logged["tools/failure_frequency"]) == 0
    # the question's image and then the env's crop, through the processor, are what the vision tower
    # saw: the question images at the first generation, question + crop after the tool call
    # (generation, no grad) and in the loss forward (grad), which backpropagated through them
    assert {grad for *_, grad in seen} == {False, True}, [(tuple(p.shape), grad) for p, _, grad in seen]
    kinds = []
    for pixels, grid, _ in seen:
        for chunk, g in zip(torch.split(pixels, [int(g.prod()) for g in grid]), grid):
            if chunk.shape == want["pixel_values"].shape and torch.equal(chunk, want["pixel_values"]):
                kinds.append("crop")
                assert torch.equal(g, want["image_grid_thw"][0])
            else:
                assert torch.equal(chunk, question["pixel_values"]), "an image that is not the env's reached the model"
                kinds.append("question")
    assert kinds.count("crop") >= 4 and kinds.count("question") >= 6, kinds  # 2 rollouts x (generate, loss)
    assert backward, "the tool image's features were not in the loss's graph"
    assert np.array_equal(np.asarray(crop), obs["images"][0])
