"""Named agents: ``build_agent("prior", fit_on=train_set)`` -> an :class:`~agents.base.Agent`.

Every factory takes keyword options only; heavy agents (transformers, HTTP) import their modules
lazily, so listing agents costs nothing.

>>> build_agent("random", seed=1).config()["seed"]
1
>>> build_agent("promp")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
medvqa_env.errors.ConfigError: Unknown agent 'promp'. Available: [...]. Did you mean 'prior'?
"""

from __future__ import annotations

from typing import Any, Callable

from agents.base import Agent
from medvqa_env.errors import ConfigError
from medvqa_env.registry import Registry

AgentFactory = Callable[..., Agent]
AGENTS: Registry[Agent] = Registry("agent", {
    # name -> "module:callable" (imported on first use) or a registered factory.
    "random": "agents.baselines:RandomAgent",
    "prior": "agents.registry:_build_prior",
    "zoom-then-answer": "agents.registry:_build_tool_then_answer",
    "oracle": "agents.registry:_build_oracle",
    "openai": "agents.openai_agent:OpenAIAgent",
    "vlm": "agents.vlm:VLMAgent",
    "text-llm": "agents.text_llm:TextLLMAgent",
}, aliases={"answer-prior": "prior", "tool-then-answer": "zoom-then-answer", "endpoint": "openai",
            "qwen-vl": "vlm", "llm": "text-llm"})


def register_agent(name: str) -> Callable[[AgentFactory], AgentFactory]:
    """Decorator: register ``factory(**options) -> Agent`` under ``name``."""
    return AGENTS.register(name)


def available_agents() -> list[str]:
    return AGENTS.names()


def build_agent(name: str, **options: Any) -> Agent:
    """Build agent ``name`` (see :func:`available_agents`) with ``options``."""
    return AGENTS.build(name, **options)


def _load_dataset(value: Any, what: str, split: str):
    """A dataset, ``{"name": ..., "split": ..., **loader options}``, or ``"name"`` / ``"name:split"``
    (the forms a command line can pass)."""
    from medvqa_env.datasets import load_dataset
    from medvqa_env.records import VQADataset

    if isinstance(value, VQADataset):
        return value
    if isinstance(value, dict):
        return load_dataset(**{"split": split, **value})
    if isinstance(value, str) and value:
        name, _, chosen = value.partition(":")
        return load_dataset(name, split=chosen or split)
    raise ConfigError(f"expected {what} to be a VQADataset, a load_dataset kwargs dict or 'name[:split]', got {value!r}")


def _build_prior(fit_on: Any = None, **options: Any) -> Agent:
    from agents.baselines import AnswerPriorAgent

    agent = AnswerPriorAgent(**options)
    return agent.fit(_load_dataset(fit_on, "fit_on", "train")) if fit_on is not None else agent


def _build_tool_then_answer(fit_on: Any = None, **options: Any) -> Agent:
    from agents.baselines import ToolThenAnswerAgent

    agent = ToolThenAnswerAgent(**options)
    return agent.fit(_load_dataset(fit_on, "fit_on", "train")) if fit_on is not None else agent


def _build_oracle(dataset: Any = None, **options: Any) -> Agent:
    from agents.baselines import OracleAgent

    if dataset is None:
        raise ConfigError("the 'oracle' agent needs dataset= (the VQADataset it reads answers from)")
    return OracleAgent(_load_dataset(dataset, "dataset", "test"), **options)
