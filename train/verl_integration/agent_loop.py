"""``medvqa_agent``: verl's agent loop for multi-turn rollouts in :class:`medvqa_env.MedVQAEnv`.

One call of :meth:`MedVQAAgentLoop.run` is one episode:

1. ``env.reset`` on the row's ``extra_info.record_id``; the env's system + user messages (tools
   listed in the system prompt, the question's images) become the prompt tokens through verl's
   Continuous Token builder, the same tokenization path as verl's ``ToolAgentLoop``;
2. generate one turn through ``self.server_manager`` (vLLM/SGLang on GPU), capped at
   ``medvqa.max_action_length`` tokens and the remaining ``response_length``; these tokens get
   ``response_mask`` 1;
3. ``env.step(text)`` in a worker thread (tools may take seconds; the event loop keeps serving
   the other trajectories);
4. the env's observation message (tool output text, capped at ``medvqa.max_obs_length`` tokens,
   plus any new images) is appended with ``response_mask`` 0 and its images join
   ``multi_modal_data["images"]``;
5. repeat until the env ends the episode (a final answer, or ``max_turns`` tool turns used), the
   token budget (``response_length``) runs out or verl's ``multi_turn.max_assistant_turns`` is
   reached; the last two count as "no answer".

The env's terminal reward is ``AgentLoopOutput.reward_score``, so verl uses it directly (its
reward manager is skipped); the reward components, tool-call counts and the end reason travel in
``extra_fields`` (``medvqa`` for the episode summary; ``reward_extra_info`` for the fixed,
numeric per-sample keys verl logs and DAPO's group filter reads: ``acc``).

Settings come from the ``medvqa`` section of the trainer config (see
:mod:`train.verl_integration.config`): ``env`` (kwargs for ``MedVQAEnv``), ``max_action_length``,
``max_obs_length``, ``stop``, ``overlong_buffer``, ``reward`` (where ARMed's thresholds live).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any, Mapping
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.utils.profiler import simple_timer

from train.verl_integration import vision_trace
from train.verl_integration.config import AGENT_NAME, MEDVQA_DEFAULTS, plain
from train.verl_integration.reward import overlong_penalty, score_turn, shared_reward
from train.verl_integration.reward_state import episode_log, reward_for_step

logger = logging.getLogger(__name__)

_DATASETS: dict[str, Any] = {}
_DATASETS_LOCK = threading.Lock()
_SERVICES: dict[str, Any] = {}  # tool config -> the services episodes use now
_SERVICES_LOCK = threading.Lock()
REWARD_EXTRA_KEYS = ("score", "acc", "format_ok", "answered", "num_tool_calls", "num_tool_turns", "overlong_penalty")




def load_settings(trainer_config: Any) -> dict[str, Any]:
    """``MEDVQA_DEFAULTS`` overlaid with the config's ``medvqa`` section (one level deep for dicts)."""
    section = plain(trainer_config.get("medvqa")) if hasattr(trainer_config, "get") else None
    settings = json.loads(json.dumps(MEDVQA_DEFAULTS))
    for key, value in (section or {}).items():
        if isinstance(value, Mapping) and isinstance(settings.get(key), dict):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    return settings


def shared_dataset(env_kwargs: Mapping[str, Any]):
    """The env's dataset, loaded once per worker process and shared by every episode."""
    from medvqa_env.datasets import load_dataset

    key = json.dumps({k: env_kwargs.get(k) for k in ("dataset", "split", "dataset_options")},
                     sort_keys=True, default=str)
    with _DATASETS_LOCK:
        if key not in _DATASETS:
            _DATASETS[key] = load_dataset(env_kwargs.get("dataset", "embedded"), split=env_kwargs.get("split", "train"),
                                          **dict(env_kwargs.get("dataset_options") or {}))
        return _DATASETS[key]


def shared_services(tools: Any, reward: Any):
    """The worker process's :class:`~medvqa_env.services.EnvServices` for ``tools``: the episodes of
    a GRPO group that land in this process share one toolbox (loaded tool models, the result cache:
    the group's identical calls run once) and one decoded-image cache. The reward changes at
    validation steps (a frozen copy per step, :func:`reward_state.reward_for_step`); the toolbox
    and images are kept across those changes, so tools load once per process."""
    from medvqa_env.services import EnvServices, resolve_toolbox

    key = json.dumps(tools, sort_keys=True, default=str)
    with _SERVICES_LOCK:
        current = _SERVICES.get(key)
        if current is None:
            current = _SERVICES[key] = EnvServices(reward=reward, toolbox=resolve_toolbox(tools))
        elif current.reward is not reward:
            current = _SERVICES[key] = EnvServices(reward=reward, toolbox=current.toolbox, images=current.images)
        return current


