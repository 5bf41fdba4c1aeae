"""Rewards: rule (CLOSED/MCQ), ARMed (OPEN), MediX-R1, GRASP and tool-use shaping, batched."""

from rewards.base import ByAnswerType, RewardFunction, RewardInput, RewardOutput, WeightedSum
from rewards.rule import ExactMatchReward, RuleReward, answer_matches


def default_reward() -> RewardFunction:
    """Seed 000's reward: rule ±1 for CLOSED and MCQ, ARMed for OPEN (exact match if ARMed's
    metric libraries are not installed)."""
    try:
        from rewards.armed import ARMedReward

        open_reward: RewardFunction = ARMedReward()
    except ImportError:
        open_reward = ExactMatchReward()
    rule = RuleReward()
    return ByAnswerType(closed=rule, mcq=rule, open=open_reward)


__all__ = ["ByAnswerType", "RewardFunction", "RewardInput", "RewardOutput", "WeightedSum", "RuleReward",
           "ExactMatchReward", "answer_matches", "default_reward"]
