"""Held-out quality of the tools: ``classical``, ``trained`` and ``oracle`` engines side by side on
the embedded test split, called through the real tools the way a policy calls them.

* ``ground``: precision and recall per query label (``ground(text=<label>)`` on every test image;
  a box is right when its IoU with a not yet matched annotated box of that label is >= 0.3,
  highest score first); the presence questions ("Is there a lesion in the {host}?" -> yes iff
  ``ground(text="{host} lesion")`` returns a box), the organ questions (the first box of
  ``ground(text="lesion")`` names the organ: its label without " lesion") and the count
  questions (how many boxes ``ground(text="lesion")`` returns).
* ``segment``: Dice of the mask from each annotated mask's own box as the prompt, organs and
  lesions separately, and how often the mask is one connected piece, as every annotated one is.
* ``classify``: top-1 accuracy on modality (labels CT, MRI, X-Ray, Ultrasound: the MCQ's
  choices) and on lesion vs no lesion.

The trained engines are the cached ``trained`` folders (trained on the train split, threshold
chosen on val) -- built here when missing; their training CPU seconds come from each folder's
``medvqa_tool.json``. ``--quick`` trains tiny ones into a temporary folder on a few images and
keeps nothing.

    python benchmarks/bench_tool_quality.py [--quick] [--split test]
"""

from __future__ import annotations

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library
import os
import re
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

from figures import command_line, record, results_dir_arg  # noqa: E402  (benchmarks/figures.py)
from medvqa_env.datasets import load_dataset  # noqa: E402
from medvqa_env.images import load_image  # noqa: E402
from medvqa_env.parser import ToolCall  # noqa: E402
from tool_backends.base import ToolContext  # noqa: E402
from tool_backends.finetune.common import FinetuneArgs, read_info  # noqa: E402
from tool_backends.finetune.quality import MATCH_IOU, dice, match_boxes, prf  # noqa: E402
from tool_backends.masks import load_mask, mask_bbox, rle_to_mask  # noqa: E402
from tool_backends.toolbox import Toolbox  # noqa: E402

PRESENCE = re.compile(r"Is there a lesion in the (.*)\?")
MODALITIES = ["CT", "MRI", "X-Ray", "Ultrasound"]
ENGINES = {"ground": ["classical", "trained", "oracle"], "segment": ["classical", "trained", "oracle"],
           "classify": ["trained", "oracle"]}
LOADS_BY_PATH = {"ground": "centernet", "segment": "sam", "classify": "clip"}


# ---- the trained folders ----------------------------------------------------------------------
def trained_folders(quick: bool, tmp: str) -> dict[str, Path]:
    """The folder each ``trained`` engine loads (the cache's, trained when missing), or with
    ``quick`` tiny ones trained into ``tmp``."""
    if quick:
        from tool_backends.finetune import finetune

        out = {}
        for kind in ENGINES:
            out[kind] = Path(tmp) / kind
            finetune(kind, FinetuneArgs(out=str(out[kind]), max_images=24, steps=5, val_split="none", batch_size=4))
        return out
    from tool_backends.finetune.cache import trained_folder

    return {kind: trained_folder(kind) for kind in ENGINES}


def toolbox(kind: str, engine: str, folders: dict[str, Path]) -> Toolbox:
    options = {"engine": LOADS_BY_PATH[kind], "model": str(folders[kind])} if engine == "trained" else {"engine": engine}
    return Toolbox.from_config({kind: {"backend": "local", **options}}, cache=False)


class Images:
    """Test images read once."""

    def __init__(self) -> None:
        self._cache: dict[str, object] = {}

    def __call__(self, path: str):
        if path not in self._cache:
            self._cache[path] = load_image(path)
        return self._cache[path]


def _call(tb: Toolbox, name: str, arguments: dict, image, annotations):
    return tb.call(ToolCall(name, arguments), [image], ToolContext(annotations=annotations)).result


