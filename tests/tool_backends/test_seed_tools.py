"""Seed 000's tool set by its names: each name builds our tool under that name, a seed-style
config gives the system prompt the seed's names, and the documented alias table is the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from medvqa_env.env import MedVQAEnv
from medvqa_env.records import VQADataset
from rewards import RuleReward
from tool_backends.builtin import SEED_000_TOOLS, TOOL_ALIASES, seed000_tools
from tool_backends.engines import TOOL_ENGINE_KIND
from tool_backends.registry import available_tools, build_tool

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tools.md"


@pytest.mark.parametrize("alias", sorted(TOOL_ALIASES))
def test_each_alias_builds_our_tool_under_its_name(alias, scene):
    target = TOOL_ALIASES[alias][0]
    options = {"engine": "oracle"} if target == "classify" else {}
    tool = build_tool(alias, **options)
    ours = build_tool(target, **options)
    assert tool.spec.name == alias and type(tool) is type(ours)
    assert tool.spec.parameters == ours.spec.parameters and alias in available_tools()
    if target in ("segment", "segment_text", "ground", "classify", "hires_render"):
        assert TOOL_ENGINE_KIND[alias] == TOOL_ENGINE_KIND[target]  # `--engine medsam3=...` picks from the same table


def test_a_seed_config_puts_the_seeds_names_in_the_system_prompt(scene):
    tools = seed000_tools(biomedclip={"engine": "oracle"})
    env = MedVQAEnv(dataset=VQADataset([scene.record]), tools=tools, reward=RuleReward())
    names = [t["function"]["name"] for t in env.reset(options={"index": 0})[1]["tools"]]
    assert names == list(SEED_000_TOOLS)
    assert all(f'"name": "{n}"' in env.system_prompt for n in SEED_000_TOOLS)
    assert '"default": "norm1000"' in env.system_prompt  # the seed's policy is Qwen3-VL
    env.close()


def test_docs_list_every_alias_with_its_tool():
    text = DOCS.read_text()
    for alias, (target, _) in TOOL_ALIASES.items():
        assert re.search(rf"\|\s*`{re.escape(alias)}`\s*\|\s*`{target}`", text), f"{alias} -> {target} not in docs"
