"""The run's reward state inside verl: batch boundaries, validation, checkpoints, an episode log.

ARMed's adaptive thresholds move only at an explicit batch end (:mod:`rewards.adaptive`). Under
verl the state lives in one named Ray actor (``threshold_store="ray"``, the default under Ray), fed
by every agent-loop worker. verl's *sync* trainer (``trainer.v1.trainer_mode=sync``, the default)
runs step k's rollouts to completion before step k+1's begin, and every row of a batch carries
``global_steps``; so:

* :func:`reward_for_step` -- the first trajectory of step k (in each worker process) calls
  ``end_batch(k - 1)``; the call is idempotent per id, so the thresholds move once, and every
  trajectory of step k is scored against the same thresholds. Validation rows (``validate``) get a
  frozen copy: the thresholds in force, in a local reward whose queued values are never used --
  validation never moves anything.
* :class:`RewardStateCheckpoint` -- verl's ``trainer.checkpoint_callback_class``: writes the reward's
  ``state_dict`` to ``global_step_<k>/medvqa_reward_state.json`` beside verl's actor checkpoint and,
  when the trainer is built, loads it from the checkpoint verl will resume from.
* :func:`episode_log` -- ``medvqa.episode_log_dir``: one JSON line per episode with what the env
  computed (the reward, its components, the tool calls), to compare with what reached verl.

With the async trainers (``colocate_async``/``separate_async``) trajectories of two steps overlap,
and the boundary is only as sharp as verl's step tags.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Mapping

from train.verl_integration.config import plain

logger = logging.getLogger(__name__)

STATE_FILE = "medvqa_reward_state.json"
_LOCK = threading.Lock()
_ENDED: dict[str, int] = {}  # reward key -> last batch this process has ended
_FROZEN: dict[str, tuple[Any, Any]] = {}  # reward key -> (global step, frozen reward)


def _key(options: Mapping[str, Any]) -> str:
    return json.dumps(dict(options), sort_keys=True, default=str)


def end_previous_batch(reward: Any, global_steps: int, key: str = "") -> None:
    """``reward.end_batch(global_steps - 1)`` once per process and step (the owner is idempotent too)."""
    previous = int(global_steps) - 1
    with _LOCK:
        if _ENDED.get(key, -1) >= previous:
            return
        _ENDED[key] = previous
    moved = reward.end_batch(previous)
    logger.info("step %d begins: ended reward batch %d (%s)", previous + 1, previous, moved)


def frozen_copy(reward_options: Mapping[str, Any], shared: Any) -> Any:
    """A process-local reward holding ``shared``'s current state, for scoring validation."""
    from train.verl_integration.reward import build_reward

    local = build_reward(**{**dict(reward_options), "threshold_store": "local"})
    local.load_state_dict(shared.state_dict())
    return local


def reward_for_step(reward_options: Mapping[str, Any], global_steps: Any, validate: bool) -> Any:
    """The reward an episode of verl step ``global_steps`` is scored with (see the module docstring)."""
    from train.verl_integration.reward import shared_reward

    shared = shared_reward(**dict(reward_options))
    if global_steps is None:  # not called by verl's trainer (tests, other workers): no boundary
        return shared
    step, key = int(global_steps), _key(reward_options)
    if not validate:
        end_previous_batch(shared, step, key)
        return shared
    with _LOCK:
        cached = _FROZEN.get(key)
        if cached is not None and cached[0] == step:
            return cached[1]
    frozen = frozen_copy(reward_options, shared)
    with _LOCK:
        _FROZEN[key] = (step, frozen)
    return frozen


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def resume_folder(trainer_config: Any) -> str | None:
    """The ``global_step_<k>`` folder verl's trainer will resume from (its ``_load_checkpoint`` rule)."""
    t = trainer_config
    if t.resume_mode == "disable":
        return None
    if t.resume_mode == "resume_path":
        folder = str(t.resume_from_path)
    else:
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

        root = str(t.default_local_dir)
        folder = find_latest_ckpt_path(root if os.path.isabs(root) else os.path.join(os.getcwd(), root))
    if not folder:
        return None
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)


def _callback_base():
    try:
        from verl.trainer.ppo.checkpoint_callback import CheckpointCallback

        return CheckpointCallback
    except ImportError:  # verl absent: the class is still importable (and testable) without it
        return object


class RewardStateCheckpoint(_callback_base()):
    """``trainer.checkpoint_callback_class``: the reward state goes into verl's checkpoints.

    Built on the trainer's driver before verl loads its own checkpoint; with the state in the Ray
    actor (``threshold_store`` ``ray``/``auto``), what is saved is what every worker contributed.
    """

    def __init__(self, config=None) -> None:
        self.config = config
        from train.verl_integration.config import MEDVQA_DEFAULTS
        from train.verl_integration.reward import shared_reward

        medvqa = plain(config.get("medvqa")) if config is not None and hasattr(config, "get") else None
        self.reward_options = dict((medvqa or {}).get("reward") or MEDVQA_DEFAULTS["reward"])
        self.reward = shared_reward(**self.reward_options)
        self.loaded_from: str | None = None
        folder = resume_folder(config.trainer) if config is not None else None
        if folder:
            self.load(folder)

    def load(self, folder: str) -> bool:
        path = os.path.join(folder, STATE_FILE)
        if not os.path.isfile(path):
            logger.warning("no reward state at %s: the thresholds start fresh", path)
            return False
        with open(path) as f:
            self.reward.load_state_dict(json.load(f))
        self.loaded_from = path
        logger.info("reward state restored from %s", path)
        return True

    def on_save(self, trainer=None, global_step: int = 0, checkpoint_dir: str = "", async_save: bool = False,
                **kwargs: Any) -> None:
        os.makedirs(checkpoint_dir, exist_ok=True)
        path = os.path.join(checkpoint_dir, STATE_FILE)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.reward.state_dict(), f, default=str)
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# What the env computed, per episode
# ---------------------------------------------------------------------------------------------
def episode_log(log_dir: str, output: Any, kwargs: Mapping[str, Any]) -> None:
    """Append one line per episode to ``<log_dir>/episodes.<pid>.jsonl``."""
    summary = dict(output.extra_fields.get("medvqa") or {})
    row = {
        "uid": str(kwargs.get("uid", "")), "session_id": kwargs.get("session_id"),
        "global_steps": kwargs.get("global_steps"), "validate": bool(kwargs.get("medvqa_validate", False)),
        "reward_score": output.reward_score, "turn_scores": list(output.extra_fields.get("turn_scores") or []),
        "response_tokens": len(output.response_ids), "policy_tokens": int(sum(output.response_mask)),
        **summary,
    }
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, f"episodes.{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
