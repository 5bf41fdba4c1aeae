"""MedVQA-v0 as a verifiers environment (``pip install verifiers``; ``.venv-integrations``).

verifiers 0.4 (``verifiers.v1``) finds an environment as a taskset module that exports its
:class:`~verifiers.v1.Taskset`, :class:`~verifiers.v1.Env` and default
:class:`~verifiers.v1.Harness` through ``__all__``; this module is one, with the taskset id
``medvqa_verifiers`` (a top-level name: importing ``train.verifiers_env`` registers it):

* :class:`MedVQATaskset` -- one task per question: the env's system prompt (its tools' JSON
  schemas and answer format) and its first user turn, the question's image(s) as ``image_url``
  data-URL parts;
* :class:`MedVQAVerifiersEnv` -- the multi-turn loop: each model reply is one env step (the env
  parses its ``<tool_call>`` blocks and runs the tools), the tool observation goes back as the next
  user turn with the tools' new images, and the episode's return (the env's reward: rule +-1 on
  CLOSED/MCQ, ARMed on OPEN) is the rollout's reward ``medvqa``;
* :class:`MedVQAChatHarness` -- the policy seat: one chat completion per turn through verifiers'
  interception endpoint, run in this process (verifiers' own harnesses install a program with
  ``uv`` from the network, which an offline machine cannot).

``load_environment(**taskset_options)`` returns the ``vf.Env`` (through verifiers' own loader).
Evaluating an OpenAI-compatible endpoint with verifiers' own eval runner (what ``vf-eval`` runs)::

    import asyncio, train.verifiers_env as ve
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig
    config = EvalConfig(env={"taskset": {"id": ve.TASKSET_ID, "indices": [0, 1]}}, model="smollm2-135m-instruct",
                        client={"base_url": "http://127.0.0.1:8000/v1", "api_key_var": "KEY"},
                        sampling={"temperature": 0.0, "max_tokens": 8}, rich=None)
    episodes = asyncio.run(run_eval(config))   # each trace: rewards["medvqa"], info["medvqa"]
"""

from __future__ import annotations

import base64
import io
import sys
from typing import Any

import numpy as np
import verifiers.v1 as vf
from PIL import Image

TASKSET_ID = "medvqa_verifiers"
"""verifiers resolves a taskset id as a top-level module name: this module registers itself under it."""
REWARD_NAME = "medvqa"
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])


class MedVQATasksetConfig(vf.TasksetConfig):
    """Which questions, and the env that asks them (``MedVQAEnv`` keyword arguments)."""

    dataset: str = "embedded"
    split: str = "test"
    indices: list[int] | None = None
    """record indices (None: every record)"""
    seed: int = 0
    env: dict[str, Any] = {}
    """other ``MedVQAEnv`` arguments: tools, reward, max_turns, dataset_options, ..."""


class MedVQAData(vf.TaskData):
    info: dict
    """``index`` and ``seed``: the env's reset that reproduces the episode."""


class MedVQATask(vf.Task[MedVQAData, vf.State, vf.TaskConfig]):
    pass


class MedVQAChatHarnessConfig(vf.HarnessConfig):
    pass


class MedVQAChatHarness(vf.Harness[MedVQAChatHarnessConfig]):
    """One chat completion per segment, in-process, through the interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    SUPPORTS_MCP = False
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def setup(self, runtime) -> None:
        return None

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
        from openai import AsyncOpenAI

        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages.extend(m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m) for m in prompt)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret)
        try:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


class MedVQAEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


def _env(config: MedVQATasksetConfig):
    from medvqa_env.env import MedVQAEnv

    return MedVQAEnv(dataset=config.dataset, split=config.split, **dict(config.env))


def image_part(pixels: np.ndarray) -> dict[str, Any]:
    """An observation image as an OpenAI ``image_url`` part (lossless PNG data URL)."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(buf, format="PNG", compress_level=1)
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}}


def user_turn(obs: dict[str, Any]) -> list[dict[str, Any]]:
    """The env's observation as one OpenAI user message: its images, then its text."""
    return [{"role": "user", "content": [*(image_part(a) for a in obs["images"]), {"type": "text", "text": obs["text"]}]}]


class MedVQAVerifiersEnv(vf.Env[MedVQAEnvConfig]):
    """Each model reply is one MedVQA env step; the episode's return is the reward."""

    async def run(self, task, agents):
        config = self.taskset.config
        env = _env(config)
        total, info = 0.0, {}
        try:
            env.reset(seed=task.data.info["seed"], options={"index": task.data.info["index"]})
            async with agents.player.interaction(task) as interaction:
                segment = await interaction.turn()
                while True:
                    reply = "" if segment.terminated else segment.last_reply
                    obs, reward, terminated, truncated, info = env.step(reply)
                    total += float(reward)
                    if terminated or truncated:
                        break
                    if segment.terminated:  # the seat stopped answering: empty turns run the env out
                        continue
                    segment = await interaction.turn(user_turn(obs))
            trace = interaction.trace
        finally:
            env.close()
        trace.record_reward(REWARD_NAME, total, 1.0)
        trace.info["medvqa"] = {"answer": info.get("answer"), "ground_truth": info.get("ground_truth"),
                                "correct": info.get("correct"), "end_reason": info.get("end_reason"),
                                "reward_components": info.get("reward_components")}


class MedVQATaskset(vf.Taskset[MedVQATask, MedVQATasksetConfig]):
    def load(self):
        env = _env(self.config)
        try:
            indices = self.config.indices if self.config.indices is not None else range(len(env.dataset))
            for i in indices:
                obs, info = env.reset(seed=self.config.seed, options={"index": int(i)})
                yield MedVQATask(MedVQAData(id=info["record_id"], name=f"{info['dataset']}#{i}",
                                            prompt=user_turn(obs), system_prompt=info["system_prompt"],
                                            info={"index": int(i), "seed": self.config.seed}),
                                 self.config.task)
        finally:
            env.close()


def load_environment(**taskset_options: Any) -> vf.Env:
    """The verifiers environment over MedVQA-v0 (``taskset_options``: :class:`MedVQATasksetConfig`'s
    fields), built by verifiers' own loader."""
    from verifiers.v1.utils.loaders import load_environment as vf_load, resolve_env_config

    return vf_load(resolve_env_config({"taskset": {"id": TASKSET_ID, **taskset_options}}))


__all__ = ["MedVQATaskset", "MedVQAVerifiersEnv", "MedVQAChatHarness"]
