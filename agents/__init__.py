"""Agents: anything that turns a conversation into the next turn (VLMs, endpoints, baselines).

>>> from agents import build_agent
>>> build_agent("random", seed=0).name
'random'

Heavy agents (``OpenAIAgent``, ``TextLLMAgent``, ``VLMAgent``, ``DiscreteMedVQA``) are imported on
first access, so ``import agents`` does not load torch or httpx.
"""

from agents.base import Agent
from agents.baselines import AnswerPriorAgent, OracleAgent, RandomAgent, ToolThenAnswerAgent
from agents.registry import available_agents, build_agent, register_agent

_LAZY = {
    "OpenAIAgent": "agents.openai_agent",
    "EndpointError": "agents.openai_agent",
    "TextLLMAgent": "agents.text_llm",
    "VLMAgent": "agents.vlm",
    "DiscreteMedVQA": "agents.sb3_wrapper",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agents' has no attribute {name!r}")


__all__ = ["Agent", "AnswerPriorAgent", "OracleAgent", "RandomAgent", "ToolThenAnswerAgent", "available_agents",
           "build_agent", "register_agent", *_LAZY]
