"""Which labels the tool-heuristic agent asks a classifier for, and what its answer means.

A trained classifier (``medvqa-tools build classify``) knows a fixed label set, published in its
tool schema (``labels.items.examples``). Asking it about anything else ("pneumonia chest x ray")
gets a number that means little, so the agent asks for the labels the tool knows that the question
names (matched with case, spaces and punctuation ignored: the question's "x ray" is the tool's
"X-Ray"), against their counterparts (the other label of a two-class tool, ``no lesion`` for
``lesion``, ``normal``); when none fits, it does not ask, and says so. An open-vocabulary
classifier (zero-shot CLIP, the oracle) is asked what it was before: the question's subject
against "normal", the options, or the prior's candidates.

>>> tool = {"name": "classify", "parameters": {"properties": {"labels": {
...     "type": "array", "items": {"type": "string", "examples": ["normal", "pneumonia"]}}}}}
>>> plan = classifier_plan(tool, "CLOSED", "Is there pneumonia in this chest x ray?", "pneumonia chest x ray")
>>> plan.labels, plan.yes
(['pneumonia', 'normal'], ('pneumonia',))
>>> classifier_plan(tool, "CLOSED", "Is the heart enlarged?", "heart enlarged").labels is None
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tool_backends.classify import fold_label

NEGATIVE_LABELS = ("normal", "healthy", "negative", "nofinding", "benign", "no")
"""Labels (folded) that answer "is there X?" with no: the counterparts of a finding."""
_TOKEN = re.compile(r"[^\W_]+")


@dataclass(frozen=True)
class ClassifierPlan:
    """``labels``: what to ask (``None``: nothing fits, do not ask; ``note`` says why); ``yes``:
    for a CLOSED question, the labels whose win means "yes" (``None``: the old rule, anything but
    ``normal``)."""

    labels: list[str] | None
    yes: tuple[str, ...] | None = None
    note: str = ""


def known_labels(tool: Mapping[str, Any]) -> list[str] | None:
    """The labels a classify tool's engine knows, from its schema; ``None`` for an open vocabulary."""
    schema = (tool.get("parameters") or {}).get("properties", {}).get("labels") or {}
    examples = (schema.get("items") or {}).get("examples")
    return [str(x) for x in examples] if isinstance(examples, list) and len(examples) >= 2 else None


def labels_named(text: str, known: Sequence[str]) -> list[str]:
    """The ``known`` labels that ``text`` names: a run of one to four of its words equal to the
    label once both are folded (``chest x ray`` names ``X-Ray``; ``infarct`` does not name ``CT``).

    >>> labels_named("Is this chest x ray normal?", ["X-Ray", "CT", "normal", "no lesion"])
    ['X-Ray', 'normal']
    """
    words = [fold_label(w) for w in _TOKEN.findall(text)]
    runs = {"".join(words[i:i + n]) for n in range(1, 5) for i in range(len(words) - n + 1)}
    return [k for k in known if fold_label(k) and fold_label(k) in runs]


def _counterparts(named: Sequence[str], known: Sequence[str]) -> list[str]:
    others = [k for k in known if k not in named]
    if len(known) == 2:
        return others
    folded = {fold_label(n) for n in named}
    negations = {"no" + f for f in folded} | {f[2:] for f in folded if f.startswith("no")}
    picked = [k for k in others if fold_label(k) in negations or fold_label(k) in NEGATIVE_LABELS]
    return picked or others


def classifier_plan(tool: Mapping[str, Any], answer_type: str, question: str, subject: str,
                    options: Mapping[str, str] | None = None, candidates: Sequence[str] = ()) -> ClassifierPlan:
    """What to ask ``tool`` for a question (see the module docstring)."""
    known = known_labels(tool)
    name = tool.get("name", "classify")
    if known is None:  # open vocabulary: as the agent always asked
        if answer_type == "MCQ" and options:
            return ClassifierPlan([str(v) for v in options.values()])
        if answer_type == "CLOSED":
            return ClassifierPlan([subject, "normal"])
        return ClassifierPlan(list(candidates) or [subject, "normal"])
    own = {fold_label(k): k for k in known}
    if answer_type == "MCQ" and options:
        asked = [own[fold_label(v)] for v in options.values() if fold_label(v) in own]
        labels = list(dict.fromkeys(asked))
    elif answer_type == "CLOSED":
        named = labels_named(question, known)
        if named:
            return ClassifierPlan(list(dict.fromkeys([*named, *_counterparts(named, known)])), tuple(named))
        labels = []
    else:
        labels = list(dict.fromkeys(own[fold_label(c)] for c in candidates if fold_label(c) in own))
    if len(labels) >= 2:
        return ClassifierPlan(labels)
    return ClassifierPlan(None, note=f"{name} knows the labels {known}; none of them fits this question, so it was "
                                     "not asked")


def means_yes(label: str, plan: ClassifierPlan) -> bool:
    """A CLOSED question's verdict from the classifier's top ``label`` (``_top_label`` lower-cases it)."""
    if plan.yes is None:
        return label != "normal"
    return fold_label(label) in {fold_label(y) for y in plan.yes}
