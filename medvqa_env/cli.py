"""One command-line style for every console command of the project.

Every entry point (``medvqa-eval``, ``medvqa-tools``, ``medvqa-demo``, ``train.grpo``, ``train.sft``,
``train.ppo_sb3``, ``train.plot_curves``, ``eval.compare``, ``agents.openai_server``,
``benchmarks/run_all.py`` ...) builds its parser here (:func:`make_parser`), most from a config
dataclass whose field docstrings are the help:

* flags are shown kebab-case (``--save-every``) and accepted snake_case too (``--save_every``);
* booleans are strict: ``--resume``, ``--resume true``, ``--resume false`` or ``--no-resume``;
  ``--resume ture`` is an error, never a silent ``False``;
* ``--help`` shows every default; ``none`` is accepted for optional numbers and strings;
* ``key=value`` option lists (``--dataset-opt root=...``) repeat: every occurrence counts;
* no abbreviations (``--polic`` is not ``--policy``): a misspelt or shortened flag is an error
  that names the flag it may have meant (``did you mean --policy?``), in the sub-command's own
  usage for a sub-command;
* one name per concept across commands: ``--lr``, ``--split``, ``--tool-opt``, ``--device``,
  ``--out`` ...
* a user error prints ``prog: error: ...`` and exits 2, whether argparse or the program found it
  (:func:`run_cli` turns :class:`~medvqa_env.errors.MedVQAError` into that line, not a traceback).

Built on `simple-parsing <https://github.com/lebrice/SimpleParsing>`_: argparse underneath (so
errors, usage lines and sub-commands look like every other Unix tool), CleanRL-style docstrings
under fields read as help, both dash spellings. See ``docs/agents.md`` for why not tyro or
``HfArgumentParser``.

>>> import dataclasses
>>> @dataclasses.dataclass
... class Demo:
...     save_every: int = 5
...     '''checkpoint every k steps'''
...     resume: bool = True
...     '''resume from the last checkpoint'''
...     kl_coef: float | None = None
...     '''KL coefficient'''
>>> parse_dataclass(Demo, ["--save-every", "3", "--resume", "false", "--kl_coef", "none"], prog="demo")
Demo(save_every=3, resume=False, kl_coef=None)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from typing import Any, Callable, Mapping, Sequence

from medvqa_env.config import parse_options
from medvqa_env.errors import DatasetError, MedVQAError

OPTION_LIST_SUFFIXES = ("_opt", "_opts")
"""List fields named ``*_opt`` take ``key=value`` strings and may be repeated."""


def field_help(cls: type, name: str) -> str:
    """The docstring under field ``name`` of dataclass ``cls`` (CleanRL style), or ``""``."""
    from simple_parsing.docstring import get_attribute_docstring

    for klass in getattr(cls, "__mro__", (cls,)):
        if not dataclasses.is_dataclass(klass) or name not in getattr(klass, "__dataclass_fields__", {}):
            continue
        try:
            doc = get_attribute_docstring(klass, name)
        except (OSError, TypeError):  # no source (a generated class)
            continue
        text = doc.docstring_below or doc.comment_inline or doc.comment_above
        if text:  # argparse %-formats help strings
            return " ".join(text.split()).replace("%", "%%")
    return ""


NONE_IS_A_VALUE = "none_is_a_value"
"""Field metadata key: the field's ``none`` is a value of its own (``--tools none``: no tools), not
``None`` (the default), so the command line passes the word through."""


def _optional_scalar(kind: type) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        if str(text).strip().lower() in ("none", "null"):
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__} or 'none', got {text!r}") from None

    convert.__name__ = kind.__name__  # argparse names the type in its message
    return convert


def _strip_optional(kind: Any) -> tuple[Any, bool]:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return kind, False


def cli_view(cls: type, overrides: Mapping[str, Any] | None = None, exclude: Sequence[str] = ()) -> type:
    """A dataclass with ``cls``'s fields, defaults and help, shaped for the command line:
    booleans become strict ``--x/--no-x`` flags, optional scalars accept ``none``, ``*_opt`` lists
    repeat, and anything else (``Any``, dicts) is read as a string for the config language to
    parse. ``overrides`` maps a field name to ``(type, simple_parsing.field(...))``."""
    import simple_parsing as sp

    hints = typing.get_type_hints(cls)
    specs, dict_fields = [], []
    for f in dataclasses.fields(cls):
        if f.name in exclude or not f.init:
            continue
        if overrides and f.name in overrides:
            specs.append((f.name, *overrides[f.name]))
            continue
        help_text = field_help(cls, f.name)
        default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
        factory = f.default_factory if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING
        kind, optional = _strip_optional(hints[f.name])
        extra: dict[str, Any] = dict(f.metadata.get("cli", {}))
        none_is_value = bool(f.metadata.get(NONE_IS_A_VALUE))  # "none" means something other than the default
        if kind is bool:
            specs.append((f.name, bool, sp.flag(default, negative_prefix="--no-", help=help_text, **extra)))
            continue
        if kind in (int, float, str):
            specs.append((f.name, hints[f.name], sp.field(default=default, help=help_text,
                                                         type=_optional_scalar(kind) if optional and not none_is_value
                                                         else kind, **extra)))
            continue
        if kind is dict or typing.get_origin(kind) is dict:  # repeated key=value -> a dict
            dict_fields.append(f.name)
            specs.append((f.name, list[str], sp.field(default_factory=list, help=help_text, action="append",
                                                      metavar="K=V", **extra)))
            continue
        if typing.get_origin(kind) is list and f.name.endswith(OPTION_LIST_SUFFIXES):
            specs.append((f.name, list[str], sp.field(default_factory=factory if factory is not dataclasses.MISSING
                                                      else list, help=help_text, action="append",
                                                      metavar="K=V", **extra)))
            continue
        if typing.get_origin(kind) is list:
            specs.append((f.name, kind, sp.field(default_factory=factory, help=help_text, **extra)))
            continue
        # Any, dict, unions: the command line gives a string; the program parses it.
        if factory is not dataclasses.MISSING:
            default = factory()
        specs.append((f.name, typing.Optional[str], sp.field(default=default, help=help_text,
                                                              type=str if none_is_value else _optional_scalar(str),
                                                              **extra)))
    view = dataclasses.make_dataclass(cls.__name__, specs)
    view.__doc__ = (cls.__doc__ or "").strip().split("\n\n")[0] or cls.__name__
    # The help text is already in each field; a module with no source stops simple-parsing from
    # parsing this file's source per field to look for it again (most of a parse's time).
    view.__module__ = f"{__name__}.views"
    view.dict_fields = tuple(dict_fields)  # type: ignore[attr-defined]
    return view


def make_parser(prog: str, description: str | None = None, epilog: str | None = None) -> argparse.ArgumentParser:
    """The project's parser: simple-parsing's, both dash spellings, defaults in ``--help``, no
    abbreviations, and ``did you mean --x?`` for a flag it does not know (sub-commands added with
    ``add_subparsers().add_parser`` are the same kind of parser)."""
    import simple_parsing as sp

    class Parser(sp.ArgumentParser):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["allow_abbrev"] = False
            kwargs.setdefault("formatter_class", _HelpFormatter)
            kwargs.setdefault("add_option_string_dash_variants", sp.DashVariant.UNDERSCORE_AND_DASH)
            kwargs.setdefault("add_config_path_arg", False)
            super().__init__(*args, **kwargs)

        def _preprocessing(self, *args: Any, **kwargs: Any) -> None:
            super()._preprocessing(*args, **kwargs)
            for action in self._actions:  # show --save-every before --save_every, always
                action.option_strings.sort(key=lambda o: (len(o), "_" in o))

        def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
            ns, extra = self.parse_known_args(args, namespace)
            if extra:
                parser = _chosen_subparser(self, ns) or self
                parser.error(unknown_arguments_message(parser, extra))
            return ns

    return Parser(prog=prog, description=description, epilog=epilog)


def ArgumentParser(prog: str | None = None, description: str | None = None, epilog: str | None = None,
                   **ignored: Any) -> argparse.ArgumentParser:  # noqa: N802 - a drop-in for argparse's class
    """``argparse.ArgumentParser(prog=..., description=...)`` with the project's behaviour
    (:func:`make_parser`), for scripts that add their flags one by one; formatting keywords
    argparse takes (``formatter_class``, ...) are the project's own."""
    return make_parser(prog, description, epilog)


