"""What a set of answers looks like, so a constant answer cannot pass for learning.

A policy that answers "no" to every yes/no question scores about half; one that learns to flip
that constant to "yes" on a split with a few more yes answers "improves". Accuracy cannot tell the
two apart; the answers can. Every held-out evaluation (the trainers' and ``eval.run``'s) reports,
per answer type, how many distinct (normalised) answers were given, their entropy in bits, and the
share of the most common one.

>>> answer_diversity(["Yes", "yes.", "no", None])
{'answers': 3, 'distinct': 2, 'entropy_bits': 0.918, 'top_answer': 'yes', 'top_share': 0.667}
>>> answer_diversity([])["distinct"]
0
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping


def answer_diversity(answers: Iterable[str | None]) -> dict[str, Any]:
    """Distinct normalised answers, their entropy (bits) and the most common one's share;
    ``None`` (no answer given) is left out."""
    from rewards.normalize import normalize_text

    counts = Counter(normalize_text(a) for a in answers if a is not None)
    n = sum(counts.values())
    if not n:
        return {"answers": 0, "distinct": 0, "entropy_bits": 0.0, "top_answer": None, "top_share": 0.0}
    entropy = -sum(c / n * math.log2(c / n) for c in counts.values())
    top, top_count = counts.most_common(1)[0]
    return {"answers": n, "distinct": len(counts), "entropy_bits": round(entropy + 0.0, 3), "top_answer": top,
            "top_share": round(top_count / n, 3)}


def diversity_by_answer_type(rows: Iterable[Mapping[str, Any]], answer_key: str = "prediction") -> dict[str, dict[str, Any]]:
    """:func:`answer_diversity` of ``row[answer_key]`` per ``row["answer_type"]``, plus ``"all"``."""
    groups: dict[str, list[str | None]] = defaultdict(list)
    for row in rows:
        groups[str(row.get("answer_type"))].append(row.get(answer_key))
        groups["all"].append(row.get(answer_key))
    return {name: answer_diversity(answers) for name, answers in sorted(groups.items())}
