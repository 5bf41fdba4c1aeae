r"""Our reward as verl's custom reward function, and DAPO's overlong shaping.

verl 0.9.1's reward managers (``verl.experimental.reward_loop.reward_manager.naive``) call::

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)

and accept a float or a dict with ``"score"`` (every other key is logged per sample, so the keys
must be the same for every sample). Point verl at it with
``reward.custom_reward_function.path=<this file> reward.custom_reward_function.name=compute_score``.

``solution_str`` is the whole decoded response of a multi-turn rollout (model turns *and* the
observations between them); the answer is read from the final model turn, i.e. the text after
the last ``</observation>``. The score is :func:`rewards.default_reward` (rule ±1 for CLOSED/MCQ,
ARMed for OPEN; the record's accepted alternatives, ``extra_info["answer_alternatives"]``, credited
as the env credits them), the same object the env uses, built once per process so ARMed's adaptive
thresholds carry across calls -- and, inside a Ray job, kept by one named actor for all workers
(:func:`build_reward`).

With our agent loop the env already scores each trajectory (``AgentLoopOutput.reward_score``),
and verl then skips the reward manager; this entry point serves verl's other rollouts (single-turn
validation, ``tool_agent``) and offline re-scoring.

>>> final_turn("<tool_call>{}</tool_call>\nuser\n<observation>\nok\n</observation>\nassistant\n\\boxed{yes}")
'\\boxed{yes}'
>>> overlong_penalty(900, max_response_length=1000, buffer_len=200, penalty_factor=1.0)
-0.5
>>> overlong_penalty(700, max_response_length=1000, buffer_len=200, penalty_factor=1.0)
0.0
"""

from __future__ import annotations

import json
import re
import sys
import threading
from typing import Any, Mapping

from medvqa_env.parser import parse_action
from medvqa_env.records import AnswerType

_OBS_END = "</observation>"
_ROLE_PREFIX = re.compile(r"^\s*(assistant|user|tool)\s*\n", re.IGNORECASE)
_REWARDS: dict[str, Any] = {}
_LOCK = threading.Lock()
SCORE_KEYS = ("score", "acc", "format_ok", "answered")


class _Serialized:
    """A reward callable that runs one batch at a time: env steps run in executor threads, and
    ARMed's running buffers must not be updated by two threads at once."""

    def __init__(self, fn) -> None:
        self.fn, self.name, self._lock = fn, getattr(fn, "name", "reward"), threading.Lock()

    def __call__(self, batch):
        with self._lock:
            return self.fn(batch)

    def end_batch(self, batch_id=None):
        with self._lock:
            return self.fn.end_batch(batch_id)

    def state_dict(self):
        with self._lock:
            return self.fn.state_dict()

    def load_state_dict(self, state) -> None:
        with self._lock:
            self.fn.load_state_dict(state)


def _ray_running() -> bool:
    ray = sys.modules.get("ray")  # not imported means not initialised; avoids importing Ray
    return bool(ray is not None and ray.is_initialized())


def resolve_store(threshold_store: str = "auto") -> str:
    """``auto`` -> ``ray`` inside a Ray job (verl's workers), else ``local``."""
    if threshold_store not in ("auto", "local", "ray"):
        raise ValueError(f"expected threshold_store in ('auto', 'local', 'ray'), got {threshold_store!r}")
    if threshold_store == "auto":
        return "ray" if _ray_running() else "local"
    return threshold_store


def build_reward(threshold_store: str = "auto", armed: Mapping[str, Any] | None = None):
    """:func:`rewards.default_reward` (rule for CLOSED/MCQ, ARMed for OPEN). Under Ray, ARMed's
    adaptive thresholds are owned by one named actor (``threshold_store="ray"``), so verl's
    agent-loop and reward workers all feed and read the same running buffers, as one reward
    manager over the whole batch would; ``armed`` overrides ``ARMedConfig`` fields (e.g. the
    seed's PubMedBERT/BioBERT folders)."""
    store = resolve_store(threshold_store)
    from rewards import default_reward

    armed = dict(armed or {})
    if store == "ray" and _ray_running():
        # every process of the job builds the reward from one config: one name per job finds one actor
        from rewards.adaptive_ray import job_actor_name

        armed.setdefault("ray_actor_name", job_actor_name())
    if store == "local" and not armed:
        return default_reward()
    try:
        from rewards.armed import ARMedReward
    except ImportError:  # ARMed's metric libraries absent: default_reward falls back to exact match
        return default_reward()
    from rewards.base import ByAnswerType
    from rewards.rule import RuleReward

    rule = RuleReward()
    return ByAnswerType(closed=rule, mcq=rule, open=ARMedReward(threshold_store=store, **armed))


