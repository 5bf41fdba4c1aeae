"""verl's TransferQueue agent-loop worker, with what our agent loop needs from it.

verl's v1 trainer (``TaskRunnerV1``) runs agent loops in ``AgentLoopWorkerTQ`` Ray actors, which
put each finished episode into TransferQueue (``AgentLoopOutput.as_dict`` -> a tensordict). The
trainer picks the manager (and so the worker class) from
``actor_rollout_ref.rollout.agent.agent_loop_manager_class``; :class:`MedVQAAgentLoopManager` is
verl's ``AgentLoopManagerTQ`` with :class:`MedVQAAgentLoopWorkerTQ`, which adds two things:

* the ``validate`` flag reaches the agent loop (verl keeps it in the trajectory info only), so
  validation episodes score against frozen thresholds and never feed the batch boundary
  (:func:`train.verl_integration.reward_state.reward_for_step`);
* our ``extra_fields`` travel as TransferQueue stores them: per-sample non-tensor data whose
  structure is the same for every sample (:func:`tq_safe_extra_fields`).
"""

from __future__ import annotations

import json
from typing import Any

import ray
from verl.experimental.agent_loop import AgentLoopWorker
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

# The row keyword that tells the agent loop an episode is validation (verl's own "validate" is the
# positional argument of _agent_loop_postprocess, so the name must differ).
VALIDATE_KEY = "medvqa_validate"
# verl reads these from extra_fields itself; they stay as they are.
VERL_KEYS = ("reward_extra_info", "min_global_steps", "max_global_steps", "global_steps", "num_cached_tokens",
             "raw_prompt")


def tq_safe_extra_fields(extra_fields: dict[str, Any]) -> dict[str, Any]:
    """Our nested, variable-length fields as one JSON string each (``medvqa``, ``turn_scores``,
    ``tool_rewards``), verl's own keys untouched.

    TransferQueue stores a batch as a tensordict: every sample's ``extra_fields`` dict goes into a
    ``NonTensorStack``, and tensordict turns nested dicts into sub-tensordicts whose keys must match
    across samples and whose lists become stacked data -- a ``medvqa`` summary with ``None`` in one
    sample and a string in another, or ``turn_scores`` of 1 and 3 turns, do not stack. A string per
    key does, and ``json.loads`` gives the summary back (see ``docs/verl.md``).
    """
    out = {}
    for key, value in extra_fields.items():
        if key in VERL_KEYS or value is None or isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            out[key] = json.dumps(value, default=str)
    return out


class _Worker(AgentLoopWorkerTQ.__ray_actor_class__):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # AgentLoopWorkerTQ.__init__'s zero-argument super() raises "super(type, obj): obj must be an
        # instance or subtype of type" for a subclass of __ray_actor_class__ inside a Ray worker (the
        # module name verl.trainer.ppo.v1.agent_loop_tq.AgentLoopWorkerTQ is the ActorClass, not the
        # class), so its two steps run here, after verl's AgentLoopWorker.__init__.
        import transfer_queue as tq

        AgentLoopWorker.__init__(self, *args, **kwargs)
        tq.init()
        self.background_tasks = set()

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        kwargs[VALIDATE_KEY] = bool(trajectory["validate"])
        return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace,
                                             **kwargs)

    async def _agent_loop_postprocess(self, output, validate, **kwargs) -> None:
        kwargs.pop(VALIDATE_KEY, None)  # ours, not a field of the stored sample
        outputs = output if isinstance(output, list) else [output]
        for o in outputs:
            o.extra_fields = tq_safe_extra_fields(o.extra_fields)
        return await super()._agent_loop_postprocess(output, validate, **kwargs)


MedVQAAgentLoopWorkerTQ = ray.remote(_Worker)
MANAGER_TARGET = "train.verl_integration.worker.MedVQAAgentLoopManager"


class MedVQAAgentLoopManager(AgentLoopManagerTQ):
    """verl's ``AgentLoopManagerTQ`` whose workers are :class:`MedVQAAgentLoopWorkerTQ`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = MedVQAAgentLoopWorkerTQ
