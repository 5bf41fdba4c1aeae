"""MedVQA-Gym as a task for TRL's ``GRPOTrainer`` (``pip install 'medvqa-gym[trl]'``).

Three adapters, each small, so TRL's own trainer can train against the env:

* :func:`prompt_dataset` -- the env's prompts as a TRL dataset: a conversational ``prompt`` (the
  env's system prompt with its tools' schemas and answer protocol, then the question) and a
  ``record_index`` column the reward uses to find the record;
* :class:`EnvReward` -- a reward function with TRL's signature
  (``(prompts, completions, **columns) -> list[float | None]``): each completion is played as the
  record's episode -- its one turn, after which no turn follows, so an episode without an answer
  runs out of turns and ends as the env ends it (``max_turns``), scored as "no answer", never
  above a wrong answer -- and the episode's return (the env's reward: rule, ARMed, ...) is the
  completion's reward. TRL calls a
  reward function once per generation batch, which is where ARMed's thresholds move
  (``end_batch(k)`` for the k-th batch), as in the native trainer. TRL on several processes has an
  ``EnvReward`` in each: with an adaptive reward they score alone (it warns) unless the reward's
  state is one named Ray actor (``{"name": "default", "threshold_store": "ray", "ray_actor_name":
  ...}``), which moves once per batch however many processes announce it;
* :func:`environment_class` -- a class for ``GRPOTrainer(environment_factory=...)``: one method per
  env tool (typed arguments and a Google-style docstring, which is how TRL exposes methods as
  tools), ``reset(record_index=...)`` per rollout; the instances of one class share one toolbox
  (a group's identical tool call runs once) and reward. Multi-turn tool use through it needs a policy
  whose chat template renders tools and a response parser TRL knows (Qwen, Llama 3.1).
  ``environment_class(env, images=True)`` makes each tool return TRL's multimodal content blocks
  (the tool's new images, then its text), which TRL >= 1.16 feeds to a VLM's processor; with
  :class:`EpisodeReward` (TRL passes it the rollout's environments) the final assistant turn is
  the episode's last step and the episode's return is the reward. ``tests/integrations/test_trl.py``
  runs a real GRPO step with it on a tiny Qwen2-VL.

Example (CPU, a tiny model; see ``tests/train/test_trl_hook.py``)::

    from trl import GRPOConfig, GRPOTrainer
    env = {"dataset": "embedded", "split": "train", "tools": [], "reward": "rule"}
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=EnvReward(env),
                          train_dataset=prompt_dataset(env, answer_types="CLOSED"), args=GRPOConfig(...))
    trainer.train()
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping, Sequence

from medvqa_env.errors import ConfigError

JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _env(env_kwargs: Mapping[str, Any]):
    from medvqa_env.env import MedVQAEnv

    return MedVQAEnv(**dict(env_kwargs))


def prompt_dataset(env_kwargs: Mapping[str, Any], indices: Sequence[int] | None = None, answer_types: str = "",
                   images: bool = False):
    """A ``datasets.Dataset`` of the env's prompts: ``prompt`` (system + user messages, as the env
    shows them; images appear as ``[image i]``), ``record_index``, ``answer_type``; with ``images``
    also ``images``, the question's images (TRL puts them in the user turn for a VLM)."""
    from datasets import Dataset

    env = _env(env_kwargs)
    wanted = {t.strip().upper() for t in answer_types.split(",") if t.strip()}
    rows = []
    for i in range(len(env.dataset)) if indices is None else indices:
        obs, info = env.reset(seed=0, options={"index": int(i)})
        if wanted and info["answer_type"] not in wanted:
            continue
        row = {"prompt": [{"role": "system", "content": info["system_prompt"]},
                          {"role": "user", "content": _text(obs["text"])}],
               "record_index": int(i), "answer_type": info["answer_type"]}
        if images:
            from PIL import Image

            row["images"] = [Image.fromarray(a) for a in obs["images"]]
        rows.append(row)
    env.close()
    if not rows:
        raise ConfigError(f"expected records of types {sorted(wanted)} in the env's dataset, got none")
    return Dataset.from_list(rows)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") if p.get("type") != "image" else f"[image {p.get('image_index', 0)}]"
                     for p in content)


