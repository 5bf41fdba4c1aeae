"""What an API agent's run cost and who answered it: token usage per episode (``row["usage"]``,
from :attr:`medvqa_env.chat.Conversation.usage`) summed over a run, and the report's lines for it
and for the model (the id the agent resolved, the model the server said answered)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

TOKEN_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "requests")


def token_usage(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over the episodes that report usage, and the mean per such episode; ``{}`` when none do.

    >>> token_usage([{"usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14, "requests": 2}},
    ...              {"usage": {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8, "requests": 1}}, {}])
    {'episodes': 2, 'prompt_tokens': 16, 'completion_tokens': 6, 'total_tokens': 22, 'requests': 3, 'mean_per_episode': {'prompt_tokens': 8.0, 'completion_tokens': 3.0, 'total_tokens': 11.0, 'requests': 1.5}}
    """
    used = [r["usage"] for r in rows if r.get("usage")]
    if not used:
        return {}
    totals = {k: sum(int(u.get(k, 0)) for u in used) for k in TOKEN_KEYS}
    return {"episodes": len(used), **totals, "mean_per_episode": {k: v / len(used) for k, v in totals.items()}}


def usage_lines(run: Mapping[str, Any], usage: Mapping[str, Any]) -> list[str]:
    """Report lines: the model asked for and the model(s) the server reported, and the tokens.

    >>> usage_lines({"agent": {"model": "qwen"}, "agent_usage": {"served_models": {"Qwen/Qwen2.5-VL-7B": 3}}},
    ...             {"episodes": 1, "prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12, "requests": 3,
    ...              "mean_per_episode": {"total_tokens": 12.0}})
    ['- model: `qwen` (the server reported `Qwen/Qwen2.5-VL-7B` in 3 responses)', '- tokens: 9 prompt + 3 completion = 12 in 3 requests over 1 episodes (12.0 per episode)']
    """
    lines = []
    agent_usage = run.get("agent_usage") or {}
    served = agent_usage.get("served_models") or {}
    if "model" in (run.get("agent") or {}) and (served or usage):
        reported = ", ".join(f"`{m}` in {n} responses" for m, n in served.items())
        lines.append(f"- model: `{run['agent']['model']}`" + (f" (the server reported {reported})" if reported else ""))
    if agent_usage.get("dropped_parameters"):
        lines.append(f"- parameters the server rejected (left out): {sorted(agent_usage['dropped_parameters'])}")
    if usage:
        mean = usage.get("mean_per_episode", {}).get("total_tokens", 0.0)
        lines.append(f"- tokens: {usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion = "
                     f"{usage['total_tokens']} in {usage['requests']} requests over {usage['episodes']} episodes "
                     f"({mean:.1f} per episode)")
    return lines
