"""``eval.run --image-ablation blank|shuffle|blank_policy``: the same run with the images removed or swapped.

The normal run and each ablated run (``out/ablation_<mode>/``, resumable like any run) use the
same agent, questions, seeds, tools and scorer; only the env's ``image_ablation`` differs (see
:mod:`medvqa_env.ablation`). The summary's ``image_ablation`` section holds, per mode, each
headline metric normal, ablated and the drop (normal - ablated): a policy that uses the picture
loses accuracy without it; one that answers from the question text does not.
"""

from __future__ import annotations

from typing import Any

from eval.summary import EvalSummary

ABLATION_METRICS = ("accuracy", "closed_accuracy", "mcq_accuracy", "armed_open_avg", "open_exact_match",
                    "armed_score", "tool_calls_per_episode")


def ablation_modes(value: Any) -> list[str]:
    """``None`` -> ``[]``; ``"blank"``, ``"blank,shuffle"`` or a list -> the checked modes, in order."""
    from medvqa_env.ablation import check_ablation

    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    modes = [check_ablation(str(v).strip()) for v in items]
    return list(dict.fromkeys(m for m in modes if m))


def ablation_drop(normal: EvalSummary, ablated: EvalSummary) -> dict[str, Any]:
    """Per headline metric ``{"normal", "ablated", "drop"}`` (``None`` where it does not apply)."""
    out: dict[str, Any] = {"episodes": ablated.n_episodes, "scored": ablated.overall.n_scored}
    for name in ABLATION_METRICS:
        a, b = getattr(normal.overall, name).value, getattr(ablated.overall, name).value
        out[name] = {"normal": a, "ablated": b, "drop": None if a is None or b is None else a - b}
    return out