def _chosen_subparser(parser: argparse.ArgumentParser, ns: Any) -> argparse.ArgumentParser | None:
    """The sub-command's parser a parse went into (its own usage and flags for the error)."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public API for this
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            chosen = action.choices.get(getattr(ns, action.dest, None) or "")
            if chosen is not None:
                return _chosen_subparser(chosen, ns) or chosen
    return None


def unknown_arguments_message(parser: argparse.ArgumentParser, extra: Sequence[str]) -> str:
    """``unrecognized arguments: --polic (did you mean --policy?)``: each unknown flag with the
    closest flag ``parser`` has (a flag it abbreviates, else the most similar spelling).

    >>> p = make_parser("demo")
    >>> _ = p.add_argument("--policy"), p.add_argument("--total-timesteps", type=int)
    >>> unknown_arguments_message(p, ["--polic", "x", "--total-timestep=10", "--zzz"])
    'unrecognized arguments: --polic x --total-timestep=10 --zzz (--polic: did you mean --policy?; --total-timestep: did you mean --total-timesteps?)'
    """
    import difflib

    flags = sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--")})  # noqa: SLF001
    hints = []
    for token in extra:
        if not token.startswith("--"):
            continue
        name = token.split("=", 1)[0]
        starts = [f for f in flags if f.startswith(name)]
        close = starts[:1] if len(starts) == 1 else difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
        if close:
            hints.append(f"{name}: did you mean {close[0]}?")
    message = "unrecognized arguments: " + " ".join(extra)
    return message + (f" ({'; '.join(hints)})" if hints else "")


def _make_formatter():
    from simple_parsing.help_formatter import SimpleHelpFormatter

    class HelpFormatter(SimpleHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """simple-parsing's (defaults and types shown), keeping the description's line breaks."""

        def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
            if action.type is None and action.choices is None:  # a plain add_argument: argparse's FLAG
                return action.dest.upper()
            return super()._get_default_metavar_for_optional(action)

    return HelpFormatter


class _LazyFormatter:
    def __call__(self, *args: Any, **kwargs: Any):
        return _make_formatter()(*args, **kwargs)


_HelpFormatter = _LazyFormatter()


def add_dataclass(parser: argparse.ArgumentParser, cls: type, dest: str, **view_options: Any) -> type:
    """Add ``cls``'s command-line view (see :func:`cli_view`) to ``parser`` under ``dest``."""
    view = cli_view(cls, **view_options)
    parser.add_arguments(view, dest=dest)  # type: ignore[attr-defined]
    return view


