"""Our datasets -> verl's RL parquet format.

One row per :class:`~medvqa_env.records.VQARecord`, in the layout ``verl.utils.dataset.RLHFDataset``
reads:

* ``data_source`` -- ``"medvqa/<dataset>"`` (verl's reward routing key);
* ``prompt`` -- chat messages: the env's system prompt (it lists the tools' JSON schemas) and the
  user turn with one ``<image>`` placeholder per image, exactly as ``MedVQAEnv.reset`` builds them;
* ``images`` -- ``[{"bytes": ...}]`` (portable across nodes) or ``[{"image": "/abs/path"}]`` with
  ``image_mode="path"``. Bytes are the original file's when it is a plain PNG/JPEG the env shows as
  is; anything else (DICOM, NIfTI, 16-bit or float images, a ``#slice=``/``#window=`` fragment, an
  image over ``max_image_side``) is loaded as the env loads it and sent as the PNG of what the env
  shows, so verl's loader decodes it and sees the env's pixels. ``path`` mode needs plain files;
* ``ability`` -- ``"medical_vqa"``;
* ``reward_model`` -- ``{"style": "rule", "ground_truth": answer}``;
* ``extra_info`` -- ``index``, ``record_id``, ``dataset``, ``split``, ``answer_type``, ``question``,
  ``options`` (a list of ``{"key", "text"}``: parquet needs one schema for every row),
  ``modality``, ``organ``, ``answer_alternatives`` (the record's other accepted answers, VQA-Med's
  ``#``: verl's reward function credits them as the env does, :mod:`rewards.matching`);
* ``agent_name`` -- ``"medvqa_agent"`` (picks our agent loop per row).

The agent loop re-creates the episode from ``extra_info.record_id`` with the env, so the prompt in
the parquet is what verl uses for length filtering and what single-turn validation would see.

>>> options_to_rows({"A": "0", "B": "1"})
[{'key': 'A', 'text': '0'}, {'key': 'B', 'text': '1'}]
>>> options_from_rows([{'key': 'A', 'text': '0'}])
{'A': '0'}
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from medvqa_env import prompts
from medvqa_env.errors import ConfigError
from medvqa_env.records import VQADataset, VQARecord

from train.verl_integration.config import AGENT_NAME

IMAGE_MODES = ("bytes", "path", "none")
ABILITY = "medical_vqa"


def options_to_rows(options: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"key": str(k), "text": str(v)} for k, v in options.items()]


def options_from_rows(rows: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {str(r["key"]): str(r["text"]) for r in (rows or [])}


PLAIN_SUFFIXES = (".png", ".jpg", ".jpeg")


def shown_image_bytes(path: str, record_id: str, max_image_side: int = 4096) -> bytes:
    """What verl should decode for one record image: the file's own bytes when the env would show it
    unchanged (a plain 8-bit PNG/JPEG within ``max_image_side``), else the PNG of what it shows."""
    from PIL import Image

    from medvqa_env.frame import fit_image
    from medvqa_env.images import image_file, load_image

    file = image_file(path)
    if file == str(path) and Path(file).suffix.lower() in PLAIN_SUFFIXES:
        with Image.open(file) as im:
            if im.mode in ("RGB", "L", "RGBA", "P") and max(im.size) <= max_image_side:
                return Path(file).read_bytes()
    shown, _ = fit_image(load_image(path, record_id), max_image_side)
    buf = io.BytesIO()
    shown.save(buf, format="PNG")
    return buf.getvalue()


def record_to_row(record: VQARecord, index: int, system_prompt: str, image_mode: str = "bytes",
                  max_image_side: int = 4096) -> dict[str, Any]:
    """One verl row for ``record`` (``index`` is its position in the dataset)."""
    if image_mode not in IMAGE_MODES:
        raise ConfigError(f"expected image_mode in {IMAGE_MODES}, got {image_mode!r}")
    user_text = "<image>" * len(record.image_paths) + prompts.question_prompt(record)
    if image_mode == "none":  # a text policy: the question only (the env's tools still see the image)
        user_text, images = prompts.question_prompt(record), []
    elif image_mode == "bytes":
        images = [{"bytes": shown_image_bytes(p, record.id, max_image_side)} for p in record.image_paths]
    else:
        from medvqa_env.images import image_file

        if any(image_file(p) != str(p) for p in record.image_paths):
            raise ConfigError(f"record {record.id!r}: an image with a #fragment needs image_mode='bytes' "
                              f"(verl opens paths as plain files), got {list(record.image_paths)!r}")
        images = [{"image": str(p)} for p in record.image_paths]
    return {
        "data_source": f"medvqa/{record.dataset}",
        "prompt": [{"role": "system", "content": system_prompt}, {"role": "user", "content": user_text}],
        "images": images,
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": record.answer},
        "extra_info": {
            "index": int(index),
            "record_id": record.id,
            "dataset": record.dataset,
            "split": record.split,
            "answer_type": record.answer_type.value,
            "question": record.question,
            "options": options_to_rows(record.options),
            "modality": record.modality or "",
            "organ": record.organ or "",
            "answer_alternatives": [str(a) for a in record.metadata.get("answer_alternatives") or ()],
        },
        "agent_name": AGENT_NAME,
    }


def dataset_to_rows(dataset: VQADataset, system_prompt: str, image_mode: str = "bytes",
                    limit: int | None = None, answer_types: Sequence[str] | None = None,
                    max_image_side: int = 4096) -> list[dict[str, Any]]:
    """Rows for the dataset's records (only ``answer_types``, e.g. ``["OPEN"]``, when given), at most
    ``limit`` of them; ``index`` stays the record's position in the dataset."""
    from medvqa_env.records import AnswerType

    wanted = {AnswerType.parse(t) for t in answer_types} if answer_types else None
    picked = [i for i in range(len(dataset)) if wanted is None or dataset[i].answer_type in wanted]
    if limit is not None:
        picked = picked[: int(limit)]
    return [record_to_row(dataset[i], i, system_prompt, image_mode, max_image_side) for i in picked]


