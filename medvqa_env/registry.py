"""One registry shape for every named thing: datasets, tools, engines, rewards, agents.

Entries are factories or ``"package.module:attr"`` strings imported on first use, so listing
names never loads torch. Unknown names and bad options fail with the project's messages.

>>> shapes = Registry("shape", {"square": "builtins:dict"}, aliases={"box": "square"})
>>> shapes.build("box", side=2)
{'side': 2}
>>> shapes.build("sqare")
Traceback (most recent call last):
...
medvqa_env.errors.ConfigError: Unknown shape 'sqare'. Available: ['square']. Did you mean 'square'?
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

from medvqa_env.errors import ConfigError, unknown_name_message

T = TypeVar("T")
Factory = Callable[..., T]


class Registry(Generic[T]):
    """Name -> factory for one ``kind`` of thing (the word used in error messages)."""

    def __init__(self, kind: str, entries: Mapping[str, str | Factory] | None = None,
                 aliases: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, str | Factory] = dict(entries or {})
        self._aliases = dict(aliases or {})

    def add(self, name: str, target: str | Factory) -> None:
        """Register ``target`` (a factory or ``"module:attr"``) under ``name``."""
        if name in self._entries and self._entries[name] is not target:
            raise ConfigError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = target

    def register(self, name: str) -> Callable[[Factory], Factory]:
        """Decorator form of :meth:`add`."""

        def wrap(factory: Factory) -> Factory:
            self.add(name, factory)
            return factory

        return wrap

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._aliases

    def get(self, name: str) -> Factory:
        """The factory for ``name`` (an alias works too), imported if it was given as a string."""
        key = self._aliases.get(name, name)
        try:
            target = self._entries[key]
        except (KeyError, TypeError):
            raise ConfigError(unknown_name_message(self.kind, name, self._entries)) from None
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            target = getattr(importlib.import_module(module), attr)
            self._entries[key] = target
        return target

    def build(self, name: str, /, **options: Any) -> T:  # positional-only: a tool may take a name= option
        """``get(name)(**options)``; a wrong option becomes a :class:`ConfigError` naming it
        (and the closest option the factory takes)."""
        from medvqa_env.config import check_options

        factory = self.get(name)
        check_options(factory, options, f"{self.kind} {name!r}")
        try:
            return factory(**options)
        except TypeError as e:
            raise ConfigError(f"bad options for {self.kind} {name!r}: {e}") from None
