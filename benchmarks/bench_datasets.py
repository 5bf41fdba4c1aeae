"""Dataset loading: the embedded default generated cold vs. reused warm, beside two baselines.

* cold: ``load_embedded`` for train/val/test into an empty folder (draw + write every file);
* I/O floor (baseline): writing the same number of files with the same bytes, no drawing;
* warm: the same calls again (manifest found, nothing written);
* VQA-RAD (reference loader): ``load_vqa_rad`` train + test from the real copy, when present.

Wall and CPU seconds are both reported: the machine is shared, so CPU time is the steadier figure.

    python benchmarks/bench_datasets.py [--quick] [--vqa-rad ../shared/data/vqa_rad]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from medvqa_env.datasets.embedded import SPLIT_SIZES, load_embedded  # noqa: E402
from medvqa_env.datasets.vqa_rad import load_vqa_rad  # noqa: E402
from figures import record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)


def _timed(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def _cold(root: Path, splits) -> None:
    for s in splits:
        load_embedded(s, root=root)


def _io_floor(src: Path, dst: Path) -> None:
    """Write every file of a generated cache again (same bytes, same temp+rename), no drawing."""
    for p in sorted(src.rglob("*.png")):
        data = p.read_bytes()
        out = dst / p.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out)


def measure(repeats: int, splits, vqa_rad: str | None) -> dict:
    cold, warm, floor, rad = [], [], [], []
    files = 0
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            root = Path(d) / "emb"
            cold.append(_timed(lambda: _cold(root, splits)))
            warm.append(_timed(lambda: _cold(root, splits)))
            files = sum(1 for p in root.rglob("*") if p.is_file())
            floor.append(_timed(lambda: _io_floor(root, Path(d) / "copy")))
        if vqa_rad and (Path(vqa_rad) / "source" / "testset.json").is_file():
            rad.append(_timed(lambda: [load_vqa_rad(s, root=vqa_rad) for s in ("train", "test")]))
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    out = {"repeats": repeats, "files": files, "questions": sum(SPLIT_SIZES[s] for s in splits),
           "splits": list(splits)}
    for name, xs in (("cold", cold), ("warm", warm), ("floor", floor), ("rad", rad)):
        out[name] = (med(xs, 0), med(xs, 1)) if xs else None
    return out


def main(argv: list[str] | None = None) -> str:
    ap = ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="test split only, one repeat")
    ap.add_argument("--vqa-rad", default="../shared/data/vqa_rad")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                    "none with --quick)")
    args = ap.parse_args(argv)
    splits = ("test",) if args.quick else ("train", "val", "test")
    r = measure(1 if args.quick else 3, splits, args.vqa_rad)
    cold_w, cold_c = r["cold"]
    rows = [
        f"| embedded, cold: draw + write ({r['files']} files) | {cold_w:.2f} | {cold_c:.2f} | 1.00 |",
        f"| I/O floor: write the same files, no drawing (baseline) | {r['floor'][0]:.2f} | {r['floor'][1]:.2f} | "
        f"{r['floor'][1] / cold_c:.2f} |",
        f"| embedded, warm: manifest reused, nothing written | {r['warm'][0]:.3f} | {r['warm'][1]:.3f} | "
        f"{r['warm'][1] / cold_c:.3f} |",
    ]
    if r["rad"]:
        rows.append(f"| VQA-RAD loader, train + test, 3,515 questions (reference) | {r['rad'][0]:.3f} | "
                    f"{r['rad'][1]:.3f} | {r['rad'][1] / cold_c:.3f} |")
    command = f"python benchmarks/bench_datasets.py{' --quick' if args.quick else ''}"
    section = "\n".join([
        "## Dataset loading: the embedded default",
        "",
        f"`{command}` — splits {', '.join(splits)} "
        f"({r['questions']} questions), median of {r['repeats']} run(s) in fresh temporary folders.",
        "",
        "| what | wall s | CPU s | CPU ratio to cold |",
        "|---|---:|---:|---:|",
        *rows,
        "",
    ])
    figures = {"files": r["files"], "questions": r["questions"]}
    for name in ("cold", "warm", "floor", "rad"):
        if r[name]:
            figures[f"{name}.wall_s"], figures[f"{name}.cpu_s"] = r[name]
            figures[f"{name}.cpu_ratio"] = r[name][1] / cold_c
    record("datasets", section, figures, command, results_dir_arg(args.quick, args.results))
    return section


if __name__ == "__main__":
    main()