def shared_reward(threshold_store: str = "auto", armed: Mapping[str, Any] | None = None):
    """The process-wide reward of :func:`build_reward` for these options (ARMed is stateful and slow
    to build), safe to call from several threads."""
    key = json.dumps({"store": resolve_store(threshold_store), "armed": dict(armed or {})}, sort_keys=True,
                     default=str)
    with _LOCK:
        if key not in _REWARDS:
            if resolve_store(threshold_store) == "local" and _ray_running():
                import warnings

                warnings.warn("threshold_store='local' inside a Ray job: each worker process scores alone with its "
                              "own ARMed thresholds; 'auto' or 'ray' shares one state per run", stacklevel=2)
            _REWARDS[key] = _Serialized(build_reward(threshold_store, armed))
        return _REWARDS[key]


def final_turn(solution_str: str) -> str:
    """The last model turn of a decoded multi-turn response (observations cut away)."""
    text = solution_str.rsplit(_OBS_END, 1)[-1] if _OBS_END in solution_str else solution_str
    return _ROLE_PREFIX.sub("", text, count=1).strip()


def overlong_penalty(response_length: int, max_response_length: int, buffer_len: int,
                     penalty_factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max - buffer`` tokens, then linear down to
    ``-penalty_factor`` at ``max``."""
    if buffer_len <= 0 or buffer_len > max_response_length:
        raise ValueError(f"expected 0 < buffer_len <= {max_response_length}, got {buffer_len!r}")
    expected = max_response_length - buffer_len
    exceed = response_length - expected
    return min(-exceed / buffer_len * penalty_factor, 0.0)


def score_turn(turn: str, ground_truth: str, extra_info: Mapping[str, Any] | None = None,
               reward_fn=None) -> dict[str, float]:
    """Score one final model turn with the env's reward. Returns the :data:`SCORE_KEYS` dict."""
    from rewards.base import RewardInput

    from train.verl_integration.data import options_from_rows

    info = dict(extra_info or {})
    parsed = parse_action(turn, info.get("answer_protocol", "boxed"))
    options = info.get("options") or {}
    if not isinstance(options, Mapping):
        options = options_from_rows(options)
    answer_type = AnswerType.parse(info.get("answer_type") or ("MCQ" if options else "OPEN"))
    sample = RewardInput(
        completion=parsed.raw, answer=parsed.answer, ground_truth=str(ground_truth), answer_type=answer_type,
        options=dict(options), format_ok=parsed.format_ok,
        metadata={k: info[k] for k in ("record_id", "question", "modality", "dataset") if k in info}
        | {"answer_alternatives": [str(a) for a in _listed(info.get("answer_alternatives"))]},
    )
    result = (reward_fn or shared_reward())([sample])[0]
    components = dict(result.components)
    total = 0.0 if result.total is None else float(result.total)
    return {
        "score": total,
        "acc": float(components.get("accuracy", 1.0 if total >= 1.0 else 0.0)),
        "format_ok": float(parsed.format_ok),
        "answered": float(parsed.answer is not None),
    }


def _listed(value: Any) -> list[Any]:
    """A parquet list column as a list (verl may hand a numpy array; absent or None -> [])."""
    return [] if value is None else list(value)


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: Mapping[str, Any] | None = None, **kwargs: Any) -> dict[str, float]:
    """verl's custom reward function (see the module docstring)."""
    del data_source, kwargs  # routing is by extra_info["answer_type"], not by source
    return score_turn(final_turn(solution_str or ""), ground_truth, extra_info)