def env_system_prompt(env_kwargs: Mapping[str, Any] | None = None, dataset: VQADataset | None = None) -> str:
    """The system prompt ``MedVQAEnv`` builds for these env kwargs (tools + answer protocol)."""
    from medvqa_env.env import MedVQAEnv

    kwargs = dict(env_kwargs or {})
    if dataset is not None:
        kwargs["dataset"] = dataset
    env = MedVQAEnv(**kwargs)
    try:
        return env.system_prompt
    finally:
        env.close()


def write_parquet(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows as one parquet file (parent folders are created)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise ConfigError(f"expected at least one row to write to {path}, got none")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


def convert(env_kwargs: Mapping[str, Any], out_path: str | Path, split: str | None = None,
            image_mode: str = "bytes", limit: int | None = None, answer_types: Sequence[str] | None = None,
            loaded: list | None = None) -> Path:
    """Load the env's dataset (``env_kwargs["dataset"]``, ``split``, ``dataset_options``) and write
    it to ``out_path`` as verl parquet. Returns the path. ``loaded``: a list the loaded dataset is
    appended to (with ``{"split": split}``), for the run folder's ``skipped_records.jsonl``. A
    split whose every row the loader skipped is an error naming it."""
    from medvqa_env.provenance import check_not_all_skipped

    from medvqa_env.datasets import load_dataset

    kwargs = dict(env_kwargs)
    name = kwargs.get("dataset", "embedded")
    split = split or kwargs.get("split", "train")
    dataset = name if isinstance(name, VQADataset) else load_dataset(
        name, split=split, **dict(kwargs.get("dataset_options") or {}))
    kwargs.pop("split", None)
    kwargs.pop("dataset_options", None)
    if loaded is not None:
        loaded.append((dataset, {"split": split}))
    check_not_all_skipped(dataset)
    system_prompt = env_system_prompt(kwargs, dataset=dataset)
    rows = dataset_to_rows(dataset, system_prompt, image_mode, limit, answer_types,
                           max_image_side=int(kwargs.get("max_image_side", 4096)))
    return write_parquet(rows, out_path)
