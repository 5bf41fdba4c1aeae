"""Which questions an evaluation asks: every one, the first N, or N drawn at random, optionally
stratified by a record field -- and a loud error when that is none.

The selection is a fixed *order* of the dataset (file order; a seeded permutation with
``shuffle``; with ``stratify``, the groups interleaved so that every prefix holds each group in
its share of the split), of which ``limit`` takes a prefix. So a larger ``limit`` extends a run
without changing the questions already asked (what resuming with a larger ``--limit`` needs), and
the same seed always asks the same questions.

>>> from medvqa_env.records import VQADataset, VQARecord
>>> ds = VQADataset([VQARecord(f"q{i}", ("x.png",), "q?", "yes" if i < 8 else "lung",
...                            "CLOSED" if i < 8 else "OPEN", "d") for i in range(10)])
>>> [r.answer_type.value for r in select_records(ds, limit=5)].count("OPEN")
0
>>> [r.answer_type.value for r in select_records(ds, limit=5, stratify="answer_type")].count("OPEN")
1
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from medvqa_env.datasets.mixture import interleave
from medvqa_env.errors import ConfigError
from medvqa_env.records import VQADataset, VQARecord

STRATIFY_FIELDS = ("answer_type", "dataset", "modality", "organ", "question_type", "split")


def _group(record: VQARecord, field: str) -> str:
    value = getattr(record, field)
    return str(getattr(value, "value", value) or "unknown")


def selection_order(dataset: VQADataset, shuffle: bool = False, stratify: str | None = None,
                    seed: int = 0) -> list[int]:
    """Indices of ``dataset`` in the order an evaluation takes them (see the module docstring)."""
    if stratify is not None and stratify not in STRATIFY_FIELDS:
        raise ConfigError(f"expected stratify to be one of {list(STRATIFY_FIELDS)}, got {stratify!r}")
    order = list(range(len(dataset)))
    if shuffle:
        order = [int(i) for i in np.random.default_rng([int(seed), 0x5E1EC7]).permutation(len(dataset))]
    if stratify is None:
        return order
    groups: dict[str, list[int]] = defaultdict(list)
    for i in order:
        groups[_group(dataset[i], stratify)].append(i)
    names = sorted(groups)
    queues = [iter(groups[n]) for n in names]
    return [next(queues[g]) for g in interleave([len(groups[n]) for n in names])]


def of_answer_types(dataset: VQADataset, answer_types: str | None) -> VQADataset:
    """The records whose answer type is in ``answer_types`` (comma list, any case; ``None`` or
    ``""``: all), in dataset order; a :class:`ConfigError` naming the types when none is left.

    >>> from medvqa_env.records import VQARecord
    >>> ds = VQADataset([VQARecord("a", ("x.png",), "q?", "yes", "CLOSED", "d"), VQARecord("b", ("x.png",), "q?", "lung", "OPEN", "d")])
    >>> [r.id for r in of_answer_types(ds, "closed")], len(of_answer_types(ds, None))
    (['a'], 2)
    """
    wanted = {t.strip().upper() for t in (answer_types or "").split(",") if t.strip()}
    if not wanted:
        return dataset
    known = {"CLOSED", "OPEN", "MCQ"}
    if not wanted <= known:
        raise ConfigError(f"expected answer types among {sorted(known)}, got {sorted(wanted - known)}")
    kept = [r for r in dataset if r.answer_type.value in wanted]
    if not kept:
        raise ConfigError(f"expected questions of types {sorted(wanted)} in the dataset, got none")
    return VQADataset(kept, name=dataset.name)


def select_records(dataset: VQADataset, limit: int | None = None, shuffle: bool = False,
                   stratify: str | None = None, seed: int = 0) -> VQADataset:
    """The questions to evaluate, in dataset order; a :class:`ConfigError` when there are none."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"expected limit to be a positive int or None, got {limit!r}")
    order = selection_order(dataset, shuffle, stratify, seed)
    chosen = sorted(order[:limit] if limit is not None else order)
    if not chosen:
        raise ConfigError(f"the evaluation selects no questions: dataset {dataset.name!r} has no records "
                          f"(check the split name and the dataset options)")
    return VQADataset([dataset[i] for i in chosen], dataset.name)


def describe_selection(dataset: VQADataset, selected: VQADataset, limit: int | None, shuffle: bool,
                       stratify: str | None, seed: int) -> dict[str, Any]:
    """What ``run.json`` records about the selection: how it was drawn, how many of each answer
    type, and a digest of the selected ids (two runs asked the same questions iff it matches)."""
    ids = "\n".join(r.id for r in selected).encode()
    return {"n_available": len(dataset), "n_selected": len(selected), "limit": limit, "shuffle": shuffle,
            "stratify": stratify, "seed": seed if (shuffle or stratify) else None,
            "by_answer_type": dict(sorted(Counter(r.answer_type.value for r in selected).items())),
            "ids_sha256": hashlib.sha256(ids).hexdigest()}
