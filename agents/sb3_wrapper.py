"""``DiscreteMedVQA``: MedVQAEnv for classic RL libraries (Stable-Baselines3 2.9, CleanRL).

SB3 cannot take text actions or text observations, so this wrapper turns the env into fixed
spaces -- the **same** env, tools and reward underneath; every action becomes the text turn a
model would have written.

Actions (``Discrete(n)``), see :meth:`DiscreteMedVQA.action_meanings`:

* ``0 .. len(answers)-1``: answer ``answers[i]`` (``\\boxed{...}``); the vocabulary is "yes",
  "no", the MCQ letters and the most common open answers of a training split
  (:func:`answer_vocabulary`);
* then, for each tool that takes a box (``image_zoom_in``, ``segment``, ...), one action per cell
  of a ``grid x grid`` partition of the current image plus one "centre half" action.

Observations (``Dict`` of ``Box``, SB3's ``MultiInputPolicy`` takes it as is):

* ``"image"``: the newest episode image (the original, then each crop), resized to
  ``image_size x image_size``, grey ``(1, S, S)`` or RGB ``(3, S, S)`` ``uint8``;
* ``"features"``: ``float32`` in ``[0, 1]``: answer type one-hot (3), organ one-hot (4), tool
  turns used / left, last tool call ok / failed / gave an image, the last zoom region (4, as
  fractions), MCQ option count, and a hashed bag of the question's words (``question_buckets``).

Many copies (SB3's ``DummyVecEnv``): :func:`make_sb3_vec_env` hands every copy one
:class:`~medvqa_env.services.EnvServices` (one reward, so one set of ARMed thresholds, and one
toolbox), and :func:`end_batch_callback` ends a batch after each PPO rollout, as the GRPO trainers do.
Copies in ``SubprocVecEnv`` workers cannot share an in-process reward: each scores alone.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Any, Iterable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from PIL import Image

from agents.baselines import fill_arguments, format_answer, format_tool_call, normalize_answer
from medvqa_env.env import MedVQAEnv
from medvqa_env.records import AnswerType, VQARecord

ANSWER_TYPES = ("CLOSED", "OPEN", "MCQ")
ORGANS = ("HEAD", "CHEST", "ABD")
_WORD_RE = re.compile(r"[a-z0-9]+")
N_STATE_FEATURES = 3 + 4 + 2 + 3 + 4 + 1


def answer_vocabulary(records: Iterable[VQARecord], n_open: int = 32) -> list[str]:
    """``["yes", "no", <MCQ letters>, <the n_open most common open answers>]``.

    >>> from medvqa_env.records import VQARecord
    >>> recs = [VQARecord(str(i), ("x.png",), "q", a, t, "d") for i, (a, t) in
    ...         enumerate([("Yes", "CLOSED"), ("CT", "OPEN"), ("ct", "OPEN"), ("Left lung", "OPEN")])]
    >>> answer_vocabulary(recs, n_open=1)
    ['yes', 'no', 'ct']
    """
    letters: set[str] = set()
    open_counts: Counter = Counter()
    for r in records:
        if r.answer_type is AnswerType.MCQ:
            letters.update(k.strip().upper() for k in r.options)
        elif r.answer_type is AnswerType.OPEN:
            open_counts[normalize_answer(r.answer)] += 1
    vocab = ["yes", "no"] + sorted(letters)
    vocab += [a for a, _ in open_counts.most_common() if a not in vocab][: max(0, int(n_open))]
    return vocab


def hashed_words(text: str, buckets: int) -> np.ndarray:
    """A binary bag of words, hashed stably (the same across processes) into ``buckets`` bins.

    >>> v = hashed_words("Is there a fracture?", 8)
    >>> v.shape, bool(v.sum() <= 4), bool((v == hashed_words("fracture there is a", 8)).all())
    ((8,), True, True)
    """
    out = np.zeros(buckets, dtype=np.float32)
    for w in _WORD_RE.findall(text.lower()):
        h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest(), "little")
        out[h % buckets] = 1.0
    return out


class DiscreteMedVQA(gym.Wrapper):
    """Discrete actions and Box observations over a :class:`MedVQAEnv` (see the module docstring).

    Args:
        env: the env to wrap (its tools, reward, max_turns and protocol are used unchanged).
        answers: the answer vocabulary; default :func:`answer_vocabulary` of ``answer_source``.
        answer_source: records to learn the vocabulary from (the train split); default the
            wrapped env's own dataset.
        image_size, grey: the image observation's side and channels.
        grid: box tools get ``grid * grid`` cell actions plus a centre-half action.
        question_buckets: size of the hashed question bag of words.
    """

    def __init__(self, env: MedVQAEnv, answers: Sequence[str] | None = None,
                 answer_source: Iterable[VQARecord] | None = None, n_open_answers: int = 32,
                 image_size: int = 64, grey: bool = True, grid: int = 3, question_buckets: int = 64) -> None:
        if not isinstance(getattr(env, "unwrapped", None), MedVQAEnv):
            raise ValueError(f"expected a MedVQAEnv to wrap, got {type(getattr(env, 'unwrapped', env)).__name__}")
        if image_size < 8 or grid < 1 or question_buckets < 1:
            raise ValueError(f"expected image_size >= 8, grid >= 1, question_buckets >= 1, got "
                             f"{image_size!r}, {grid!r}, {question_buckets!r}")
        super().__init__(env)
        base: MedVQAEnv = env.unwrapped
        self.answers = list(answers) if answers is not None else answer_vocabulary(
            answer_source if answer_source is not None else base.dataset, n_open_answers)
        if not self.answers:
            raise ValueError("expected a non-empty answer vocabulary")
        self.image_size, self.grey, self.grid = int(image_size), bool(grey), int(grid)
        self.question_buckets = int(question_buckets)
        self.box_tools = [s for s in base.toolbox.specs if _takes_box(s.parameters)]
        self.regions = _grid_regions(self.grid)
        self._actions: list[tuple[str, Any]] = [("answer", a) for a in self.answers]
        self._actions += [("tool", (spec, region)) for spec in self.box_tools for region in self.regions]
        channels = 1 if self.grey else 3
        self.action_space = spaces.Discrete(len(self._actions))
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (channels, self.image_size, self.image_size), np.uint8),
            "features": spaces.Box(0.0, 1.0, (N_STATE_FEATURES + self.question_buckets,), np.float32),
        })
        self._info: dict[str, Any] = {}
        self._last = {"ok": 0.0, "error": 0.0, "image": 0.0, "region": (0.0, 0.0, 0.0, 0.0)}

    # ------------------------------------------------------------------------------------------
    def action_meanings(self) -> list[str]:
        """A readable name per action index, e.g. ``answer:yes``, ``image_zoom_in:cell(0,2)``."""
        names = []
        for kind, what in self._actions:
            if kind == "answer":
                names.append(f"answer:{what}")
            else:
                spec, (label, _) = what
                names.append(f"{spec.name}:{label}")
        return names

    def action_text(self, action: int) -> str:
        """The text turn action ``action`` stands for (what the wrapped env receives)."""
        if not self.action_space.contains(action):
            raise ValueError(f"expected an action in 0..{self.action_space.n - 1}, got {action!r}")
        kind, what = self._actions[int(action)]
        base: MedVQAEnv = self.env.unwrapped
        if kind == "answer":
            answer = what
            options = self._info.get("options") or {}
            if self._info.get("answer_type") == "MCQ" and answer not in options and answer.upper() in options:
                answer = answer.upper()
            return format_answer(answer, base.protocol.name)
        spec, (_, box) = what
        image_index = len(base.images) - 1
        args = fill_arguments(spec.parameters, box, base.images[image_index].size, text=_subject(self._info))
        if "image_index" in spec.parameters.get("properties", {}):
            args["image_index"] = image_index
        return format_tool_call(spec.name, args)

    # ------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _, info = self.env.reset(seed=seed, options=options)
        self._info = info
        self._last = {"ok": 0.0, "error": 0.0, "image": 0.0, "region": (0.0, 0.0, 0.0, 0.0)}
        return self._observation(), info

    def step(self, action):
        text = self.action_text(action)
        _, reward, terminated, truncated, info = self.env.step(text)
        info = dict(info, action_text=text)
        calls = info.get("tool_calls") or []
        if calls:
            last = calls[-1]
            region = (last.get("data") or {}).get("region")
            self._last = {"ok": float(last.get("error") is None), "error": float(last.get("error") is not None),
                          "image": float(bool(last.get("new_image_indices"))),
                          "region": self._normalise_region(region, last) if region else self._last["region"]}
        return self._observation(), float(reward), bool(terminated), bool(truncated), info

    # ------------------------------------------------------------------------------------------
    def _normalise_region(self, region, call) -> tuple[float, float, float, float]:
        base: MedVQAEnv = self.env.unwrapped
        source = (call.get("data") or {}).get("image_index", 0)
        w, h = base.images[source].size if 0 <= source < len(base.images) else base.images[0].size
        x0, y0, x1, y1 = region
        return tuple(float(np.clip(v, 0.0, 1.0)) for v in (x0 / w, y0 / h, x1 / w, y1 / h))

    def _observation(self) -> dict[str, np.ndarray]:
        base: MedVQAEnv = self.env.unwrapped
        image = base.images[-1] if base.images else Image.new("RGB", (self.image_size, self.image_size))
        image = image.convert("L" if self.grey else "RGB").resize((self.image_size, self.image_size),
                                                                 Image.Resampling.BILINEAR, reducing_gap=2.0)
        pixels = np.asarray(image, dtype=np.uint8)
        pixels = pixels[None] if self.grey else pixels.transpose(2, 0, 1)
        info = self._info
        state = np.zeros(N_STATE_FEATURES, dtype=np.float32)
        kind = info.get("answer_type")
        if kind in ANSWER_TYPES:
            state[ANSWER_TYPES.index(kind)] = 1.0
        organ = str(info.get("organ") or "").upper()
        state[3 + (ORGANS.index(organ) if organ in ORGANS else 3)] = 1.0
        used = base.tool_turns / max(1, base.max_turns)
        state[7:9] = (min(1.0, used), float(base.tool_turns >= base.max_turns))
        state[9:12] = (self._last["ok"], self._last["error"], self._last["image"])
        state[12:16] = self._last["region"]
        state[16] = min(1.0, len(info.get("options") or {}) / 8)
        words = hashed_words(str(info.get("question", "")), self.question_buckets)
        return {"image": np.ascontiguousarray(pixels), "features": np.concatenate([state, words])}


def _takes_box(parameters) -> bool:
    props = (parameters or {}).get("properties", {})
    return any(p.get("type") == "array" and (p.get("minItems") == 4 or k in ("bbox", "box"))
               for k, p in props.items())


def _grid_regions(grid: int) -> list[tuple[str, tuple[float, float, float, float]]]:
    """``grid * grid`` cells (as fractions) plus the centre half of the image."""
    step = 1.0 / grid
    cells = [(f"cell({r},{c})", (c * step, r * step, (c + 1) * step, (r + 1) * step))
             for r in range(grid) for c in range(grid)]
    return cells + [("centre", (0.25, 0.25, 0.75, 0.75))]


def _subject(info: dict[str, Any]) -> str:
    words = _WORD_RE.findall(str(info.get("question", "")).lower())
    return " ".join(words[-2:]) or "abnormality"


def make_sb3_env(dataset: Any = "embedded", split: str = "train", answer_source: Iterable[VQARecord] | None = None,
                 wrapper_options: dict[str, Any] | None = None, **env_options: Any) -> DiscreteMedVQA:
    """``DiscreteMedVQA(MedVQAEnv(dataset, split, **env_options), ...)`` in one call."""
    return DiscreteMedVQA(MedVQAEnv(dataset=dataset, split=split, **env_options), answer_source=answer_source,
                          **(wrapper_options or {}))


def make_sb3_vec_env(n_envs: int, dataset: Any = "embedded", split: str = "train", tools: Any = None,
                     reward: Any = None, wrapper_options: dict[str, Any] | None = None, **env_options: Any):
    """``(DummyVecEnv of n_envs DiscreteMedVQA copies, their EnvServices)``: the copies share one
    reward and toolbox; pass ``end_batch_callback(services)`` to ``model.learn`` so the reward's
    adaptive state moves once per rollout. Close the services after the vec env."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from medvqa_env.datasets import load_dataset
    from medvqa_env.services import EnvServices

    if not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"expected n_envs >= 1, got {n_envs!r}")
    records = load_dataset(dataset, split=split) if isinstance(dataset, str) else dataset
    services = EnvServices.build(tools=tools, reward=reward, dataset=records)
    options = dict(wrapper_options or {})
    options.setdefault("answers", answer_vocabulary(records, options.pop("n_open_answers", 32)))

    def one() -> DiscreteMedVQA:
        return DiscreteMedVQA(MedVQAEnv(dataset=records, services=services, **env_options), **options)
    return DummyVecEnv([one] * n_envs), services


def end_batch_callback(services: Any):
    """An SB3 callback: ``services.end_batch(k)`` after the k-th rollout (the batch PPO learns from),
    so the copies' shared reward state moves once per batch and never while a rollout is scored."""
    from stable_baselines3.common.callbacks import BaseCallback

    class EndBatch(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.batches = 0

        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            moved = services.end_batch(self.batches)
            self.batches += 1
            for name, value in _flat(moved):
                self.logger.record(f"reward_state/{name}", value)

    return EndBatch()


def _flat(tree: Any, prefix: str = ""):
    """``(slash-joined name, number)`` leaves of an ``end_batch`` result, for the logger."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}/{k}" if prefix else str(k))
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield prefix, float(tree)
