"""Rewards: rule (CLOSED/MCQ), ARMed (OPEN), MediX-R1, GRASP and tool-use shaping, batched."""

from rewards.base import ByAnswerType, RewardFunction, RewardInput, RewardOutput, WeightedSum
from rewards.registry import available_rewards, build_reward, register_reward
from rewards.rule import ExactMatchReward, RuleReward, answer_matches


def default_reward() -> RewardFunction:
    """Seed 000's reward: rule ±1 for CLOSED and MCQ, ARMed for OPEN (exact match if ARMed's
    metric libraries are not installed)."""
    try:
        return build_reward("default")
    except ImportError:  # the `rewards` extra (torch, bert-score, ...) is not installed
        rule = RuleReward()
        return ByAnswerType(closed=rule, mcq=rule, open=ExactMatchReward())


__all__ = ["ByAnswerType", "RewardFunction", "RewardInput", "RewardOutput", "WeightedSum", "RuleReward",
           "ExactMatchReward", "answer_matches", "available_rewards", "build_reward", "default_reward",
           "register_reward"]
