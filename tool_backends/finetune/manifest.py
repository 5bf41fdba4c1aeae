"""What names a trained tool: the inputs of its build and the hash of what the build wrote.

Two identities, both in the folder's ``medvqa_tool.json``:

* **build identity** (``"build"``, :func:`build_identity`): everything that decides the weights
  before any is computed -- the kind, the resolved recipe (steps, learning rate, batch size, image
  size, ...), the dataset, split and loader options, a hash of the annotated records the trainer
  reads (:func:`records_hash`: image and mask *bytes*, boxes and labels, not paths), the seed, the
  code version (:func:`code_version`: a hash of the trainer's and the model's source files), the
  torch version, the torch thread count and the device. The ``trained`` engines' cache is keyed
  by it (:func:`tool_backends.finetune.cache.cache_key`).
* **content hash** (``"content_hash"``, :func:`content_hash`): SHA-256 over every file of the
  folder (name and bytes: weights, config, processor files) and the manifest without its
  :data:`VOLATILE` fields (timings, creation time, output path, git commit). Two builds with the
  same inputs on one machine have the same content hash (the build is deterministic, see
  :func:`tool_backends.finetune.common.training_run`); a run records it, and
  :func:`verify_folder` refuses a folder whose files no longer hash to it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from medvqa_env.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_CODE = ("tool_backends/finetune/__init__.py", "tool_backends/finetune/common.py",
               "tool_backends/finetune/data.py", "tool_backends/finetune/manifest.py",
               "tool_backends/finetune/quality.py", "tool_backends/geometry.py", "tool_backends/masks.py",
               "medvqa_env/images.py")
CODE_FILES = {
    "ground": ("tool_backends/finetune/ground.py", "tool_backends/engines/centernet_model.py",
               "tool_backends/engines/centernet.py"),
    "segment": ("tool_backends/finetune/segment.py", "tool_backends/engines/hf_sam.py",
                "tool_backends/engines/hf_common.py", "tool_backends/engines/medsam_lite.py",
                "tool_backends/engines/medsam_lite_model.py"),
    "classify": ("tool_backends/finetune/classify.py", "tool_backends/engines/hf_clip.py",
                 "tool_backends/engines/hf_common.py"),
}
"""Per kind, the source files (besides :data:`SHARED_CODE`) whose text decides a build's weights."""
TRAINER_MODULES = {"ground": "tool_backends.finetune.ground", "segment": "tool_backends.finetune.segment",
                   "classify": "tool_backends.finetune.classify"}
VOLATILE = frozenset({"content_hash", "created", "build_cpu_seconds", "build_wall_seconds", "train_cpu_seconds",
                      "train_wall_seconds", "out", "git_commit", "git_dirty"})
"""Manifest fields left out of the content hash: they say when, where and how fast a build ran,
not what it built (the code it ran is in ``build.code_version``)."""
VOLATILE_SETTINGS = frozenset({"out", "progress"})
"""Command-line settings left out of the content hash likewise (where it was written, whether a bar showed)."""


