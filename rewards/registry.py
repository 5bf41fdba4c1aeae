"""Named rewards: ``build_reward("armed")``, ``build_reward("default+tools")``.

The env resolves a string ``reward=`` through :func:`build_reward`. Names:

* ``default`` -- seed 000: rule ±1 for CLOSED/MCQ, ARMed for OPEN.
* ``rule`` -- rule ±1 for every type; ``exact_match`` -- normalised exact match ±1.
* ``armed`` -- ARMed for every sample (options go to :class:`rewards.armed.ARMedConfig`).
* ``medix`` -- the MediX-R1 composite (needs ``judge=`` options or a judge URL; see below).
* ``grasp`` -- the GRASP reward.
* ``alternatives`` -- another reward (``reward=``, default ``default``) scored against the record's
  answer and each accepted alternative (VQA-Med's ``#``), keeping the best, as the official VQA-Med
  evaluations do (:mod:`rewards.alternatives`): ``"alternatives:reward=armed"``.

Append ``+tools`` to any name for tool-use shaping (:class:`rewards.shaping.ToolUseShaping`),
e.g. ``build_reward("default+tools")``; shaping options go in ``tool_shaping={...}``.

>>> build_reward("rule").name
'rule'
>>> build_reward("rule+tools").name
'rule+tools'
>>> build_reward("rule:correct=2").correct
2.0
>>> build_reward("armd")
Traceback (most recent call last):
...
medvqa_env.errors.ConfigError: Unknown reward 'armd'. Available: ['alternatives', 'armed', 'default', 'exact_match', 'grasp', 'medix', 'rule']. Did you mean 'armed'?
"""

from __future__ import annotations

from typing import Any, Callable

from medvqa_env.errors import ConfigError
from medvqa_env.registry import Registry
from rewards.base import ByAnswerType, RewardFunction

RewardFactory = Callable[..., RewardFunction]
REWARDS: Registry[RewardFunction] = Registry("reward")
SHAPING_SUFFIX = "+tools"


def register_reward(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator: register ``factory(**options) -> RewardFunction`` under ``name``."""
    if SHAPING_SUFFIX in name:
        raise ConfigError(f"expected a reward name without {SHAPING_SUFFIX!r}, got {name!r}")
    return REWARDS.register(name)


def available_rewards() -> list[str]:
    """Registered base names (each also exists with ``+tools``)."""
    return REWARDS.names()


def build_reward(name: str | dict, *, tool_shaping: dict[str, Any] | None = None, **options: Any) -> RewardFunction:
    """Build the reward ``name`` (optionally ``<name>+tools``) with ``options``. ``name`` may carry
    its options in the one config language (:mod:`medvqa_env.config`): ``"armed:alpha=0.5"`` or
    ``{"name": "armed", "alpha": 0.5}``."""
    from medvqa_env.config import parse_spec

    if not isinstance(name, (str, dict)):
        raise ConfigError(f"expected a reward name (str), got {name!r}")
    name, spec_options = parse_spec(name, "reward")
    options = {**spec_options, **options}
    if tool_shaping is None and isinstance(options.get("tool_shaping"), dict):
        tool_shaping = options.pop("tool_shaping")
    base_name, shaped = name, False
    if name.endswith(SHAPING_SUFFIX):
        base_name, shaped = name[: -len(SHAPING_SUFFIX)], True
    if tool_shaping is not None and not shaped:
        raise ConfigError(f"tool_shaping options given but {name!r} has no {SHAPING_SUFFIX!r} suffix")
    reward = REWARDS.build(base_name, **options)
    if shaped:
        from rewards.shaping import ToolUseShaping

        try:
            reward = ToolUseShaping(reward, **(tool_shaping or {}))
        except TypeError as e:
            raise ConfigError(f"bad tool_shaping options: {e}") from None
    return reward


# -- built-in rewards (model-backed ones import lazily and load on first use) ---------------------
@register_reward("default")
def _default(**armed_options: Any) -> RewardFunction:
    from rewards.armed import ARMedReward
    from rewards.rule import RuleReward

    rule = RuleReward()
    return ByAnswerType(closed=rule, mcq=rule, open=ARMedReward(**armed_options))


@register_reward("rule")
def _rule(correct: float = 1.0, incorrect: float = -1.0) -> RewardFunction:
    from rewards.rule import RuleReward

    return RuleReward(correct, incorrect)


@register_reward("exact_match")
def _exact(**options: Any) -> RewardFunction:
    from rewards.rule import ExactMatchReward

    return ExactMatchReward(**options)


@register_reward("armed")
def _armed(**options: Any) -> RewardFunction:
    from rewards.armed import ARMedReward

    return ARMedReward(**options)


@register_reward("medix")
def _medix(**options: Any) -> RewardFunction:
    from rewards.medix import MediXReward

    return MediXReward(**options)


@register_reward("grasp")
def _grasp(**options: Any) -> RewardFunction:
    from rewards.grasp import GRASPReward

    return GRASPReward(**options)


@register_reward("alternatives")
def _alternatives(reward: str | dict = "default", **options: Any) -> RewardFunction:
    from rewards.alternatives import BestOfAlternatives

    if isinstance(reward, str) and reward.partition(":")[0] == "alternatives":
        raise ConfigError("expected the reward to score alternatives with, got 'alternatives' itself")
    return BestOfAlternatives(build_reward(reward, **options))
