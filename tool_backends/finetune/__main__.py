"""``python -m tool_backends.finetune {ground,segment,classify} --out DIR [--dataset ...]``
(the same command as ``medvqa-tools build KIND --out DIR ...``).

Examples::

    python -m tool_backends.finetune ground --out runs/tools/ground
    python -m tool_backends.finetune segment --dataset slake --dataset-opt root=/data/slake --out runs/tools/seg
    python -m tool_backends.finetune classify --steps 200 --seed 1 --out runs/tools/clf

Then ``tools={"ground": {"engine": "trained", "path": "runs/tools/ground"}}`` (likewise
``segment`` and ``classify``). A progress bar shows the steps, the loss and the time left; the
last lines give the held-out quality, the folder and its content hash.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Sequence

from tool_backends.finetune import ENGINE_OF, TRAINERS, finetune
from tool_backends.finetune.common import FinetuneArgs

PROG = "python -m tool_backends.finetune"


def add_kind_parsers(parser: argparse.ArgumentParser, dest: str = "kind") -> None:
    """One sub-command per tool kind on ``parser``, each taking :class:`FinetuneArgs` (into ``args``)."""
    from medvqa_env.cli import add_dataclass

    sub = parser.add_subparsers(dest=dest, required=True)
    for kind in TRAINERS:
        p = sub.add_parser(kind, help=f"train the {kind} tool (engine 'trained', path=DIR)",
                           description=FinetuneArgs.__doc__, formatter_class=parser.formatter_class,
                           add_option_string_dash_variants=parser.add_option_string_dash_variants,
                           add_config_path_arg=False)
        add_dataclass(p, FinetuneArgs, "args")


def parse(argv: Sequence[str] | None = None) -> tuple[str, FinetuneArgs]:
    from medvqa_env.cli import accept_underscores, make_parser, to_instance

    parser = make_parser(PROG, __doc__.split("\n\n")[0])
    add_kind_parsers(parser)
    accept_underscores(parser)
    ns = parser.parse_args(argv)
    return ns.kind, to_instance(FinetuneArgs, ns.args)


def build(kind: str, args: FinetuneArgs, prog: str = PROG) -> dict[str, Any]:
    """Build tool ``kind`` and print what a user needs next: a JSON summary, the held-out line,
    the folder with its content hash, and the config that loads it."""
    info = finetune(kind, args)
    out = info["out"]
    summary = {k: info.get(k) for k in ("tool", "engine", "dataset", "split", "n_images", "steps", "seed",
                                        "torch_threads", "train_cpu_seconds", "content_hash")}
    summary["validation"] = {k: v for k, v in info.get("validation", {}).items() if not isinstance(v, dict)}
    print(json.dumps(summary))
    print(info["held_out"])
    print(f"{prog}: wrote {out} (content hash {info['content_hash'][:12]}); load it with "
          f"tools={{{kind!r}: {{'engine': 'trained', 'path': {out!r}}}}} (or engine {ENGINE_OF[kind]!r}, model={out!r})")
    return info


def main(argv: Sequence[str] | None = None) -> int:
    from medvqa_env.cli import run_cli

    kind, args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return run_cli(PROG, lambda: build(kind, args) and 0)


if __name__ == "__main__":
    sys.exit(main())
