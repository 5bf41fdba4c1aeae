"""Shared pieces of the trainer tests."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from train import evaluate, grpo, protocol, sft
from train.common import parse_args


@pytest.fixture()
def fake_protocol_runs(monkeypatch):
    """``fake_protocol_runs(after=None)``: ``protocol.run`` stood in. Each run's argv is parsed with the
    trainer's own parser; the stand-in records every (name, module, parsed args) in the returned list and
    writes the run's files (``args.json``, ``metrics.jsonl`` with a held-out figure per evaluation,
    checkpoints, ``DONE``); ``after(folder, module, args)`` may write more (e.g. stored answers)."""

    def install(after: Callable[[Any, str, Any], None] | None = None) -> list:
        calls = []

        def fake_run(out, name, module, argv):
            cls = {"train.sft": sft.Args, "train.grpo": grpo.Args}.get(module)
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            if cls is None:  # train.evaluate: the warm start's test figure, or a candidate's val probe
                ev = parse_args(evaluate.Args, argv)
                result = {"metrics": {"eval/accuracy": 0.5}}
                if ev.probe_samples:  # a later checkpoint reads the tool better (forced call), samples alike
                    step = int(ev.policy.rsplit("_", 1)[1])
                    result["probe"] = {"greedy": 0.5, "forced": 0.5 + 0.004 * step, "forced_se": 0.02,
                                       "sampled": 0.55, "sampled_se": 0.03, "call_rate": 0.1}
                (out / name / "eval.json").write_text(json.dumps(result))
                calls.append((name, module, ev))
            else:
                args = parse_args(cls, argv)
                calls.append((name, module, args))
                (folder / "args.json").write_text(json.dumps({"args": vars(args)}, default=str))
                every = args.save_every or args.steps
                rows = [{"step": s, "eval/accuracy": 0.5 + 0.001 * s + (0.2 if args.eval_split == "test" else 0.0)}
                        for s in range(every, args.steps + 1, every)]
                (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
                for r in rows:
                    (folder / "checkpoints" / f"step_{r['step']:06d}").mkdir(parents=True, exist_ok=True)
                if after is not None:
                    after(folder, module, args)
            (folder / "DONE").write_text("{}")
            with open(out / "runs.jsonl", "a") as f:
                f.write(json.dumps({"name": name, "rc": 0, "cpu_s": 1.0}) + "\n")
            return {"name": name, "rc": 0}

        monkeypatch.setattr(protocol, "run", fake_run)
        return calls

    return install