# ----------------------------------------------------------------------------------------------
# Inputs of a build.
# ----------------------------------------------------------------------------------------------
def code_version(kind: str) -> dict[str, Any]:
    """``{"sha256": ..., "files": [...]}``: a hash of the source files that train and run tool
    ``kind`` (line endings normalised, so a Windows checkout hashes the same)."""
    if kind not in CODE_FILES:
        raise ConfigError(f"expected a tool kind among {sorted(CODE_FILES)}, got {kind!r}")
    files = sorted(set(SHARED_CODE) | set(CODE_FILES[kind]))
    h = hashlib.sha256()
    for rel in files:
        path = REPO_ROOT / rel
        data = path.read_bytes().replace(b"\r\n", b"\n") if path.is_file() else b"<missing>"
        h.update(f"{rel}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    return {"sha256": h.hexdigest(), "files": files}


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def records_hash(images: Iterable[Any]) -> dict[str, Any]:
    """``{"sha256", "n_images"}`` of annotated images (:class:`~tool_backends.finetune.data.AnnotatedImage`):
    each image's bytes, boxes, masks' bytes and labels, in order. Paths are left out, so the same
    data in another folder (another machine's cache) hashes the same."""
    h = hashlib.sha256()
    n = 0
    for im in images:
        row = {"image": file_digest(im.path), "boxes": [[label, list(box)] for label, box in im.boxes],
               "masks": [[label, _digest_or_missing(path)] for label, path in im.masks], "labels": list(im.labels)}
        h.update(json.dumps(row, sort_keys=True).encode() + b"\n")
        n += 1
    return {"sha256": h.hexdigest(), "n_images": n}


def _digest_or_missing(path: str) -> str:
    try:
        return file_digest(path)
    except OSError:
        return "<unreadable>"


@functools.lru_cache(maxsize=32)
def _split_hash(dataset: str, split: str, options_json: str, limit: int | None) -> dict[str, Any] | None:
    from medvqa_env.errors import DatasetError
    from tool_backends.finetune.data import annotated_images

    try:
        return records_hash(annotated_images(dataset, split, json.loads(options_json), limit=limit))
    except DatasetError:
        return None


def data_identity(args: Any) -> dict[str, Any]:
    """The records a build with ``args`` (:class:`~tool_backends.finetune.common.FinetuneArgs`)
    reads: ``{"train": records_hash, "val": records_hash or None}`` (``None``: no validation split
    loads, the trainer holds out training images). Hashed once per process per split."""
    from medvqa_env.config import parse_options

    train_opts = parse_options(args.dataset_opt, "--dataset-opt")
    train = _split_hash(args.dataset, args.split, json.dumps(train_opts, sort_keys=True, default=str), args.max_images)
    if train is None:
        from tool_backends.finetune.data import annotated_images

        annotated_images(args.dataset, args.split, train_opts, limit=args.max_images)  # raises the loader's error
    val = None
    if str(args.val_split).lower() not in ("none", ""):
        val_opts = parse_options(args.val_opt, "--val-opt") if args.val_opt else train_opts
        val = _split_hash(args.dataset, args.val_split, json.dumps(val_opts, sort_keys=True, default=str), None)
    return {"train": train, "val": val}


def recipe_of(kind: str, args: Any) -> dict[str, Any]:
    """The recipe a build with ``args`` runs: the kind's ``RECIPE`` with the command line's
    steps / lr resolved, and the batch size and image limit."""
    import importlib

    module = importlib.import_module(TRAINER_MODULES[kind])
    init = str(getattr(args, "init", "scratch"))
    if init == "scratch":
        recipe = dict(module.RECIPE)
    else:  # a pretrained start (segment: medsam_lite) has its own recipe
        starts = getattr(module, "PRETRAINED_RECIPES", {})
        if init not in starts:
            raise ConfigError(f"{kind}: --init {init!r} is not a start it knows; choose from {['scratch', *starts]}")
        recipe = {**starts[init], "init": init}
    if args.steps is not None:
        recipe["steps"] = int(args.steps)
    if args.lr is not None:
        recipe["lr"] = float(args.lr)
    recipe.update(batch_size=int(args.batch_size), max_images=args.max_images, val_split=str(args.val_split))
    return recipe


def build_identity(kind: str, args: Any) -> dict[str, Any]:
    """Everything that decides the weights a build of ``kind`` with ``args`` writes (see the module
    docstring); JSON, the input of the cache key and the manifest's ``build`` block."""
    import torch

    from medvqa_env.config import parse_options
    from tool_backends.finetune.cache import RECIPE_VERSION

    threads = int(args.torch_threads) if int(args.torch_threads) > 0 else torch.get_num_threads()
    return {
        "kind": kind, "recipe_version": RECIPE_VERSION.get(kind), "recipe": recipe_of(kind, args),
        "dataset": str(args.dataset), "split": str(args.split),
        "dataset_options": parse_options(args.dataset_opt, "--dataset-opt"),
        "val_options": parse_options(args.val_opt, "--val-opt") if args.val_opt else None,
        "records": data_identity(args), "seed": int(args.seed), "code_version": code_version(kind)["sha256"],
        "torch_version": str(torch.__version__), "torch_threads": threads, "device": str(args.device),
    }


# ----------------------------------------------------------------------------------------------
# What a build wrote.
# ----------------------------------------------------------------------------------------------
def hashed_manifest(info: Mapping[str, Any]) -> dict[str, Any]:
    """``info`` without its :data:`VOLATILE` fields (and :data:`VOLATILE_SETTINGS`): what the content hash covers."""
    out = {k: v for k, v in info.items() if k not in VOLATILE}
    if isinstance(out.get("settings"), Mapping):
        out["settings"] = {k: v for k, v in out["settings"].items() if k not in VOLATILE_SETTINGS}
    return out


def content_hash(folder: str | Path, info: Mapping[str, Any] | None = None) -> str:
    """SHA-256 (hex) of a tool folder: every file's relative name and bytes except the manifest and
    hidden files, then the manifest (``info``, default the folder's) without its volatile fields."""
    from tool_backends.finetune.common import TOOL_INFO, read_info

    folder = Path(folder)
    if info is None:
        info = read_info(folder)
        if info is None:
            raise ConfigError(f"{str(folder)!r} is not a trained tool folder (no readable {TOOL_INFO})")
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel == TOOL_INFO or any(part.startswith(".") for part in Path(rel).parts):
            continue
        h.update(f"{rel}\0{file_digest(path)}\n".encode())
    manifest = json.dumps(hashed_manifest(info), sort_keys=True, default=str)
    h.update(f"{TOOL_INFO}\0{hashlib.sha256(manifest.encode()).hexdigest()}\n".encode())
    return h.hexdigest()


def verify_folder(folder: str | Path, kind: str | None = None, expected: str | None = None) -> dict[str, Any]:
    """The manifest of the trained tool folder ``folder`` after checking it: a tool of ``kind``
    (when given), its files hashing to the manifest's ``content_hash`` (the weights were not changed
    after the build) and, when given, to ``expected`` (the hash a run or config pinned). A
    :class:`ConfigError` naming what differs otherwise. A folder built before content hashes
    existed (no ``content_hash``) passes the first check and gets one computed."""
    from tool_backends.finetune.common import TOOL_INFO, read_info

    folder = Path(folder)
    info = read_info(folder)
    if info is None:
        raise ConfigError(f"{str(folder)!r} is not a trained tool folder (no readable {TOOL_INFO}); build one with "
                          f"`medvqa-tools build {kind or 'KIND'} --out {folder}`")
    if kind is not None and info.get("tool") != kind:
        raise ConfigError(f"{str(folder)!r} holds a trained {info.get('tool')!r} tool, not a {kind!r} one")
    actual = content_hash(folder, info)
    recorded = info.get("content_hash")
    if recorded and recorded != actual:
        raise ConfigError(f"{str(folder)!r}: its files changed after the build (the manifest records content hash "
                          f"{recorded[:12]}, the files hash to {actual[:12]}); rebuild it with "
                          f"`medvqa-tools build {info.get('tool')} --out {folder}`")
    if expected and not actual.startswith(str(expected)):
        raise ConfigError(f"{str(folder)!r}: content hash {actual[:12]}, expected {str(expected)[:12]} (the tool was "
                          "rebuilt or replaced since the hash was recorded)")
    return {**info, "content_hash": actual}


def quality_line(info: Mapping[str, Any]) -> str:
    """One line of held-out quality from a manifest.

    >>> quality_line({"tool": "ground", "validation": {"macro_f1": 0.81, "threshold": 0.35, "n_images": 100, "source": "split 'val'"}})
    "ground: held-out macro-F1 0.810 at threshold 0.35 on 100 images (split 'val')"
    """
    kind, v = info.get("tool", "tool"), dict(info.get("validation") or {})
    source = f" ({v['source']})" if v.get("source") else ""
    if "macro_f1" in v:
        return f"{kind}: held-out macro-F1 {v['macro_f1']:.3f} at threshold {v.get('threshold')} on {v.get('n_images')} images{source}"
    if v.get("mean_dice") is not None:
        return f"{kind}: held-out mean Dice {v['mean_dice']:.3f} on {v.get('n_masks')} masks of {v.get('n_images')} images{source}"
    if v.get("groups"):
        parts = ", ".join(f"{'/'.join(g['labels'])} {g['accuracy']:.3f}" if g.get("accuracy") is not None
                          else f"{'/'.join(g['labels'])} n/a" for g in v["groups"])
        return f"{kind}: held-out accuracy {parts} on {v.get('n_images')} images{source}"
    return f"{kind}: no held-out quality measured ({v.get('note') or 'no validation images'})"


def manifest_summary(info: Mapping[str, Any]) -> dict[str, Any]:
    """What a run record keeps of a tool's manifest: the build's inputs that a reader compares
    (recipe, data hashes, seed, code version, torch version and threads) and the held-out line."""
    build = dict(info.get("build") or {})
    records = build.get("records") or {}
    return {
        "tool": info.get("tool"), "engine": info.get("engine"), "dataset": info.get("dataset"),
        "split": info.get("split"), "seed": info.get("seed"), "steps": info.get("steps"),
        "recipe": build.get("recipe"),
        "train_records_sha256": (records.get("train") or {}).get("sha256"),
        "val_records_sha256": (records.get("val") or {}).get("sha256"),
        "code_version": build.get("code_version"), "git_commit": info.get("git_commit"),
        "torch_version": info.get("torch_version"), "torch_threads": info.get("torch_threads"),
        "held_out": quality_line(info),
    }
