"""MedVQA-Gym: a multi-turn Gymnasium environment for tool-using medical VLM agents.

>>> import gymnasium as gym, medvqa_env
>>> "MedVQA-v0" in gym.registry
True
"""

from gymnasium.envs.registration import register

from medvqa_env.env import MedVQAEnv
from medvqa_env.parser import ParsedAction, ToolCall, parse_action
from medvqa_env.records import AnswerType, VQADataset, VQARecord

register(id="MedVQA-v0", entry_point="medvqa_env.vector:make_env",
         vector_entry_point="medvqa_env.vector:MedVQAVectorEnv", max_episode_steps=None)

__all__ = ["MedVQAEnv", "ParsedAction", "ToolCall", "parse_action", "AnswerType", "VQADataset", "VQARecord"]
__version__ = "0.1.0"
