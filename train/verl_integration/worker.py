"""verl's TransferQueue agent-loop worker, with the validate flag our agent loop needs.

verl's v1 trainer (``TaskRunnerV1``) runs agent loops in ``AgentLoopWorkerTQ`` Ray actors, which
put each finished episode into TransferQueue (``AgentLoopOutput.as_dict`` -> a tensordict). The
trainer picks the manager (and so the worker class) from
``actor_rollout_ref.rollout.agent.agent_loop_manager_class``; :class:`MedVQAAgentLoopManager` is
verl's ``AgentLoopManagerTQ`` with :class:`MedVQAAgentLoopWorkerTQ`, which hands the agent loop the
``validate`` flag (verl keeps it in the trajectory info only), so validation episodes score against
frozen thresholds and never feed the batch boundary
(:func:`train.verl_integration.reward_state.reward_for_step`).

Our ``extra_fields`` (the nested ``medvqa`` summary, variable-length ``turn_scores``) go into
TransferQueue as they are: tensordict 0.10 stores each sample's dict as non-tensor data and
TransferQueue 0.1.11 returns it intact (``tests/train/test_verl_trainer_cpu.py`` checks the
round trip).
"""

from __future__ import annotations

from typing import Any

import ray
from verl.experimental.agent_loop import AgentLoopWorker
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

# The row keyword that tells the agent loop an episode is validation (verl's own "validate" is the
# positional argument of _agent_loop_postprocess, so the name must differ).
VALIDATE_KEY = "medvqa_validate"


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
        return await super()._agent_loop_postprocess(output, validate, **kwargs)


MedVQAAgentLoopWorkerTQ = ray.remote(_Worker)


class MedVQAAgentLoopManager(AgentLoopManagerTQ):
    """verl's ``AgentLoopManagerTQ`` whose workers are :class:`MedVQAAgentLoopWorkerTQ`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = MedVQAAgentLoopWorkerTQ
