"""One config language for tools, rewards, datasets and agents -- in Python and on the command line.

A *spec* names a registered thing and its options, in any of these spellings (all equal)::

    "armed"                                  # a name
    "armed:max_threshold=0.9,alpha=0.5"      # a name with options (values parsed as JSON)
    {"name": "armed", "max_threshold": 0.9}  # a dict
    '{"name": "armed", "max_threshold": 0.9}'  # the dict as JSON text

On the command line the options also come as repeated ``--reward-opt key=value`` (likewise
``--dataset-opt``, ``--agent-opt``). Tools have their own, richer spellings (a list, ``name=engine``,
a URL per tool, a dict, a JSON/YAML file): see :func:`tool_backends.config.load_tool_config`,
which every consumer (``gym.make(tools=...)``, ``eval.run --tools``, the trainers, verl) goes
through. An option a factory does not take is a :class:`ConfigError` that names the options it
does take and suggests the closest one.

>>> parse_spec("armed:max_threshold=0.9")
('armed', {'max_threshold': 0.9})
>>> parse_spec({"name": "vqa_rad", "root": "/data/vqa_rad"})
('vqa_rad', {'root': '/data/vqa_rad'})
>>> parse_options(["root=/data", "limit=4", "flag=true"])
{'root': '/data', 'limit': 4, 'flag': True}
>>> def loader(root: str, split: str = "train"): ...
>>> check_options(loader, {"roott": "/x"}, "dataset 'vqa_rad'")
Traceback (most recent call last):
...
medvqa_env.errors.ConfigError: dataset 'vqa_rad' has no option 'roott'. Did you mean 'root'? Options: ['root', 'split']
"""

from __future__ import annotations

import difflib
import inspect
import json
from typing import Any, Callable, Mapping, Sequence

from medvqa_env.errors import ConfigError


def parse_value(text: str) -> Any:
    """JSON where it parses (numbers, booleans, lists, objects), the plain string otherwise."""
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return text


def parse_options(pairs: Sequence[str] | str | Mapping[str, Any] | None, what: str = "option") -> dict[str, Any]:
    """``["k=4", "name=x"]`` (or ``"k=4,name=x"``, or a dict) -> ``{"k": 4, "name": "x"}``."""
    if pairs is None:
        return {}
    if isinstance(pairs, Mapping):
        return dict(pairs)
    if isinstance(pairs, str):
        pairs = _split_top_level(pairs)
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"expected {what} as key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        if not key.strip():
            raise ConfigError(f"expected {what} as key=value, got {pair!r}")
        out[key.strip()] = parse_value(value.strip())
    return out


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and quotes (so ``labels=["a","b"]`` stays whole)."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def parse_spec(spec: Any, what: str = "spec") -> tuple[str, dict[str, Any]]:
    """``"name"``, ``"name:k=v,..."``, ``{"name": ..., **options}`` or its JSON -> ``(name, options)``."""
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith("{"):
            try:
                spec = json.loads(text)
            except json.JSONDecodeError as e:
                raise ConfigError(f"expected {what} as valid JSON, got {text!r}: {e.msg}") from None
        else:
            name, _, rest = text.partition(":")
            if not name.strip():
                raise ConfigError(f"expected {what} as a name, got {spec!r}")
            return name.strip(), parse_options(rest, f"{what} option") if rest.strip() else {}
    if isinstance(spec, Mapping):
        options = dict(spec)
        name = options.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"expected {what} as a dict with a 'name', got {dict(spec)!r}")
        return name, options
    raise ConfigError(f"expected {what} as a name, 'name:key=value,...' or a dict with 'name', got {spec!r}")


def accepted_options(factory: Callable[..., Any]) -> list[str] | None:
    """Keyword names ``factory`` takes, or ``None`` when it takes ``**kwargs`` it does not pass on
    to a base class (cannot tell). A class whose ``__init__`` forwards ``**options`` to its base
    takes the base's names too."""
    chain = [c.__init__ for c in factory.__mro__ if "__init__" in vars(c)] if inspect.isclass(factory) else [factory]
    names: list[str] = []
    for fn in chain:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return None
        var_kw = False
        for p in sig.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                var_kw = True
            elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self" and p.name not in names:
                names.append(p.name)
        if not var_kw:
            return names
        if fn is object.__init__:
            return None
    return None


def check_options(factory: Callable[..., Any], options: Mapping[str, Any], what: str) -> None:
    """Raise :class:`ConfigError` naming the first option ``factory`` does not take, with the
    closest accepted name (``Did you mean 'root'?``). Silent when ``factory`` takes ``**kwargs``."""
    names = accepted_options(factory)
    if names is None:
        return
    for key in options:
        if key not in names:
            raise ConfigError(unknown_option_message(what, key, names))


def unknown_option_message(what: str, key: str, names: Sequence[str]) -> str:
    msg = f"{what} has no option {key!r}."
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
    if close:
        msg += f" Did you mean {close[0]!r}?"
    return msg + f" Options: {sorted(names)}"
