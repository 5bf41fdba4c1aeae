"""Env overhead per step: ``MedVQAEnv.step`` with an ``image_zoom_in`` call vs. the bare crop it wraps.

Both sides run on the same VQA-RAD images (or the embedded default when VQA-RAD is absent) and the
same boxes, interleaved in one run. Overhead = env step - bare crop+resize; goal: < 1 ms.

    python benchmarks/bench_env.py [--quick] [--vqa-rad ../shared/data/vqa_rad]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from medvqa_env.env import MedVQAEnv  # noqa: E402
from rewards import RuleReward  # noqa: E402
from tool_backends.geometry import expand_to_min_size, resolve_bbox  # noqa: E402
from tool_backends.toolbox import Toolbox  # noqa: E402
from tool_backends.zoom import ZoomTool, crop_and_resize  # noqa: E402

from figures import record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)


def _dataset(vqa_rad: str | None):
    if vqa_rad and (Path(vqa_rad) / "source" / "testset.json").is_file():
        return "vqa_rad", {"root": vqa_rad}
    return "embedded", {}


def measure(episodes: int, vqa_rad: str | None) -> dict[str, float]:
    name, opts = _dataset(vqa_rad)
    tool = ZoomTool()
    env = MedVQAEnv(dataset=name, split="test", dataset_options=opts, reward=RuleReward(),
                    tools=Toolbox.local([tool], cache=None))
    bare, step, parse_only = [], [], []
    from medvqa_env.parser import parse_action

    for i in range(episodes):
        _, _ = env.reset(options={"index": i % len(env.dataset)})
        image = env.images[0]
        w, h = image.size
        bbox = [w // 5, h // 4, w // 5 + w // 3, h // 4 + h // 3]
        action = '<think>look closer</think><tool_call>' + json.dumps(
            {"name": "image_zoom_in", "arguments": {"bbox": bbox}}) + '</tool_call>'
        def bare_crop():
            box = expand_to_min_size(resolve_bbox(bbox, image.size), image.size, tool.min_size)
            crop_and_resize(image, box, tool.target_short_side, tool.max_side)

        def step_and_read():
            """The step, then the crop's pixels read (the tool returns it undrawn until then)."""
            env.step(action)
            env.images[-1].load()

        # Alternate which side runs first: the second one finds the image's pixels warm in cache.
        first, second = (bare_crop, step_and_read) if i % 2 == 0 else (step_and_read, bare_crop)
        t0 = time.perf_counter()
        first()
        t1 = time.perf_counter()
        second()
        t2 = time.perf_counter()
        parse_action(action)
        t3 = time.perf_counter()
        bare.append(t1 - t0 if i % 2 == 0 else t2 - t1)
        step.append(t2 - t1 if i % 2 == 0 else t1 - t0)
        parse_only.append(t3 - t2)
    med = statistics.median
    return {"dataset": name, "episodes": episodes, "bare_ms": med(bare) * 1e3, "step_ms": med(step) * 1e3,
            "overhead_ms": (med(step) - med(bare)) * 1e3, "parse_ms": med(parse_only) * 1e3,
            # the same figures from the half of the steps where each side ran first
            "bare_first_ms": med(bare[0::2]) * 1e3, "step_first_ms": med(step[1::2]) * 1e3}


def main(argv: list[str] | None = None) -> str:
    ap = ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vqa-rad", default="../shared/data/vqa_rad")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                    "none with --quick)")
    args = ap.parse_args(argv)
    r = measure(60 if args.quick else 400, args.vqa_rad)
    command = f"python benchmarks/bench_env.py{' --quick' if args.quick else ''}"
    section = "\n".join([
        "## Env overhead per step (zoom tool)",
        "",
        f"`{command}` — {r['episodes']} steps on {r['dataset']} images, medians; cache off so every step runs "
        "the crop; the step's crop is read after it (the tool returns it undrawn until read); the bare crop and "
        "the env step take turns going first.",
        "",
        "| what | ms/step | ratio to bare crop |",
        "|---|---:|---:|",
        f"| bare crop + resize (baseline) | {r['bare_ms']:.3f} | 1.00 |",
        f"| `env.step` with an `image_zoom_in` call | {r['step_ms']:.3f} | {r['step_ms'] / r['bare_ms']:.2f} |",
        f"| of which parsing the turn | {r['parse_ms']:.3f} | {r['parse_ms'] / r['bare_ms']:.2f} |",
        f"| **env overhead** (step − bare) | **{r['overhead_ms']:.3f}** | goal < 1 ms |",
        f"| same, each side timed only when it ran first | {r['step_first_ms'] - r['bare_first_ms']:.3f} | |",
        "",
    ])
    figures = {k: r[k] for k in ("bare_ms", "step_ms", "parse_ms", "overhead_ms", "bare_first_ms", "step_first_ms")}
    figures["overhead_first_ms"] = r["step_first_ms"] - r["bare_first_ms"]
    figures["steps"] = r["episodes"]
    record("env", section, figures, command, results_dir_arg(args.quick, args.results))
    return section


if __name__ == "__main__":
    main()