# ---- ground -----------------------------------------------------------------------------------
def ground_quality(tb: Toolbox, records, images: Images, labels: list[str]) -> dict:
    """Per-label detection counts, and the presence / organ / count question accuracies."""
    per_label = {lab: [0, 0, 0] for lab in labels}
    seen = {}
    for r in records:
        seen.setdefault(r.image_paths[0], r.annotations)
    t0 = time.process_time()
    calls = 0
    for path, ann in seen.items():
        for lab in labels:
            out = _call(tb, "ground", {"text": lab, "max_boxes": 20}, images(path), ann)
            calls += 1
            gold = [list(b.bbox) for b in ann.boxes if b.label == lab]
            tp, fp, fn = match_boxes([b["bbox"] for b in out.data.get("boxes", [])], gold, MATCH_IOU)
            c = per_label[lab]
            c[0] += tp
            c[1] += fp
            c[2] += fn
    questions = {"presence": [], "organ": [], "organ_largest": [], "count": []}
    for r in records:
        image = images(r.image_paths[0])
        if r.question_type == "PRES":
            host = PRESENCE.match(r.question).group(1)
            out = _call(tb, "ground", {"text": f"{host} lesion"}, image, r.annotations)
            questions["presence"].append(("yes" if out.data.get("boxes") else "no") == r.answer)
        elif r.question_type in ("ORGAN", "COUNT"):
            out = _call(tb, "ground", {"text": "lesion"}, image, r.annotations)
            boxes = out.data.get("boxes", [])
            if r.question_type == "COUNT":
                questions["count"].append(r.options[r.answer] == str(len(boxes)))
            else:
                first = boxes[0]["label"] if boxes else ""
                largest = max(boxes, key=lambda b: (b["bbox"][2] - b["bbox"][0]) * (b["bbox"][3] - b["bbox"][1]),
                              default={"label": ""})["label"]
                questions["organ"].append(first.removesuffix(" lesion") == r.answer)
                questions["organ_largest"].append(largest.removesuffix(" lesion") == r.answer)
        else:
            continue
        calls += 1
    return {"per_label": {lab: {**prf(*c), "n_gold": c[0] + c[2]} for lab, c in per_label.items()},
            "micro": prf(*(sum(c[i] for c in per_label.values()) for i in range(3))),
            **{q: (float(np.mean(v)) if v else None) for q, v in questions.items()},
            "n": {q: len(v) for q, v in questions.items()}, "cpu_ms_per_call": 1000 * (time.process_time() - t0) / calls}


# ---- segment ----------------------------------------------------------------------------------
def segment_quality(tb: Toolbox, records, images: Images) -> dict:
    """Dice from each annotated mask's box, organs and lesions apart; one-piece rate."""
    scores = {"organ": [], "lesion": []}
    pieces = []
    seen = set()
    for r in records:
        path = r.image_paths[0]
        if path in seen:
            continue
        seen.add(path)
        image = images(path)
        for m in r.annotations.masks:
            gold = load_mask(m.path, image.size)
            box = mask_bbox(gold)
            if not box:
                continue
            out = _call(tb, "segment", {"bbox": box}, image, r.annotations)
            pred = rle_to_mask(out.data["mask_rle"]) if out.data.get("mask_rle") else np.zeros_like(gold)
            scores["lesion" if m.label.endswith("lesion") else "organ"].append(dice(pred, gold))
            pieces.append(out.data.get("n_components") == 1)
    return {"dice_organ": float(np.mean(scores["organ"])), "dice_lesion": float(np.mean(scores["lesion"])),
            "one_piece": float(np.mean(pieces)), "n_organ": len(scores["organ"]), "n_lesion": len(scores["lesion"])}


# ---- classify ---------------------------------------------------------------------------------
def classify_quality(tb: Toolbox, records, images: Images) -> dict:
    right = {"modality": [], "lesion": []}
    seen = set()
    for r in records:
        path = r.image_paths[0]
        if path in seen:
            continue
        seen.add(path)
        image = images(path)
        out = _call(tb, "classify", {"labels": MODALITIES}, image, r.annotations)
        right["modality"].append(out.data["top"] == r.modality)
        truth = "lesion" if "lesion" in r.annotations.labels else "no lesion"
        out = _call(tb, "classify", {"labels": ["lesion", "no lesion"]}, image, r.annotations)
        right["lesion"].append(out.data["top"] == truth)
    return {k: float(np.mean(v)) for k, v in right.items()} | {"n": len(right["modality"])}