def make_env(env_kwargs: Mapping[str, Any], reward_options: Mapping[str, Any] | None = None, reward: Any = None):
    """A fresh ``MedVQAEnv`` per episode over what the worker process shares: the dataset, the
    toolbox and image cache (:func:`shared_services`) and ``reward`` (default: the process-wide
    reward of :func:`reward.shared_reward` for ``reward_options``: ``threshold_store``, ``armed``).
    An ``env_kwargs["reward"]`` of its own gives the episode its own services."""
    from medvqa_env.env import MedVQAEnv

    kwargs = {k: v for k, v in env_kwargs.items() if k not in ("dataset", "split", "dataset_options")}
    if kwargs.get("reward") is not None:
        return MedVQAEnv(dataset=shared_dataset(env_kwargs), **kwargs)
    reward = reward if reward is not None else shared_reward(**dict(reward_options or {}))
    from tool_backends.config import for_dataset  # segment on real images: LiteMedSAM, as gym.make gives it

    services = shared_services(for_dataset(kwargs.pop("tools", None), env_kwargs.get("dataset", "embedded")), reward)
    kwargs.pop("reward", None)
    return MedVQAEnv(dataset=shared_dataset(env_kwargs), services=services, **kwargs)


def checkpoint_settings(model_path: str) -> tuple[str | None, int]:
    """What the project's trainers saved with a policy (``medvqa_run.json``) about how it reads an
    episode: the system prompt that replaces the env's (``None``: the env's own, the rule of
    ``agents.models.load_policy``) and the encoder's ``max_image_side``."""
    from agents.models import ChatEncoder, read_run_file, saved_prompt_override

    run = read_run_file(model_path)
    side = (run.get("encoder") or {}).get("max_image_side") or ChatEncoder.max_image_side
    return saved_prompt_override(run), int(side)


def policy_image(image: Any, max_image_side: int) -> Any:
    """``image`` as ``agents.models.ChatEncoder`` hands it to its processor: RGB, and thumbnailed to
    ``max_image_side`` when larger."""
    image = image.convert("RGB")
    if max(image.size) > max_image_side:
        image = image.copy()
        image.thumbnail((max_image_side, max_image_side))
    return image


TEXT_IMAGE_PLACEHOLDER = "<image>"
"""What a text policy reads where an image was: the same as ``agents.models.ChatEncoder`` writes for
text models, so a checkpoint trained by ``train/sft.py`` sees the same tokens under verl."""


def text_only(message: Mapping[str, Any]) -> dict[str, Any]:
    """An env message as text, for a text policy: each image becomes :data:`TEXT_IMAGE_PLACEHOLDER`,
    parts joined by newlines as the native encoder joins them (the tools still work on the images
    inside the env)."""
    content = message["content"]
    if message.get("role") == "tool" and message.get("images"):
        content = [{"type": "image"}] * len(message["images"]) + [{"type": "text", "text": content}]
    parts = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
    pieces = [TEXT_IMAGE_PLACEHOLDER if p.get("type") == "image" else p.get("text", "") for p in parts]
    return {"role": message["role"], "content": "\n".join(x for x in pieces if x)}


def to_verl_message(message: Mapping[str, Any], images: list[Any]) -> dict[str, Any]:
    """An env chat message (images by ``image_index``) -> verl's form (``{"type": "image", "image": PIL}``)."""
    content = message["content"]
    if message.get("role") == "tool" and message.get("images"):
        blocks = [{"type": "image", "image": images[i]} for i in message["images"]]
        return {"role": "tool", "content": blocks + [{"type": "text", "text": content}]}
    if isinstance(content, str):
        return {"role": message["role"], "content": content}
    blocks = []
    for part in content:
        if part.get("type") == "image":
            blocks.append({"type": "image", "image": images[part["image_index"]]})
        else:
            blocks.append({"type": "text", "text": part.get("text", "")})
    return {"role": message["role"], "content": blocks}