def accept_underscores(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Also accept ``--save_every`` for every ``--save-every`` option (old commands keep working),
    in ``parser`` and its sub-commands."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public API for this
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in set(action.choices.values()):
                accept_underscores(sub)
        extra = [s.replace("-", "_").replace("__", "--", 1) for s in action.option_strings
                 if s.startswith("--") and "-" in s[2:]]
        for spelling in extra:
            if spelling not in parser._option_string_actions:  # noqa: SLF001
                parser._option_string_actions[spelling] = action  # noqa: SLF001
    return parser


def to_instance(cls: type, view_value: Any, **replace: Any) -> Any:
    """``cls(**fields of the parsed view)``, flattening repeated ``*_opt`` lists."""
    values = {f.name: getattr(view_value, f.name) for f in dataclasses.fields(view_value)}
    for name, value in values.items():
        if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            values[name] = [x for item in value for x in (item if isinstance(item, list) else [item])]
    for name in getattr(type(view_value), "dict_fields", ()):
        values[name] = parse_options(values[name], f"--{name.replace('_', '-')}")
    values.update(replace)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def parse_dataclass(cls: type, argv: Sequence[str] | None = None, prog: str | None = None,
                    description: str | None = None, known_only: bool = False):
    """Parse ``argv`` into ``cls``; with ``known_only`` return ``(instance, unknown_args)``."""
    parser = make_parser(prog or cls.__name__, description or (cls.__doc__ or "").strip().split("\n\n")[0])
    add_dataclass(parser, cls, "config")
    accept_underscores(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    if known_only:
        ns, rest = parser.parse_known_args(argv)
        return to_instance(cls, ns.config), rest
    return to_instance(cls, parser.parse_args(argv).config)


USER_ERRORS = (MedVQAError, DatasetError, FileNotFoundError, NotADirectoryError)


def run_cli(prog: str, main: Callable[[], Any]) -> int:
    """Run ``main()``; a user error (:class:`MedVQAError`, a missing file) prints
    ``prog: error: ...`` to stderr and returns 2 instead of a traceback. An ``int`` result is
    the exit code; anything else means success (0)."""
    try:
        result = main()
    except USER_ERRORS as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return result if isinstance(result, int) and not isinstance(result, bool) else 0