# ---- report -----------------------------------------------------------------------------------
def _pct(v) -> str:
    return "—" if v is None else f"{100 * v:.1f} %"


def tables(results: dict, infos: dict) -> dict[str, str]:
    g = results["ground"]
    head = "| | " + " | ".join(ENGINES["ground"]) + " |\n|---|" + "---:|" * len(ENGINES["ground"])
    q_rows = [f"| {name} ({g['classical']['n'][key]} questions) | "
              + " | ".join(_pct(g[e][key]) for e in ENGINES["ground"]) + " |"
              for key, name in (("presence", "presence: yes iff `ground(\"{host} lesion\")` finds a box"),
                                ("organ", "organ: first (highest-scoring) box of `ground(\"lesion\")` names it"),
                                ("organ_largest", "organ: largest box of `ground(\"lesion\")` names it"),
                                ("count", "count: boxes of `ground(\"lesion\")`"))]
    q_rows.append("| micro precision / recall, every label queried on every image | "
                  + " | ".join(f"{_pct(g[e]['micro']['precision'])} / {_pct(g[e]['micro']['recall'])}"
                               for e in ENGINES["ground"]) + " |")
    q_rows.append("| CPU ms per call | " + " | ".join(f"{g[e]['cpu_ms_per_call']:.1f}" for e in ENGINES["ground"]) + " |")
    labels = list(g["trained"]["per_label"])
    l_head = ("| query label | annotated | " + " | ".join(f"{e} P / R" for e in ENGINES["ground"]) + " |\n|---|---:|"
              + "---:|" * len(ENGINES["ground"]))
    l_rows = [f"| {lab} | {g['trained']['per_label'][lab]['n_gold']} | "
              + " | ".join(f"{_pct(g[e]['per_label'][lab]['precision'])} / {_pct(g[e]['per_label'][lab]['recall'])}"
                           for e in ENGINES["ground"]) + " |" for lab in labels]
    s = results["segment"]
    s_head = "| | " + " | ".join(ENGINES["segment"]) + " |\n|---|" + "---:|" * len(ENGINES["segment"])
    s_rows = [f"| Dice, organs ({s['classical']['n_organ']} masks) | " + " | ".join(f"{s[e]['dice_organ']:.3f}" for e in ENGINES["segment"]) + " |",
              f"| Dice, lesions ({s['classical']['n_lesion']} masks) | " + " | ".join(f"{s[e]['dice_lesion']:.3f}" for e in ENGINES["segment"]) + " |",
              "| one connected piece (as annotated) | " + " | ".join(_pct(s[e]['one_piece']) for e in ENGINES["segment"]) + " |"]
    c = results["classify"]
    c_head = "| | chance | " + " | ".join(ENGINES["classify"]) + " |\n|---|---:|" + "---:|" * len(ENGINES["classify"])
    c_rows = [f"| modality of {c['trained']['n']} images (CT / MRI / X-Ray / Ultrasound) | 25.0 % | "
              + " | ".join(_pct(c[e]['modality']) for e in ENGINES["classify"]) + " |",
              "| lesion vs no lesion | 50.0 % | " + " | ".join(_pct(c[e]['lesion']) for e in ENGINES["classify"]) + " |"]
    t_head = ("| tool | engine loading the folder | steps | torch threads | training CPU s | build CPU s (data, training, "
              "validation) | validation |\n|---|---|---:|---:|---:|---:|---|")
    t_rows = []
    for kind, info in infos.items():
        v = info.get("validation", {})
        val = {"ground": lambda: f"macro-F1 {v.get('macro_f1')} at threshold {v.get('threshold')}",
               "segment": lambda: f"mean Dice {v.get('mean_dice')}",
               "classify": lambda: ", ".join(f"{'/'.join(gr['labels'])} {gr['accuracy']}" for gr in v.get("groups", []))}[kind]()
        t_rows.append(f"| {kind} | {LOADS_BY_PATH[kind]} | {info.get('steps')} | {info.get('torch_threads', '—')} | "
                      f"{info.get('train_cpu_seconds')} | "
                      f"{info.get('build_cpu_seconds')} | {val} ({v.get('source')}) |")
    return {"ground": "\n".join([head, *q_rows]), "ground_labels": "\n".join([l_head, *l_rows]),
            "segment": "\n".join([s_head, *s_rows]), "classify": "\n".join([c_head, *c_rows]),
            "training": "\n".join([t_head, *t_rows])}


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny trained tools, 40 questions; keeps nothing")
    ap.add_argument("--split", default="test")
    ap.add_argument("--results", default=None, help="where to keep the results (default benchmarks/results; "
                    "none with --quick)")
    args = ap.parse_args(argv)
    records = list(load_dataset("embedded", split=args.split, **({"n": 40} if args.quick else {})))
    images = Images()
    with tempfile.TemporaryDirectory() as tmp:
        folders = trained_folders(args.quick, tmp)
        infos = {kind: read_info(folder) or {} for kind, folder in folders.items()}
        labels = sorted({b.label for r in records for b in r.annotations.boxes})
        measure = {"ground": lambda tb: ground_quality(tb, records, images, labels),
                   "segment": lambda tb: segment_quality(tb, records, images),
                   "classify": lambda tb: classify_quality(tb, records, images)}
        results: dict = {kind: {} for kind in ENGINES}
        for kind, engines in ENGINES.items():
            for engine in engines:
                tb = toolbox(kind, engine, folders)
                try:
                    results[kind][engine] = measure[kind](tb)
                finally:
                    tb.close()
    cmd = command_line("bench_tool_quality.py", argv)
    t = tables(results, infos)
    figures: dict = {f"table.{k}": v for k, v in t.items()}
    for engine, g in results["ground"].items():
        figures.update({f"ground.{engine}.{q}": g[q] for q in ("presence", "organ", "organ_largest", "count")})
        figures.update({f"ground.{engine}.micro_{k}": g["micro"][k] for k in ("precision", "recall")})
        figures.update({f"ground.{engine}.n_{q}": n for q, n in g["n"].items()})
    for engine, s in results["segment"].items():
        figures.update({f"segment.{engine}.{k}": v for k, v in s.items()})
    for engine, c in results["classify"].items():
        figures.update({f"classify.{engine}.{k}": v for k, v in c.items()})
    for kind, info in infos.items():
        figures[f"{kind}.train_cpu_seconds"] = info.get("train_cpu_seconds")
        figures[f"{kind}.build_cpu_seconds"] = info.get("build_cpu_seconds")
        figures[f"{kind}.steps"] = info.get("steps")
        figures[f"{kind}.torch_threads"] = info.get("torch_threads")
    n_images = len({r.image_paths[0] for r in records})
    section = "\n".join([
        f"## Tool quality on held-out data (embedded {args.split} split, {n_images} images)", "",
        f"`{cmd}`", "",
        "Classical, trained and oracle engines called through the real tools the way a policy calls them. The "
        "trained engines learned from the train split's annotations only (`python -m tool_backends.finetune`, "
        "cached by the `trained` engine); the threshold and quality below the training table were chosen and "
        "measured on the val split. Box match rule: IoU >= 0.3 with a not yet matched annotated box of the "
        "query's label, highest score first.", "",
        "### ground: the questions a policy asks", "", t["ground"], "",
        "### ground: precision / recall per query label", "", t["ground_labels"], "",
        "### segment: masks from the annotated mask's own box", "", t["segment"], "",
        "### classify: top-1 accuracy", "", t["classify"], "",
        "### Training (from each trained folder's medvqa_tool.json)", "", t["training"], ""])
    record("tool_quality", section, figures, cmd, results_dir_arg(args.quick, args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
