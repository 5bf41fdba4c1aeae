"""Dataset loaders, all producing :class:`~medvqa_env.records.VQADataset`.

>>> sorted(available_datasets())[:3]
['embedded', 'hf', 'jsonl']
"""

from __future__ import annotations

from typing import Any, Callable

from medvqa_env.errors import ConfigError, unknown_name_message
from medvqa_env.records import VQADataset

Loader = Callable[..., VQADataset]
_LOADERS: dict[str, str] = {
    # name -> "module:function"; imported on first use so optional loaders cost nothing.
    "embedded": "medvqa_env.datasets.embedded:load_embedded",
    "jsonl": "medvqa_env.datasets.jsonl:load_jsonl",
    "vqa_rad": "medvqa_env.datasets.vqa_rad:load_vqa_rad",
    "slake": "medvqa_env.datasets.slake:load_slake",
    "pathvqa": "medvqa_env.datasets.pathvqa:load_pathvqa",
    "pmcvqa": "medvqa_env.datasets.pmcvqa:load_pmcvqa",
    "hf": "medvqa_env.datasets.hf:load_hf",
}


def available_datasets() -> list[str]:
    return sorted(_LOADERS)


def register_dataset(name: str, target: str) -> None:
    """Register a loader as ``"package.module:function"`` (called with ``split=`` and options)."""
    _LOADERS[name] = target


def get_loader(name: str) -> Loader:
    import importlib

    try:
        target = _LOADERS[name]
    except KeyError:
        raise ConfigError(unknown_name_message("dataset", name, _LOADERS)) from None
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def load_dataset(name: str, split: str = "test", **options: Any) -> VQADataset:
    """Load dataset ``name`` (see :func:`available_datasets`); a ``.jsonl`` path also works."""
    if name.endswith((".jsonl", ".json")) and name not in _LOADERS:
        return get_loader("jsonl")(path=name, split=split, **options)
    return get_loader(name)(split=split, **options)