def completion_text(completion: Any) -> str:
    """TRL passes a string (standard format) or a list of messages (conversational format)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if m.get("role") == "assistant")
    raise ConfigError(f"expected a completion string or message list, got {type(completion).__name__}")


class EnvReward:
    """TRL reward function: the env's reward for each completion as the answer to its record.

    ``record_index`` comes from the dataset column of the same name (TRL passes every extra column
    as a keyword). Returns ``None`` (TRL: abstain) for rows without one.

    A completion is the policy's whole turn (TRL generates one). If it does not answer, the turns
    after it are empty: the env counts them down to ``max_turns`` and ends the episode with its
    no-answer score, which no env reward puts above a wrong answer (rule: -1 for both; ARMed: no
    format credit and empty-text metrics). The reward is the episode's return (any
    ``format_penalty`` of those turns included)."""

    def __init__(self, env_kwargs: Mapping[str, Any], seed: int = 0) -> None:
        self.env = _env(env_kwargs)
        self.seed = seed
        self.batches = 0
        self.__name__ = f"medvqa_{getattr(self.env.reward_fn, 'name', 'reward')}"  # TRL logs rewards/<name>
        _warn_if_processes_score_alone(self.env.reward_fn)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], record_index: Sequence[int] | None = None,
                 **columns: Any) -> list[float | None]:
        if record_index is None:
            raise ConfigError("expected a 'record_index' column in the train dataset (see prompt_dataset)")
        out: list[float | None] = []
        for completion, index in zip(completions, record_index):
            if index is None:
                out.append(None)
                continue
            self.env.reset(seed=self.seed, options={"index": int(index)})
            out.append(self._play(completion_text(completion)))
        end_batch = getattr(self.env.reward_fn, "end_batch", None)
        if callable(end_batch):
            end_batch(self.batches)  # an id: processes sharing one Ray-held state move it once per batch
        self.batches += 1
        return out


    def _play(self, turn: str) -> float:
        """The episode's return with ``turn`` as its only turn (empty turns after it until it ends)."""
        total, action = 0.0, turn
        for _ in range(self.env.max_turns + 1):  # the env ends an episode after max_turns tool turns + 1
            _, reward, terminated, truncated, _ = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                return total
            action = ""
        raise RuntimeError(f"expected the env to end the episode within {self.env.max_turns + 1} turns")


def _warn_if_processes_score_alone(reward: Any) -> None:
    """TRL under ``accelerate``/``torchrun`` builds one EnvReward per process (``WORLD_SIZE``)."""
    import os
    import warnings

    from medvqa_env.vector import reward_state_stores

    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return
    alone = [s for s in reward_state_stores(reward) if not s.startswith("ray:")]
    if alone:
        warnings.warn(f"EnvReward in each of {os.environ['WORLD_SIZE']} processes scores alone: its reward state "
                      f"({', '.join(alone)}) is per process. Give the reward threshold_store='ray' and one "
                      "ray_actor_name to share it.", stacklevel=3)


def environment_class(env_kwargs: Mapping[str, Any], images: bool = False) -> type:
    """A class for ``GRPOTrainer(environment_factory=cls)``: ``reset(record_index)`` starts the
    record's episode; each env tool is a method whose signature and docstring come from the tool's
    JSON schema (what ``transformers.utils.get_json_schema`` -- TRL's reader -- expects). With
    ``images`` a tool returns ``[{"type": "image", "image": PIL image}, ..., {"type": "text", ...}]``
    (its new images, then its text) instead of the text alone."""
    probe = _env(env_kwargs)
    schemas = probe.toolbox.openai_tools()
    probe.close()
    methods: dict[str, Any] = {"__init__": _env_init(env_kwargs), "reset": _env_reset, "_finish": _env_finish}
    for schema in schemas:
        fn = schema["function"]
        methods[fn["name"]] = _tool_method(fn["name"], fn.get("description", ""), fn.get("parameters", {}), images)
    return type("MedVQAToolEnvironment", (), methods)


