"""``python -m tool_backends.finetune {ground,segment,classify} --out DIR [--dataset ...]``.

Examples::

    python -m tool_backends.finetune ground --out runs/tools/ground
    python -m tool_backends.finetune segment --dataset slake --dataset-opt root=/data/slake --out runs/tools/seg
    python -m tool_backends.finetune classify --steps 200 --seed 1 --out runs/tools/clf

Then ``tools={"ground": {"engine": "centernet", "model": "runs/tools/ground"}}`` (``segment``:
engine ``sam``; ``classify``: engine ``clip``).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Sequence

from tool_backends.finetune import ENGINE_OF, TRAINERS, finetune
from tool_backends.finetune.common import FinetuneArgs

PROG = "python -m tool_backends.finetune"


def parse(argv: Sequence[str] | None = None) -> tuple[str, FinetuneArgs]:
    from medvqa_env.cli import accept_underscores, add_dataclass, make_parser, to_instance

    parser = make_parser(PROG, __doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    for kind in TRAINERS:
        p = sub.add_parser(kind, help=f"train the {kind} tool (engine {ENGINE_OF[kind]!r})",
                           description=FinetuneArgs.__doc__, formatter_class=parser.formatter_class,
                           add_option_string_dash_variants=parser.add_option_string_dash_variants,
                           add_config_path_arg=False)
        add_dataclass(p, FinetuneArgs, "args")
    accept_underscores(parser)
    ns = parser.parse_args(argv)
    return ns.kind, to_instance(FinetuneArgs, ns.args)


def main(argv: Sequence[str] | None = None) -> int:
    from medvqa_env.cli import run_cli

    kind, args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def run() -> int:
        info = finetune(kind, args)
        out = info["out"]
        summary = {k: info.get(k) for k in ("tool", "engine", "dataset", "split", "n_images", "steps", "seed",
                                            "train_cpu_seconds")}
        summary["validation"] = {k: v for k, v in info.get("validation", {}).items()
                                 if not isinstance(v, dict)}
        print(json.dumps(summary))
        print(f"{PROG}: wrote {out} (load it with engine {ENGINE_OF[kind]!r}, model={out!r})")
        return 0

    return run_cli(PROG, run)


if __name__ == "__main__":
    sys.exit(main())