@register(AGENT_NAME)
class MedVQAAgentLoop(AgentLoopBase):
    """verl agent loop over :class:`medvqa_env.MedVQAEnv` (see the module docstring)."""

    def __init__(self, *args: Any, tools: Any = None, **kwargs: Any) -> None:
        kwargs.pop("name", None)  # present when registered through agent_loop_config_path
        super().__init__(*args, **kwargs)
        del tools  # our tools run inside the env, not as verl tools
        self.settings = load_settings(self.config)
        self.env_kwargs = dict(self.settings["env"])
        self.response_length = int(self.rollout_config.response_length)
        self.max_action_length = int(self.settings["max_action_length"])
        self.max_obs_length = int(self.settings["max_obs_length"])
        self.stop = list(self.settings.get("stop") or [])
        self.overlong = dict(self.settings.get("overlong_buffer") or {})
        self.eos_id = self.tokenizer.eos_token_id
        self.max_assistant_turns = self.rollout_config.multi_turn.max_assistant_turns
        call = self.settings.get("scripted_tool_call")
        self.scripted_tool_turn = f"<tool_call>{json.dumps(dict(call))}</tool_call>" if call else None
        self.sees_images = self.processor is not None
        self.system_prompt, self.max_image_side = None, None
        if self.settings.get("checkpoint_settings"):
            self.system_prompt, self.max_image_side = checkpoint_settings(self.config.actor_rollout_ref.model.path)

    # ------------------------------------------------------------------------------------------
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        """One episode. ``global_steps`` (verl's training step, in every row of the batch) and
        ``medvqa_validate`` (set by :class:`~train.verl_integration.worker.MedVQAAgentLoopWorkerTQ`) pick the
        reward: the first trajectory of step k ends batch k-1 of the shared ARMed state, so every
        trajectory of step k meets the same thresholds; validation scores with a frozen copy."""
        loop = asyncio.get_running_loop()
        extra_info = dict(plain(kwargs.get("extra_info")) or {})
        reward = await loop.run_in_executor(None, reward_for_step, self.settings.get("reward") or {},
                                            kwargs.get("global_steps"), bool(kwargs.get("medvqa_validate", False)))
        # the row's split: validation rows come from another split than medvqa.env.split
        env_kwargs = {**self.env_kwargs, **({"split": extra_info["split"]} if extra_info.get("split") else {})}
        env = await loop.run_in_executor(None, make_env, env_kwargs, self.settings.get("reward"), reward)
        try:
            output = await self._episode(env, loop, sampling_params, extra_info, kwargs, int(priority))
        finally:
            await loop.run_in_executor(None, env.close)
        log_dir = self.settings.get("episode_log_dir")
        if log_dir:
            await loop.run_in_executor(None, episode_log, log_dir, output, kwargs)
        return output

    async def _episode(self, env, loop, sampling_params, extra_info, kwargs, priority) -> AgentLoopOutput:
        options = ({"record_id": str(extra_info["record_id"])} if extra_info.get("record_id")
                   else {"index": int(extra_info.get("index", kwargs.get("index", 0)))})
        await loop.run_in_executor(None, lambda: env.reset(options=options))
        images = self._policy_images(env.images) if self.sees_images else []
        messages = [to_verl_message(m, images) if self.sees_images else text_only(m)
                    for m in self._with_system_prompt(env.messages)]
        self._assert_mm_supported(bool(images))
        prompt_ids = await self.ct_build_initial_tokens(messages, images=images or None)

        metrics: dict[str, Any] = {}
        runtime_ids, mask, logprobs = list(prompt_ids), [], []
        request_id = f"det-{priority}" if self.rollout_config.full_determinism else uuid4().hex
        turn_scores: list[float] = []
        calls: list[dict[str, Any]] = []  # every tool call the env ran: name, ok, error, scripted, new_images
        assistant_turns = user_turns = n_tool_calls = 0
        last_text, step_info, reward, end_reason, preempted = "", {}, None, None, 0
        server_fields: dict[str, Any] = {}

        while True:
            budget = self.response_length - len(mask)
            if budget <= 0:
                end_reason = "length"
                break
            scripted = bool(self.scripted_tool_turn) and assistant_turns == 0
            if scripted:
                # a prompted tool turn (medvqa.scripted_tool_call): the text is given, not sampled, and
                # enters the context at response_mask 0 -- the env runs its tool call for real
                assistant_turns += 1
                last_text = self.scripted_tool_turn
                turn_ids = self.tokenizer.encode(last_text, add_special_tokens=False) + [self.eos_id]
                runtime_ids, mask = runtime_ids + turn_ids, mask + [0] * len(turn_ids)
                logprobs = logprobs + [0.0] * len(turn_ids) if logprobs else logprobs
            else:
                params = {**sampling_params, "max_tokens": min(self.max_action_length, budget)}
                if self.stop:
                    params.update(stop=self.stop, include_stop_str_in_output=True)
                with simple_timer("generate_sequences", metrics):
                    out = await self.server_manager.generate(request_id=request_id, prompt_ids=runtime_ids,
                                                             sampling_params=params, image_data=images or None,
                                                             priority=priority)
                self._merge_server_fields(server_fields, out.extra_fields)
                preempted += int(out.num_preempted or 0)
                assistant_turns += 1
                want_lp = bool(logprobs) or bool(out.log_probs)
                if want_lp and len(logprobs) < len(mask):  # tokens before the first sampled one (a
                    logprobs = logprobs + [0.0] * (len(mask) - len(logprobs))  # prompted turn) are mask 0
                merged, mask, lp = await self.ct_merge_assistant_token(
                    runtime_ids, out.token_ids, mask, logprobs if want_lp else None,
                    assistant_logprobs=list(out.log_probs) if out.log_probs else None)
                runtime_ids, logprobs = merged.token_ids, (lp or [])
                if self.eos_id is not None and (not out.token_ids or out.token_ids[-1] != self.eos_id):
                    # stopped by length, a stop string or at once: close the turn as the chat template would
                    runtime_ids = runtime_ids + [self.eos_id]
                    mask = mask + [0]
                    logprobs = logprobs + [0.0] if logprobs else logprobs
                last_text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)

            with simple_timer("tool_calls", metrics):
                _, r, terminated, truncated, step_info = await loop.run_in_executor(None, env.step, last_text)
            turn_scores.append(float(r))
            n_tool_calls += len(step_info.get("tool_calls", []))
            calls += [{"name": c.get("name"), "ok": c.get("error") is None, "error": c.get("error"),
                       "scripted": scripted, "new_images": len(c.get("new_image_indices") or [])}
                      for c in step_info.get("tool_calls", [])]
            if terminated or truncated:
                reward, end_reason = float(r), step_info.get("end_reason")
                break
            if self.max_assistant_turns and assistant_turns >= self.max_assistant_turns:
                end_reason = "max_assistant_turns"  # verl's own cap, normally above the env's
                break

            previous = messages + [{"role": "assistant", "content": last_text}]
            n_before = len(images)
            if self.sees_images:
                images = self._policy_images(env.images)
                observation = self._capped(to_verl_message(env.messages[-1], images))
            else:
                observation = self._capped(text_only(env.messages[-1]))
            self._assert_mm_supported(len(images) > n_before)
            messages = previous + [observation]
            merged, mask, lp = await self.ct_merge_context_msg(previous, messages, runtime_ids, mask,
                                                               logprobs if logprobs else None)
            runtime_ids, logprobs = merged.token_ids, (lp or [])
            user_turns += 1

        if reward is None:  # the token budget or verl's turn cap ended it: score it as "no answer"
            record = env.record
            info = {"answer_type": record.answer_type.value, "options": dict(record.options),
                    "answer_protocol": self.env_kwargs.get("answer_protocol", "boxed"), "record_id": record.id}
            scored = await loop.run_in_executor(None, lambda: score_turn("", record.answer, info, env.reward_fn))
            reward = scored["score"]
        output = self._output(env, runtime_ids, mask, logprobs, images, reward, end_reason, step_info, metrics,
                              turn_scores, assistant_turns, user_turns, n_tool_calls, preempted, calls)
        output.extra_fields.update(server_fields)
        return output

    @staticmethod
    def _merge_server_fields(fields: dict[str, Any], new: Mapping[str, Any] | None) -> None:
        """Keep the rollout server's bookkeeping like verl's ``ToolAgentLoop``: the weight version
        the episode started on (``min_global_steps``) and ended on (``max_global_steps``)."""
        new = dict(new or {})
        if not fields:
            fields.update(new)
        elif new.get("max_global_steps") is not None:
            fields["max_global_steps"] = new["max_global_steps"]

    def _with_system_prompt(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The env's messages with the checkpoint's saved system prompt in place of the env's, as
        ``agents.models.ChatEncoder`` renders them (``medvqa.checkpoint_settings``)."""
        if self.system_prompt is None:
            return list(messages)
        return [{**m, "content": self.system_prompt} if m["role"] == "system" else m for m in messages]

    def _policy_images(self, images: list[Any]) -> list[Any]:
        """The env's images as the policy reads them: with ``medvqa.checkpoint_settings``, shrunk to the
        checkpoint encoder's ``max_image_side`` exactly as ``ChatEncoder`` does before its processor
        (RGB, ``thumbnail``); the env and its tools keep the originals."""
        if self.max_image_side is None:
            return list(images)
        return [policy_image(im, self.max_image_side) for im in images]

    # ------------------------------------------------------------------------------------------
    def _end_on_model_token(self, response_ids: list[int], mask: list[int], logprobs: list[float]):
        """Cut the response at ``response_length``, then drop trailing ``response_mask`` 0 tokens.

        verl puts the episode's reward on the last response token (``rm_scores[-1]``). A turn cut
        by length ends on the ``<|im_end|>`` we append at mask 0, and a budget cut can end inside an
        observation: the reward would sit on a token the policy did not produce (and that
        mask-aware estimators ignore). Nothing after the policy's last token conditions it, so
        dropping that tail changes no log-prob."""
        n = min(len(response_ids), self.response_length)
        while n > 0 and mask[n - 1] == 0:
            n -= 1
        if n == 0:  # no policy token at all (nothing generated): keep the truncated response
            n = min(len(response_ids), self.response_length)
        return response_ids[:n], mask[:n], (logprobs[:n] if logprobs else logprobs)

    def _capped(self, message: dict[str, Any]) -> dict[str, Any]:
        """Cap an observation's text at ``max_obs_length`` tokens (the seed's max_obs_length)."""
        def cap(text: str) -> str:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if len(ids) <= self.max_obs_length:
                return text
            return self.tokenizer.decode(ids[: self.max_obs_length]) + "...(truncated)"

        if isinstance(message["content"], str):
            return {**message, "content": cap(message["content"])}
        return {**message, "content": [({**b, "text": cap(b["text"])} if b.get("type") == "text" else b)
                                       for b in message["content"]]}

    def _output(self, env, runtime_ids, mask, logprobs, images, reward, end_reason, step_info, metrics,
                turn_scores, assistant_turns, user_turns, n_tool_calls, preempted, calls=()) -> AgentLoopOutput:
        n_prompt = len(runtime_ids) - len(mask)
        prompt_ids, response_ids = runtime_ids[:n_prompt], runtime_ids[n_prompt:]
        response_ids, mask, logprobs = self._end_on_model_token(response_ids, mask, logprobs)
        # image pads in what the trainer gets (prompt + the kept response): what the vision towers fill
        image_pad = self.tokenizer.convert_tokens_to_ids("<|image_pad|>") if self.sees_images else None
        n_image_tokens = sum(t == image_pad for t in prompt_ids + response_ids) if image_pad is not None else 0
        penalty = 0.0
        if self.overlong.get("enable"):
            penalty = overlong_penalty(min(len(response_ids), self.response_length), self.response_length,
                                       int(self.overlong.get("len", 1024)), float(self.overlong.get("penalty_factor", 1.0)))
        total = float(reward) + penalty
        components = dict(step_info.get("reward_components") or {})
        record = env.record
        summary = {
            "record_id": record.id, "dataset": record.dataset, "answer_type": record.answer_type.value,
            "end_reason": end_reason, "answer": step_info.get("answer"), "ground_truth": record.answer,
            "correct": step_info.get("correct"), "format_ok": step_info.get("format_ok"),
            "num_tool_calls": n_tool_calls, "num_tool_turns": env.tool_turns, "num_images": len(images),
            "reward": total, "env_reward": float(reward), "reward_components": components,
            "tool_names": [c["name"] for t in env.trace for c in t["tool_calls"]],
            "tool_calls": list(calls), "num_image_tokens": int(n_image_tokens),
        }
        if self.sees_images and vision_trace.folder() is not None:
            summary["image_sha1"] = vision_trace.image_digests(self.processor, images)
        reward_info = {
            "score": total,
            "acc": float(components.get("accuracy", 0.0)),
            "format_ok": float(bool(step_info.get("format_ok"))),
            "answered": float(step_info.get("answer") is not None),
            "num_tool_calls": float(n_tool_calls),
            "num_tool_turns": float(env.tool_turns),
            "overlong_penalty": penalty,
            # which mode the episode is in (issue 42): averaged by verl per step, acc beside called tells
            # calling from direct answers; an invalid turn neither called a tool nor answered
            "called": float(n_tool_calls > 0),
            "invalid_turns": float(sum((t.get("action") or {}).get("kind") == "invalid" for t in env.trace)),
        }
        metrics_obj = AgentLoopMetrics(generate_sequences=metrics.get("generate_sequences", 0.0),
                                       tool_calls=metrics.get("tool_calls", 0.0), num_preempted=preempted)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=mask,
            response_logprobs=logprobs or None,
            multi_modal_data={"images": images} if images else {},
            reward_score=total,
            num_turns=assistant_turns + user_turns + 1,
            metrics=metrics_obj,
            extra_fields={"medvqa": summary, "reward_extra_info": reward_info, "turn_scores": turn_scores,
                          "tool_rewards": []},
        )
