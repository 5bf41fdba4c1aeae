"""A trained checkpoint is evaluated with the settings it was trained with.

``eval.run --agent vlm --agent-opt model=<checkpoint>`` (or ``text-llm``) reads the checkpoint's
``medvqa_run.json`` (written by the trainers, see :func:`train.checkpoint.trained_settings`): its
tool turns, tools, answer protocol and observation style become the evaluation's unless a flag
sets them; a flag that sets one to another value wins, with a warning naming both values. The
agent takes the chat rendering and image size from the same file (:mod:`agents.text_llm`), and the
prompt follows: an override saved with the model (``--system-prompt``, ``--demo-prompt``) is used
as it is; the env's own prompt (which lists the tools and the turn budget) is rebuilt from the
evaluation's settings -- the very text the model was trained on when they match.

Checkpoints written before the ``env`` block existed fall back to their recorded ``args``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

MODEL_AGENTS = ("vlm", "text-llm", "qwen-vl", "llm")
"""Agents that load a ``model=`` folder (names and aliases in :mod:`agents.registry`)."""

ENV_FLAGS = {"max_turns": "--max-turns", "tools": "--tools", "answer_protocol": "--answer-protocol",
             "observation_style": "--observation-style"}


def checkpoint_run_file(agent: str, agent_options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``medvqa_run.json`` of the checkpoint a model agent loads (``{}`` when there is none)."""
    from agents.models import read_run_file

    model = agent_options.get("model")
    if agent not in MODEL_AGENTS or not isinstance(model, str) or not Path(model).expanduser().is_dir():
        return {}
    return read_run_file(Path(model).expanduser())


def trained_env(run_file: Mapping[str, Any]) -> dict[str, Any]:
    """The env settings a checkpoint was trained with: its ``env`` block, else what its recorded
    ``args`` say (older checkpoints).

    >>> trained_env({"args": {"max_turns": 1, "answer_protocol": "boxed"}, "resolved": {"tools": {}}})
    {'max_turns': 1, 'tools': {}, 'answer_protocol': 'boxed'}
    """
    if run_file.get("env"):
        return {k: v for k, v in run_file["env"].items() if k in ENV_FLAGS}
    args, resolved = run_file.get("args") or {}, run_file.get("resolved") or {}
    out: dict[str, Any] = {}
    if "max_turns" in args:
        out["max_turns"] = args["max_turns"]
    if resolved.get("tools") is not None:
        out["tools"] = resolved["tools"]
    if "answer_protocol" in args:
        out["answer_protocol"] = args["answer_protocol"]
    return out


def adopt_trained_settings(run_file: Mapping[str, Any], config: Any, given: set[str]) -> None:
    """Set ``config``'s env settings to the checkpoint's where ``given`` (the fields the command
    line sets) does not name them."""
    for name, trained in trained_env(run_file).items():
        if name not in given:
            setattr(config, name, trained)


def trained_differences(run_file: Mapping[str, Any], config: Any) -> list[str]:
    """One warning per env setting of ``config`` that differs from the checkpoint's."""
    from tool_backends.config import load_tool_config

    warnings = []
    for name, trained in trained_env(run_file).items():
        current = getattr(config, name)
        if name == "tools":  # compare resolved configs: "ground=oracle" and its dict are the same tools
            current, trained = load_tool_config(current), load_tool_config(trained)
        if json.dumps(current, sort_keys=True, default=str) != json.dumps(trained, sort_keys=True, default=str):
            warnings.append(f"{ENV_FLAGS[name]} {_show(current)} differs from the checkpoint's {_show(trained)}: "
                            "the model is evaluated with a setting it was not trained with"
                            + (" (and the env's prompt, which lists tools and turns, differs too)"
                               if run_file.get("system_prompt_source") == "env" else ""))
    return warnings


def check_trained_tools(run_file: Mapping[str, Any], tools: Any, dataset: Any = None) -> None:
    """Stop when a trained tool the checkpoint was trained with (its record's ``tool_identity``)
    has another content hash in the evaluation's ``tools`` (built now if missing, as the env
    would), naming what changed; ``--allow-changed tools`` evaluates anyway. Checkpoints older
    than the record, and tools given as objects, are not compared. ``dataset`` resolves engine
    defaults as the env and the trainer's record do (LiteMedSAM for ``segment`` on real images)."""
    recorded = (run_file.get("resolved") or {}).get("tool_identity")
    trained = {name: d for name, d in (recorded or {}).items() if d.get("content_hash")}
    if not trained or hasattr(tools, "names"):
        return
    from tool_backends.identity import check_tools, describe_tools

    current = describe_tools(tools, build=True, dataset=dataset)  # segment: the dataset's default engine, as trained
    check_tools(trained, {name: d for name, d in current.items() if name in trained}, "the checkpoint",
                "Pass --allow-changed tools to evaluate it with these tools anyway.")


def given_fields(argv: list[str]) -> set[str]:
    """The fields a command line sets: ``["--max-turns", "2", "--no-progress"]`` -> ``{"max_turns", "progress"}``.

    >>> sorted(given_fields(["--max-turns", "2", "--no-progress", "--tool-opt=a.b=1", "x"]))
    ['max_turns', 'progress', 'tool_opt']
    """
    out = set()
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            name = token[2:].split("=", 1)[0].replace("-", "_")
            out.add(name[3:] if name.startswith("no_") else name)
    return out


def _show(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
