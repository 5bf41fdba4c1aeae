"""PathVQA (He et al., 2020) from its published layout::

    <root>/split/qas/{train,val,test}/{split}_qa.pkl     (or {split}_vqa.pkl)
    <root>/split/images/{train,val,test}/<image>.jpg

(``root`` may also be the ``split`` folder itself.) Each pickle holds a list of dicts with
``image`` (file name without extension), ``question`` and ``answer``; the LXMERT-style
``{split}_vqa.pkl`` form (``img_id``, ``sent``, ``label`` = {answer: score}) is read too.
Yes/no answers are CLOSED, the rest OPEN.

**Pickle is unsafe**: unpickling can run arbitrary code. This loader therefore (1) reads only
from a local folder the user names (``root`` or ``$MEDVQA_PATHVQA``, never a download) and (2)
unpickles with an allow-list that admits plain containers and strings only; a pickle that asks
for any other class is refused with a :class:`DatasetError`. Pass ``trusted=True`` to use the
standard unpickler for a file you vouch for (e.g. one that stores numpy scalars).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from medvqa_env.datasets.common import RecordCollector, canonical_split, local_root
from medvqa_env.errors import DatasetError
from medvqa_env.records import AnswerType, VQADataset, VQARecord

SPLITS = ("train", "val", "test")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_SAFE_GLOBALS = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
                 ("__builtin__", "set"), ("__builtin__", "frozenset")}


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} (only plain lists, dicts and "
                                     f"strings are allowed; pass trusted=True for a file you vouch for)")


def safe_unpickle(data: bytes, where: str, trusted: bool = False) -> Any:
    """Unpickle ``data`` admitting only plain containers, unless ``trusted``.

    >>> safe_unpickle(pickle.dumps([{"image": "x", "question": "q?", "answer": "yes"}]), "f")
    [{'image': 'x', 'question': 'q?', 'answer': 'yes'}]
    """
    try:
        if trusted:
            return pickle.loads(data)  # noqa: S301 - the caller vouched for this file
        return _AllowListUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # any unpickling failure is a broken or refused manifest
        raise DatasetError(f"{where}: cannot unpickle: {type(e).__name__}: {e}") from None


def _fields(row: Any) -> tuple[str, str, str, str | None]:
    """(image, question, answer, answer_type) from either published form."""
    if not isinstance(row, dict):
        raise DatasetError(f"expected a dict, got {type(row).__name__}")
    image = row.get("image", row.get("img_id"))
    question = row.get("question", row.get("sent"))
    answer = row.get("answer")
    if answer is None and isinstance(row.get("label"), dict) and row["label"]:
        answer = max(row["label"].items(), key=lambda kv: kv[1])[0]
    missing = [k for k, v in (("image", image), ("question", question), ("answer", answer)) if v is None]
    if missing:
        raise DatasetError(f"missing field(s) {missing}; have {sorted(row)}")
    return str(image), str(question), str(answer), row.get("answer_type")


def _answer_type(answer: str, declared: Any) -> AnswerType:
    if isinstance(declared, str) and declared.strip():
        low = declared.strip().lower()
        if low in ("yes/no", "yesno", "closed", "close"):
            return AnswerType.CLOSED
        if low in ("other", "open", "number"):
            return AnswerType.OPEN
    return AnswerType.CLOSED if answer.strip().strip(".").lower() in ("yes", "no") else AnswerType.OPEN


def _image_path(folder: Path, name: str) -> Path:
    if Path(name).suffix.lower() in IMAGE_SUFFIXES:
        return folder / name
    for suffix in IMAGE_SUFFIXES:
        p = folder / f"{name}{suffix}"
        if p.is_file():
            return p
    return folder / f"{name}.jpg"  # reported as missing by the image check


def load_pathvqa(split: str = "test", root: str | Path | None = None, limit: int | None = None,
                 trusted: bool = False, on_invalid: str = "error", check_images: bool | str = "exists") -> VQADataset:
    """Load a PathVQA split (``train``, ``val``, ``test``) from the local folder ``root``.
    ``on_invalid`` (``"error"``/``"skip"``) and ``check_images`` (``"exists"``/``"decode"``/``"none"``):
    see :mod:`medvqa_env.datasets.common`."""
    base = local_root(root, "MEDVQA_PATHVQA", "PathVQA")
    if (base / "split").is_dir():
        base = base / "split"
    key = canonical_split(split, SPLITS, "PathVQA")
    candidates = [base / "qas" / key / f"{key}_qa.pkl", base / "qas" / key / f"{key}_vqa.pkl"]
    manifest = next((p for p in candidates if p.is_file()), None)
    if manifest is None:
        raise DatasetError(f"PathVQA {key} file not found; looked for {[str(c) for c in candidates]}")
    rows = safe_unpickle(manifest.read_bytes(), str(manifest), trusted)
    if trusted and hasattr(rows, "to_dict") and not isinstance(rows, dict):  # a pandas DataFrame
        rows = rows.to_dict("records")
    if not isinstance(rows, list):
        raise DatasetError(f"{manifest}: expected a pickled list of dicts, got {type(rows).__name__}")
    image_dir = base / "images" / key
    out = RecordCollector("pathvqa", on_invalid, check_images, sources=[manifest], limit=limit)
    for i, row in enumerate(rows):
        rid = f"pathvqa_{key}_{i}"
        try:
            image, question, answer, declared = _fields(row)
            record = VQARecord(
                id=rid,
                image_paths=(str(_image_path(image_dir, image)),),
                question=question.strip(),
                answer=answer.strip(),
                answer_type=_answer_type(answer, declared),
                dataset="pathvqa",
                split=key,
                modality="Pathology",
                metadata={"image": image, "source_index": i},
            )
        except DatasetError as e:
            out.reject(manifest, f"entry {i}", str(e), rid)
            continue
        out.add(record, manifest, f"entry {i}")
        if out.full:
            break
    return out.dataset()
