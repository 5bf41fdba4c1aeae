"""Dataset loaders, all producing :class:`~medvqa_env.records.VQADataset`.

>>> sorted(available_datasets())[:3]
['embedded', 'hf', 'jsonl']
"""

from __future__ import annotations

from typing import Any, Callable

from medvqa_env.records import VQADataset
from medvqa_env.registry import Registry

Loader = Callable[..., VQADataset]
DATASETS: Registry[VQADataset] = Registry("dataset", {
    # name -> "module:function"; imported on first use so optional loaders cost nothing.
    "embedded": "medvqa_env.datasets.embedded:load_embedded",
    "jsonl": "medvqa_env.datasets.jsonl:load_jsonl",
    "vqa_rad": "medvqa_env.datasets.vqa_rad:load_vqa_rad",
    "slake": "medvqa_env.datasets.slake:load_slake",
    "pathvqa": "medvqa_env.datasets.pathvqa:load_pathvqa",
    "pmcvqa": "medvqa_env.datasets.pmcvqa:load_pmcvqa",
    "hf": "medvqa_env.datasets.hf:load_hf",
    "vqamed": "medvqa_env.datasets.vqamed:load_vqamed",
    "mixture": "medvqa_env.datasets.mixture:load_mixture",
})


def available_datasets() -> list[str]:
    return DATASETS.names()


def register_dataset(name: str, target: str | Loader) -> None:
    """Register a loader (or ``"package.module:function"``), called with ``split=`` and options."""
    DATASETS.add(name, target)


def get_loader(name: str) -> Loader:
    return DATASETS.get(name)


def load_dataset(name: str, split: str = "test", **options: Any) -> VQADataset:
    """Load dataset ``name`` (see :func:`available_datasets`); a ``.jsonl`` path also works."""
    if name.endswith((".jsonl", ".json")) and name not in DATASETS:
        return DATASETS.build("jsonl", path=name, split=split, **options)
    return DATASETS.build(name, split=split, **options)