class EpisodeReward:
    """TRL reward function for ``environment_factory=environment_class(...)`` rollouts: the last
    assistant message of each completion is its episode's final step (tool calls were the earlier
    steps), and the episode's return -- the env's reward -- is the completion's reward."""

    def __init__(self, name: str = "medvqa_episode") -> None:
        self.__name__ = name
        self.calls: list[list[float]] = []  # each batch's rewards, as returned

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], environments: Sequence[Any] | None = None,
                 **columns: Any) -> list[float]:
        if environments is None:
            raise ConfigError("expected TRL to pass 'environments' (GRPOTrainer(environment_factory=...))")
        out = [env._finish(_final_text(c)) for c, env in zip(completions, environments)]
        self.calls.append(out)
        return out


def _final_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion)):
        if message.get("role") == "assistant":
            return _text(message.get("content") or "")
    return ""


def _env_init(env_kwargs: Mapping[str, Any]):
    from medvqa_env.services import EnvServices

    kwargs = dict(env_kwargs)
    shared: list[Any] = []  # one EnvServices for every instance of the class, built by the first

    def __init__(self) -> None:
        if not shared:
            shared.append(EnvServices.build(kwargs.pop("tools", None), kwargs.pop("reward", None),
                                            kwargs.get("dataset", "embedded")))
        self.env = _env({**kwargs, "services": shared[0]})
    return __init__


def _env_reset(self, record_index: int = 0, **columns: Any) -> None:
    """Start the record's episode (TRL calls this before each rollout, with the dataset row)."""
    self.env.reset(seed=0, options={"index": int(record_index)})
    self.episode_return = 0.0


def _env_finish(self, turn: str) -> float:
    """Play ``turn`` as the episode's next step, then empty turns until it ends (as
    :class:`EnvReward` does); the episode's return. An episode that already ended keeps its return."""
    action = turn
    while not self.env.done:
        _, reward, _, _, _ = self.env.step(action)
        self.episode_return = getattr(self, "episode_return", 0.0) + float(reward)
        action = ""
    return self.episode_return


def _tool_method(name: str, description: str, parameters: Mapping[str, Any], images: bool = False):
    """A method ``name(self, **arguments) -> str`` that runs the env tool and returns its text
    (with ``images``: TRL's content blocks, the new images first)."""
    props = dict(parameters.get("properties", {}))
    required = set(parameters.get("required", []))

    def method(self, **arguments: Any) -> Any:
        import json

        if self.env.done:  # the episode ran out of tool turns: the env takes no more steps
            return "The episode has ended: answer now."
        call = json.dumps({"name": name, "arguments": {k: v for k, v in arguments.items() if v is not None}})
        obs, reward, _, _, _ = self.env.step(f"<tool_call>{call}</tool_call>")
        self.episode_return = getattr(self, "episode_return", 0.0) + float(reward)
        if not images:
            return _text(obs["text"])
        from PIL import Image

        return ([{"type": "image", "image": Image.fromarray(a)} for a in obs["images"]]
                + [{"type": "text", "text": _text(obs["text"])}])

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    arg_docs = []
    for pname, spec in props.items():
        kind = JSON_TYPES.get(spec.get("type", "string"), str)
        if kind is list:  # get_json_schema reads list[float] as an array of numbers
            kind = list[JSON_TYPES.get(dict(spec.get("items") or {}).get("type", "string"), str)]  # type: ignore[misc]
        annotations[pname] = kind if pname in required else (kind | None)
        default = inspect.Parameter.empty if pname in required else None
        params.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=annotations[pname]))
        arg_docs.append(f"    {pname}: {' '.join(str(spec.get('description', pname)).split())}")
    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    doc = " ".join(description.split()) or name
    method.__doc__ = doc + ("\n\nArgs:\n" + "\n".join(arg_docs) if arg_docs else "") + "\n\nReturns:\n    The tool's observation."
    return method
