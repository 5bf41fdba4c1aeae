"""Dataset mixtures: several datasets as one, combined as they are or sampled by weight.

Seed 000 trains on a weighted mixture of medical VQA sets and evaluates on their combined test
sets. Both are one loader here (``load_dataset("mixture", ...)``, plain JSON options, so a trainer
or an env worker builds it from its name like any other dataset) or one function on loaded
datasets (:func:`mix`)::

    # training: 2 parts VQA-RAD to 1 part SLAKE, 3000 questions, drawn with seed 0
    load_dataset("mixture", split="train", size=3000, seed=0, components=[
        {"name": "vqa_rad", "weight": 2, "root": "/data/vqa_rad"},
        {"name": "slake", "weight": 1, "root": "/data/Slake1.0"}])
    # evaluation: every test question of both, in order
    load_dataset("mixture", split="test", components=["vqa_rad", {"name": "slake", "root": "..."}])

**Combined** (no component has a ``weight`` and no ``size``): the components' records one after
the other, nothing dropped or repeated.

**Weighted**: component ``i`` gets ``round(size * w_i / sum(w))`` records (largest remainders
make the total exactly ``size``), drawn without replacement from a seeded permutation of it. A
component asked for more records than it has is repeated, each pass reshuffled; a repeat's id gets
``~rep<k>`` (``k`` = 2, 3, ...) and ``metadata["mixture_repeat"] = k``, so ids stay unique. Without
``size``, the mixture is as large as it can be with no repeats (the component with the fewest
records per unit of weight is used whole). The components are interleaved so that every prefix
holds them in proportion to their weights (so ``limit``/``--limit`` keeps the mix).

Each record keeps its own ``dataset`` field, so reports break results down by component. Ids must
be unique across components (loaders prefix theirs with the dataset name).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from medvqa_env.errors import ConfigError, DatasetError
from medvqa_env.records import VQADataset, VQARecord


def quotas(weights: Sequence[float], size: int) -> list[int]:
    """Records per component: proportional to ``weights``, summing exactly to ``size``.

    >>> quotas([2, 1], 10), quotas([1, 1, 1], 4), quotas([1, 0], 3)
    ([7, 3], [2, 1, 1], [3, 0])
    """
    total = float(sum(weights))
    exact = [size * w / total for w in weights]
    out = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in by_remainder[: size - sum(out)]:
        out[i] += 1
    return out


def interleave(counts: Sequence[int]) -> list[int]:
    """Component index per position, so that every prefix holds each component in proportion to
    its count (the one furthest behind its share goes next; ties to the lower index).

    >>> interleave([4, 2])
    [0, 1, 0, 0, 1, 0]
    """
    total = sum(counts)
    taken = [0] * len(counts)
    order = []
    for t in range(1, total + 1):
        i = max(range(len(counts)), key=lambda j: (counts[j] * t / total - taken[j], -j))
        taken[i] += 1
        order.append(i)
    return order


def _draw(dataset: VQADataset, n: int, rng: np.random.Generator) -> list[VQARecord]:
    """``n`` records of ``dataset``: passes over seeded permutations; repeats renamed ``~rep<k>``."""
    out: list[VQARecord] = []
    k = 1
    while len(out) < n:
        for i in rng.permutation(len(dataset))[: n - len(out)]:
            r = dataset[int(i)]
            if k > 1:
                r = dataclasses.replace(r, id=f"{r.id}~rep{k}", metadata={**r.metadata, "mixture_repeat": k})
            out.append(r)
        k += 1
    return out


def mix(datasets: Sequence[VQADataset], weights: Sequence[float] | None = None, size: int | None = None,
        seed: int = 0, name: str = "mixture") -> VQADataset:
    """One dataset from several (see the module docstring): combined when ``weights`` and
    ``size`` are ``None``, else sampled by weight (``weights=None`` with a ``size``: in proportion
    to the datasets' sizes)."""
    datasets = list(datasets)
    if not datasets:
        raise ConfigError("expected at least one dataset to mix, got none")
    if weights is None and size is None:
        return _unique([r for d in datasets for r in d], datasets, name)
    if weights is None:
        weights = [float(len(d)) for d in datasets]
    weights = [float(w) for w in weights]
    if len(weights) != len(datasets):
        raise ConfigError(f"expected one weight per dataset ({len(datasets)}), got {len(weights)}")
    if any(not math.isfinite(w) or w < 0 for w in weights) or not any(weights):
        raise ConfigError(f"expected weights >= 0, not all 0, got {weights}")
    for d, w in zip(datasets, weights):
        if w > 0 and len(d) == 0:
            raise DatasetError(f"mixture {name!r}: component {d.name!r} has weight {w} but no records")
    if size is None:
        size = int(min(len(d) * sum(weights) / w for d, w in zip(datasets, weights) if w > 0))
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"expected size to be a positive int, got {size!r}")
    counts = quotas(weights, size)
    rngs = [np.random.default_rng([int(seed), i]) for i in range(len(datasets))]
    drawn = [iter(_draw(d, n, rng)) for d, n, rng in zip(datasets, counts, rngs)]
    return _unique([next(drawn[i]) for i in interleave(counts)], datasets, name)


