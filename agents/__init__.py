"""Agents: anything that turns a conversation into the next turn (VLMs, endpoints, baselines)."""

from agents.base import Agent

__all__ = ["Agent"]
