"""``MedVQAEnv``: a multi-turn Gymnasium env for tool-using medical VQA agents.

One episode is one question. The agent's action is its whole turn as text; a turn with
``<tool_call>`` blocks gets the tools' outputs back as the next observation, a turn with a final
answer ends the episode with the reward.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np
from PIL import Image

from medvqa_env import prompts
from medvqa_env.ablation import blank_images, check_ablation, donor_indices
from medvqa_env.errors import ConfigError, EnvStateError
from medvqa_env.frame import fit_image, frame_note, scale_annotations
from medvqa_env.images import image_pixels
from medvqa_env.parser import AnswerProtocol, ParsedAction, get_answer_protocol, parse_action
from medvqa_env.records import Annotations, VQADataset, VQARecord
from medvqa_env.spaces import action_space, observation_space

OBSERVATION_STYLES = ("observation_tag", "tool_role")


class MedVQAEnv(gym.Env[dict, str]):
    """Medical VQA with tools.

    Args:
        dataset: a :class:`VQADataset`, or a name for :func:`medvqa_env.datasets.load_dataset`
            (``"embedded"``, ``"vqa_rad"``, ``"slake"``, ``"jsonl"``, ...).
        split: the split to load when ``dataset`` is a name.
        dataset_options: extra keyword arguments for the loader (e.g. ``root``, ``path``).
        tools: a ``Toolbox``, a tool config (see :mod:`tool_backends.config`), a list of tool names,
            or ``None`` for the default (``image_zoom_in`` in-process). ``[]`` disables tools.
        reward: a :class:`rewards.RewardFunction`, a registry name (``"armed"``) or ``None`` for
            :func:`rewards.default_reward` (rule ±1 for CLOSED/MCQ, ARMed for OPEN).
        services: an :class:`~medvqa_env.services.EnvServices` shared with other copies (one
            reward object and one toolbox for a whole GRPO group); when given, ``tools`` and
            ``reward`` must be left out. Without it the env builds a private one.
        defer_reward: leave the final scoring to the caller: the terminal step returns reward 0.0
            and ``info["reward_input"]``, and :func:`apply_reward` fills in the reward later.
            :class:`medvqa_env.pool.EnvPool` uses this to score every episode of a step in one
            batch with the run's one reward object.
        max_turns: tool turns allowed (seed: 3). After the last one, one more turn may answer;
            a turn without an answer then truncates the episode.
        answer_protocol: ``"boxed"`` (``\\boxed{}``, seed 000) or ``"xml"`` (MediX-R1).
        observation_style: ``"observation_tag"`` wraps tool output in ``<observation>`` inside a
            user message (the seed); ``"tool_role"`` sends it as ``tool`` role messages.
        format_penalty: reward given for a turn that neither calls a tool nor answers (e.g. -0.1).
        max_action_chars: longer turns are refused with an error observation.
        render_mode: ``None`` or ``"rgb_array"``.
        image_ablation: ``None``, ``"blank"`` or ``"shuffle"``: show every episode a black image, or
            another record's image, with the question, options and gold answer kept; tools and
            oracle annotations follow the shown image; ``"blank_policy"``: only the agent's images
            are black, the tools see the real one (see :mod:`medvqa_env.ablation`).

    Observation: ``{"text": str, "images": tuple[np.ndarray, ...]}`` -- after ``reset`` the user
    turn (question, options, answer format) with the question's image(s); after ``step`` the tool
    observation text with any new images. The full chat (system prompt with the tools' JSON
    schemas, every turn, images by index) is :attr:`messages`; ``reset``'s info also carries the
    ``system_prompt`` and the OpenAI ``tools`` list.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 1}

    def __init__(
        self,
        dataset: VQADataset | str = "embedded",
        split: str = "test",
        dataset_options: Mapping[str, Any] | None = None,
        tools: Any = None,
        reward: Any = None,
        max_turns: int = 3,
        answer_protocol: str | AnswerProtocol = "boxed",
        observation_style: str = "observation_tag",
        format_penalty: float = 0.0,
        max_action_chars: int = 65_536,
        max_image_side: int = 4096,
        render_mode: str | None = None,
        services: Any = None,
        defer_reward: bool = False,
        image_ablation: str | None = None,
    ) -> None:
        if not isinstance(max_turns, int) or max_turns < 0:
            raise ConfigError(f"expected max_turns to be an int >= 0, got {max_turns!r}")
        if observation_style not in OBSERVATION_STYLES:
            raise ConfigError(f"expected observation_style in {OBSERVATION_STYLES}, got {observation_style!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"expected render_mode in {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.dataset = _resolve_dataset(dataset, split, dataset_options)
        if len(self.dataset) == 0:
            from medvqa_env.provenance import check_not_all_skipped

            check_not_all_skipped(self.dataset)  # a loader that skipped every row says so
            raise ConfigError(f"dataset {self.dataset.name!r} (split {split!r}) is empty")
        from medvqa_env.services import EnvServices

        self._owns_services = services is None  # a shared toolbox is closed by whoever built it
        if services is None:  # real-image datasets default segment to LiteMedSAM (tool_backends.config.for_dataset)
            from tool_backends.config import for_dataset

            services = EnvServices.build(for_dataset(tools, self.dataset), reward)
        elif not isinstance(services, EnvServices):
            raise ConfigError(f"expected services to be an EnvServices, got {type(services).__name__}")
        elif tools is not None or reward is not None:
            raise ConfigError("expected either services or tools/reward, got both (the services hold the "
                              "toolbox and the reward that copies share)")
        self.services = services
        self.toolbox = services.toolbox
        self.reward_fn = services.reward
        self.defer_reward = bool(defer_reward)
        self.max_turns = max_turns
        self.protocol = get_answer_protocol(answer_protocol)
        self.observation_style = observation_style
        self.format_penalty = float(format_penalty)
        self.max_action_chars = int(max_action_chars)
        self.max_image_side = int(max_image_side)
        self.render_mode = render_mode
        self.image_ablation = check_ablation(image_ablation)
        self._donors = donor_indices(self.dataset) if self.image_ablation == "shuffle" else None
        # False: a record image's observation is the read-only array the image cache keeps, not a
        # copy (for a consumer that copies it anyway, like the process pool's shared-memory transport)
        self.copy_observation_images = True

        self.system_prompt = prompts.system_prompt(self.toolbox.openai_tools(), self.protocol, max_turns)
        self.observation_space = observation_space(max_text_chars=1 << 22, max_image_side=max_image_side)
        self.action_space = action_space(max_action_chars)
        self._clear_episode()

    # ------------------------------------------------------------------------------------------
    def _clear_episode(self) -> None:
        self.record: VQARecord | None = None
        self.images: list[Image.Image] = []  # as shown to the agent: the frame every tool measures
        self.original_sizes: list[tuple[int, int]] = []  # the files' sizes before any downscaling
        self.annotations = None  # the record's annotations in the shown frame (see medvqa_env.frame)
        self.messages: list[dict[str, Any]] = []
        self.trace: list[dict[str, Any]] = []  # per-turn log used by render and the evaluation
        self.turn = 0
        self.tool_turns = 0
        self.done = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode.

        ``options``: ``{"index": i}`` picks record ``i``; ``{"record_id": "..."}`` picks by id;
        otherwise a record is drawn with the env's RNG (so the same ``seed`` gives the same
        question). Raises :class:`DatasetError` if the record's image cannot be loaded.

        Info keys: ``record_id``, ``index``, ``dataset``, ``answer_type``, ``modality``, ``organ``,
        ``question``, ``options``, ``system_prompt``, ``tools`` (OpenAI schemas), ``messages``
        (the chat so far: system + user).
        """
        super().reset(seed=seed)
        options = options or {}
        if "record_id" in options:
            index = self.dataset.index_of(options["record_id"])
        elif "index" in options:
            index = int(options["index"])
            if not 0 <= index < len(self.dataset):
                raise IndexError(f"expected an index in 0..{len(self.dataset) - 1}, got {index}")
        else:
            index = int(self.np_random.integers(len(self.dataset)))
        self._clear_episode()
        record = self.dataset[index]
        pictured = record if self._donors is None else self.dataset[self._donors[index]]  # whose image is shown
        loaded = [self.services.images.load(p, pictured.id) for p in pictured.image_paths]  # shared, never modified
        annotations = pictured.annotations
        if self.image_ablation == "blank":
            loaded, annotations = blank_images(loaded), Annotations()
        fitted = [fit_image(im, self.max_image_side) for im in loaded]
        self.images = [im for im, _ in fitted]
        self.original_sizes = [im.size for im in loaded]
        self.annotations = scale_annotations(annotations, [scale for _, scale in fitted])
        self.record = record
        self._index = index
        user_text = "\n".join(filter(None, [prompts.question_prompt(record),
                                             frame_note(self.original_sizes, self.images)]))
        self.messages = [
            {"role": "system", "content": self.system_prompt},
            _user_message(user_text, range(len(self.images))),
        ]
        obs = {"text": user_text, "images": tuple(self._as_array(im) for im in self.images)}
        info = {
            "record_id": record.id,
            "index": index,
            "dataset": record.dataset,
            "answer_type": record.answer_type.value,
            "modality": record.modality,
            "organ": record.organ,
            "question": record.question,
            "options": dict(record.options),
            "system_prompt": self.system_prompt,
            "tools": self.toolbox.openai_tools(),
            "messages": copy.deepcopy(self.messages),
        }
        return obs, info

    def step(self, action: str):
        """Take the model's whole turn.

        Returns ``(observation, reward, terminated, truncated, info)``:

        * ``terminated`` -- the turn gave a final answer; ``reward`` is the reward function's total.
        * ``truncated`` -- ``max_turns`` tool turns were used and this turn did not answer;
          ``reward`` is the reward for "no answer" (``info["end_reason"] == "max_turns"``).
        * otherwise ``reward`` is 0, or ``format_penalty`` for a turn that neither called a tool
          nor answered.

        Info keys: ``turn``, ``parsed`` (think / tool_calls / answers / errors), ``format_errors``,
        ``tool_calls`` (per call: name, arguments, text, error, data, latency_s, cached,
        new_image_indices), ``end_reason`` (``"answer"``, ``"max_turns"`` or ``None``) and, when the
        episode ends: ``answer``, ``ground_truth``, ``correct``, ``format_ok``,
        ``reward_components``, ``record_id``, ``answer_type``.
        """
        if self.record is None:
            raise EnvStateError("Cannot call step() before reset().")
        if self.done:
            raise EnvStateError("The episode has ended; call reset() before step().")
        self.turn += 1
        # one cap for str (characters) and bytes (bytes); the parser is linear in what it reads
        parsed = parse_action(action, self.protocol, max_chars=self.max_action_chars)
        self.messages.append({"role": "assistant", "content": parsed.raw})
        info: dict[str, Any] = {"turn": self.turn, "parsed": parsed.to_dict(),
                                "format_errors": list(parsed.errors), "tool_calls": [], "end_reason": None}

        if parsed.kind == "answer":
            return self._finish(parsed, info, end_reason="answer")
        if self.tool_turns >= self.max_turns:
            return self._finish(parsed, info, end_reason="max_turns")

        self.tool_turns += 1
        parts, new_images = [], []
        if parsed.kind == "tool_call":
            for call in parsed.tool_calls:
                record = self.toolbox.call(call, self.images, self._tool_context())
                first_new = len(self.images)
                shown = [fit_image(im, self.max_image_side)[0] for im in record.result.images]
                self.images.extend(shown)
                new_images.extend(shown)
                indices = list(range(first_new, len(self.images)))
                entry = record.to_dict()
                entry["new_image_indices"] = indices
                info["tool_calls"].append(entry)
                suffix = f" New image: {', '.join(f'image {i}' for i in indices)}." if indices else ""
                parts.append(f"[{call.name}] {record.result.text}{suffix}")
        if parsed.errors:
            parts.append("Format problem: " + " ".join(parsed.errors))
        if parsed.kind == "invalid" and not parsed.errors:
            parts.append(f"No tool call and no final answer found. {self.protocol.instruction}")
        parts.append(prompts.turns_left_note(self.max_turns - self.tool_turns))
        obs_text = prompts.wrap_observation(parts, self.observation_style)
        first_index = len(self.images) - len(new_images)
        self.messages.append(self._observation_message(obs_text, range(first_index, len(self.images))))
        self.trace.append({"turn": self.turn, "action": parsed.to_dict(), "observation": obs_text,
                           "tool_calls": info["tool_calls"]})
        reward = self.format_penalty if parsed.kind == "invalid" else 0.0
        obs = {"text": obs_text, "images": tuple(self._as_array(im) for im in new_images)}
        return obs, float(reward), False, False, info

    # ------------------------------------------------------------------------------------------
    def _finish(self, parsed: ParsedAction, info: dict[str, Any], end_reason: str):
        from rewards.base import RewardInput

        record = self.record
        self.done = True
        tool_log = [c for t in self.trace for c in t["tool_calls"]]
        self.trace.append({"turn": self.turn, "action": parsed.to_dict(), "observation": None, "tool_calls": []})
        info.update({"end_reason": end_reason, "answer": parsed.answer, "ground_truth": record.answer,
                     "format_ok": parsed.format_ok, "record_id": record.id, "answer_type": record.answer_type.value})
        sample = RewardInput(
            completion=parsed.raw,
            answer=parsed.answer,
            ground_truth=record.answer,
            answer_type=record.answer_type,
            options=dict(record.options),
            format_ok=parsed.format_ok,
            metadata={
                "record_id": record.id, "question": record.question, "modality": record.modality,
                "dataset": record.dataset, "tool_calls": tool_log,
                "annotations": self.annotations.to_dict(), "image_paths": list(record.image_paths),
                "trajectory": [m["content"] for m in self.messages if m["role"] == "assistant"],
                "end_reason": end_reason,
                # accepted alternatives (VQA-Med's '#'): the "alternatives" reward scores the best of them
                "answer_alternatives": list(record.metadata.get("answer_alternatives") or ()),
            },
        )
        obs = {"text": "", "images": ()}
        if self.defer_reward:
            info["reward_input"] = sample
            return obs, 0.0, end_reason == "answer", end_reason != "answer", info
        reward = apply_reward(info, self.reward_fn([sample])[0])
        return obs, reward, end_reason == "answer", end_reason != "answer", info

    def _tool_context(self):
        from tool_backends.base import ToolContext

        r = self.record
        return ToolContext(record_id=r.id, dataset=r.dataset, annotations=self.annotations, question=r.question)

    def _observation_message(self, text: str, image_indices) -> dict[str, Any]:
        if self.observation_style == "tool_role":
            msg = {"role": "tool", "content": text}
            if len(image_indices):
                msg["images"] = list(image_indices)
            return msg
        return _user_message(text, image_indices)

    def _as_array(self, image: Image.Image) -> np.ndarray:
        """A new array of an episode image's pixels (already fitted to ``max_image_side``); a
        record image's is a memcpy of the array its ``ImageCache`` keeps, ~4x cheaper than PIL's
        (or that array itself, read-only, when ``copy_observation_images`` is off)."""
        if self.image_ablation == "blank_policy":  # the agent sees black; the tools saw the real image
            return np.zeros((image.height, image.width, 3), dtype=np.uint8)
        pixels = image_pixels(image)
        if pixels is not None:
            return pixels.copy() if self.copy_observation_images else pixels
        return np.array(image if image.mode == "RGB" else image.convert("RGB"), dtype=np.uint8)

    def render(self):
        """An RGB picture of the episode: images with zoom boxes, masks and grounding boxes, and
        the turns' text. ``None`` unless ``render_mode="rgb_array"``."""
        if self.render_mode != "rgb_array":
            return None
        from medvqa_env.render import render_episode

        return render_episode(self)

    def close(self) -> None:
        services = getattr(self, "services", None)
        if services is not None and self._owns_services:
            services.close()


def apply_reward(info: dict[str, Any], result: Any) -> float:
    """Write a :class:`rewards.RewardOutput` into a terminal step's ``info`` (``reward_components``,
    ``correct``) and return the reward. The env does this at once; a caller that deferred the
    scoring (``defer_reward=True``) does it after scoring ``info.pop("reward_input")`` in a batch."""
    components = dict(result.components)
    info["reward_components"] = components
    info["correct"] = bool(components.get("accuracy", 0.0) >= 1.0) if "accuracy" in components else None
    return 0.0 if result.total is None else float(result.total)


def _user_message(text: str, image_indices) -> dict[str, Any]:
    """OpenAI-style content list; images are referred to by their episode index."""
    content: list[dict[str, Any]] = [{"type": "image", "image_index": i} for i in image_indices]
    content.append({"type": "text", "text": text})
    return {"role": "user", "content": content}


def _resolve_dataset(dataset, split, options) -> VQADataset:
    if isinstance(dataset, VQADataset):
        return dataset
    if isinstance(dataset, Sequence) and not isinstance(dataset, str):
        return VQADataset(list(dataset))
    from medvqa_env.datasets import load_dataset

    return load_dataset(dataset, split=split, **dict(options or {}))