def _unique(records: list[VQARecord], datasets: Sequence[VQADataset], name: str) -> VQADataset:
    owner: dict[str, str] = {}
    for d in datasets:
        for r in d:
            if owner.setdefault(r.id, d.name) != d.name:
                raise DatasetError(f"mixture {name!r}: record id {r.id!r} is in both {owner[r.id]!r} and "
                                   f"{d.name!r}; ids must be unique across the components")
    return _with_provenance(VQADataset(records, name=name), datasets)


def _with_provenance(mixed: VQADataset, datasets: Sequence[VQADataset]) -> VQADataset:
    """The mixture's provenance: its components' (files, checks) and all their skipped rows."""
    from medvqa_env.provenance import DatasetProvenance, attach_provenance, dataset_provenance

    parts = [dataset_provenance(d) or DatasetProvenance(d.name, n_records=len(d)) for d in datasets]
    policies = {p.on_invalid for p in parts}
    checks = {p.check_images for p in parts}
    return attach_provenance(mixed, DatasetProvenance(
        name=mixed.name, sources=[s for p in parts for s in p.sources], n_records=len(mixed),
        on_invalid=policies.pop() if len(policies) == 1 else "mixed",
        check_images=checks.pop() if len(checks) == 1 else "mixed",
        n_images_checked=sum(p.n_images_checked for p in parts),
        n_images_decoded=sum(p.n_images_decoded for p in parts),
        skipped=[{"dataset": p.name, **row} for p in parts for row in p.skipped],
        components=[p.to_dict() for p in parts]))


def load_mixture(split: str = "test", components: Sequence[str | Mapping[str, Any]] = (), size: int | None = None,
                 seed: int = 0, name: str = "mixture", on_invalid: str | None = None,
                 check_images: bool | str | None = None) -> VQADataset:
    """Load each component with :func:`~medvqa_env.datasets.load_dataset` and :func:`mix` them.

    ``components``: dataset names, or ``{"name": ..., "weight": w, "split": s, **loader options}``
    (``split`` defaults to the mixture's; ``weight`` to 1 once any component has one). No weights
    and no ``size``: the combined set. Any weight or a ``size``: sampled by weight with ``seed``.
    ``on_invalid`` / ``check_images`` given here go to every component that does not set its own;
    the mixture's provenance lists each component's and all their skipped rows.
    """
    from medvqa_env.datasets import load_dataset

    if isinstance(components, (str, Mapping)) or not components:
        raise ConfigError(f"expected components to be a non-empty list of names or {{'name': ...}} objects, "
                          f"got {components!r:.120}")
    datasets, weights = [], []
    for i, spec in enumerate(components):
        spec = {"name": spec} if isinstance(spec, str) else dict(spec)
        if not isinstance(spec.get("name"), str):
            raise ConfigError(f"component {i}: expected a 'name' (a dataset name), got {spec!r:.120}")
        ds_name, weight = spec.pop("name"), spec.pop("weight", None)
        for key, value in (("on_invalid", on_invalid), ("check_images", check_images)):
            if value is not None:
                spec.setdefault(key, value)
        try:
            datasets.append(load_dataset(ds_name, split=spec.pop("split", split), **spec))
        except (DatasetError, ConfigError) as e:
            raise type(e)(f"mixture {name!r}: component {i} ({ds_name!r}): {e}") from None
        weights.append(weight)
    weighted = size is not None or any(w is not None for w in weights)
    return mix(datasets, [1.0 if w is None else w for w in weights] if weighted else None, size, seed, name)
