"""VQA-Med (ImageCLEF 2019 and 2021) from the organisers' published files (github.com/abachaa).

Files are found by their published names anywhere under ``root`` (so the unzipped folders may sit
side by side or nested); images are ``<image id>.jpg`` in the named image folder. Lines are
pipe-separated.

**2019** (``edition=2019``; 4 question categories: modality, plane, organ, abnormality)::

    ImageClef-2019-VQA-Med-Training/All_QA_Pairs_train.txt          image|question|answer
    ImageClef-2019-VQA-Med-Training/QAPairsByCategory/C1_Modality_train.txt ... C4_Abnormality_train.txt
    ImageClef-2019-VQA-Med-Training/Train_images/<image>.jpg
    ImageClef-2019-VQA-Med-Validation/All_QA_Pairs_val.txt, QAPairsByCategory/C*_val.txt, Val_images/
    VQAMed2019Test/VQAMed2019_Test_Questions_w_Ref_Answers.txt       image|category|question|answer
    VQAMed2019Test/VQAMed2019_Test_Images/<image>.jpg

``question_type`` is the category (from ``QAPairsByCategory`` for train/val, from the file for
test). In the test answers ``#`` separates acceptable answers and ``(...)`` marks an optional part (only
there: elsewhere brackets are part of the answer, e.g. ``ct w/contrast (iv)``).

**2021** (``edition=2021``; abnormality questions; its training set is VQA-Med 2020's train + val)::

    VQAnswering_2020_Train_QA_pairs.txt + VQAnswering_2020_Train_images/      (train)
    VQAnswering_2020_Val_QA_Pairs.txt + VQAnswering_2020_Val_images/          (train, when present)
    VQA-Med-2021-VQAnswering-Task1-New-ValidationSet.txt
        + ImageCLEF-2021-VQA-Med-New-Validation-Images/                        (val)
    Task1-VQA-2021-TestSet-Questions.txt                   image|question      (test)
    Task1-VQA-2021-TestSet-ReferenceAnswers.txt            image|answer|answer|...
    VQA-500-Images/<image>.jpg

Several acceptable answers: the record's ``answer`` is the first, as written, and
``metadata["answer_alternatives"]`` lists every accepted form (for 2019 also without the brackets and
without the optional part); rewards score against
``answer`` only, so accuracy here is a lower bound of the official (any-of) accuracy. Yes/no answers
are CLOSED, the rest OPEN. Ids are ``vqamed<edition>_<split>_<image>_<k>`` (``k``-th question on
that image). ``root`` defaults to ``$MEDVQA_VQAMED``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from medvqa_env.datasets.common import RecordCollector, canonical_split, local_root
from medvqa_env.errors import DatasetError
from medvqa_env.records import AnswerType, VQADataset, VQARecord

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
CATEGORY_FILES = {"C1_Modality": "modality", "C2_Plane": "plane", "C3_Organ": "organ", "C4_Abnormality": "abnormality"}


@dataclass(frozen=True)
class Part:
    """One published QA file and its image folder. ``fields`` names the columns of a line;
    ``answers``: a separate reference-answer file (``image|answer|answer...``)."""

    qa: str
    images: str
    fields: tuple[str, ...] = ("image", "question", "answer")
    answers: str | None = None
    categories: str | None = None  # suffix of the QAPairsByCategory files (train / val)
    optional: bool = False
    markers: bool = False  # answers use '#' (alternatives) and '(...)' (optional part)


LAYOUTS: dict[int, dict[str, tuple[Part, ...]]] = {
    2019: {
        "train": (Part("All_QA_Pairs_train.txt", "Train_images", categories="train"),),
        "val": (Part("All_QA_Pairs_val.txt", "Val_images", categories="val"),),
        "test": (Part("VQAMed2019_Test_Questions_w_Ref_Answers.txt", "VQAMed2019_Test_Images",
                      fields=("image", "category", "question", "answer"), markers=True),),
    },
    2021: {
        "train": (Part("VQAnswering_2020_Train_QA_pairs.txt", "VQAnswering_2020_Train_images"),
                  Part("VQAnswering_2020_Val_QA_Pairs.txt", "VQAnswering_2020_Val_images", optional=True)),
        "val": (Part("VQA-Med-2021-VQAnswering-Task1-New-ValidationSet.txt",
                     "ImageCLEF-2021-VQA-Med-New-Validation-Images"),),
        "test": (Part("Task1-VQA-2021-TestSet-Questions.txt", "VQA-500-Images", fields=("image", "question"),
                      answers="Task1-VQA-2021-TestSet-ReferenceAnswers.txt"),),
    },
}


def answer_variants(reference: str, markers: bool = True) -> list[str]:
    """Every accepted form of a reference answer. With ``markers`` (the 2019 test file): ``#``
    separates alternatives and ``(...)`` is an optional part; each alternative comes as written,
    then without the brackets, then without the optional part. Without: the answer as written.

    >>> answer_variants("(angioinvasive aspergillosis with) septic cerebral emboli#mass")
    ['(angioinvasive aspergillosis with) septic cerebral emboli', 'angioinvasive aspergillosis with septic cerebral emboli', 'septic cerebral emboli', 'mass']
    >>> answer_variants("ct w/contrast (iv)", markers=False)
    ['ct w/contrast (iv)']
    """
    if not markers:
        return [reference] if reference else []
    out = []
    for alt in reference.split("#"):
        full = " ".join(re.sub(r"[()]", " ", alt).split())
        short = " ".join(re.sub(r"\([^)]*\)", " ", alt).split())
        out += [alt.strip(), full, short]
    return [v for v in dict.fromkeys(out) if v]


def _field(value: str) -> str:
    """A cell without surrounding CSV quotes (doubled quotes inside become one) and with single
    spaces.

    >>> _field('"a ""drowned"" lobe"'), _field("is \tthis  it?")
    ('a "drowned" lobe', 'is this it?')
    """
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1].replace('""', '"')
    return " ".join(value.split())


def _lines(path: Path) -> list[tuple[int, list[str]]]:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("cp1252", errors="replace")
    return [(n, [_field(c) for c in line.split("|")]) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _find(root: Path, name: str, want_dir: bool, near: Path | None = None) -> Path | None:
    """``name`` under ``root``: first next to ``near`` (and its parents up to ``root``), else anywhere."""
    test = Path.is_dir if want_dir else Path.is_file
    folder = near
    while folder is not None and (folder == root or root in folder.parents):
        for cand in (folder / name, folder / "images" / name):
            if test(cand):
                return cand
        folder = folder.parent if folder != root else None
    hits = sorted((p for p in root.rglob(name) if test(p)), key=lambda p: (len(p.parts), str(p)))
    return hits[0] if hits else None


def _categories(qa_file: Path, suffix: str) -> dict[tuple[str, str], str]:
    """(image, question) -> category, from ``QAPairsByCategory/C*_<suffix>.txt`` when present."""
    out: dict[tuple[str, str], str] = {}
    folder = qa_file.parent / "QAPairsByCategory"
    for stem, category in CATEGORY_FILES.items():
        path = folder / f"{stem}_{suffix}.txt"
        if path.is_file():
            for _, cells in _lines(path):
                if len(cells) >= 2:
                    out[(cells[0], cells[1])] = category
    return out


def _image(folder: Path, image_id: str) -> Path:
    for suffix in IMAGE_SUFFIXES:
        if (folder / f"{image_id}{suffix}").is_file():
            return folder / f"{image_id}{suffix}"
    return folder / f"{image_id}.jpg"  # reported as missing by the loader


def _rows(root: Path, part: Part, edition: int, split: str, out: RecordCollector) -> list[dict] | None:
    qa = _find(root, part.qa, want_dir=False)
    if qa is None:
        if part.optional:
            return None
        raise DatasetError(f"VQA-Med {edition} {split}: {part.qa!r} not found under {str(root)!r}")
    images = _find(root, part.images, want_dir=True, near=qa.parent)
    if images is None:
        raise DatasetError(f"VQA-Med {edition} {split}: image folder {part.images!r} not found under {str(root)!r}")
    out.sources.append(str(qa))
    answers: dict[str, list[str]] = {}
    if part.answers:
        ref = _find(root, part.answers, want_dir=False, near=qa.parent)
        if ref is None:
            raise DatasetError(f"VQA-Med {edition} {split}: reference answers {part.answers!r} not found under "
                               f"{str(root)!r}")
        out.sources.append(str(ref))
        answers = {cells[0]: [a for a in cells[1:] if a] for _, cells in _lines(ref)}
    categories = _categories(qa, part.categories) if part.categories else {}
    rows = []
    for line, cells in _lines(qa):
        if len(cells) != len(part.fields):
            out.reject(qa, f"line {line}", f"expected {len(part.fields)} fields {'|'.join(part.fields)}, "
                                           f"got {len(cells)}")
            continue
        row = dict(zip(part.fields, cells))
        if part.answers:
            if not answers.get(row["image"]):
                out.reject(qa, f"line {line}", f"image {row['image']!r} has no reference answer in {part.answers}")
                continue
            variants = list(dict.fromkeys(answers[row["image"]]))
        else:
            variants = answer_variants(row["answer"], part.markers)
        row.update(source=qa, line=line, variants=variants, image_path=_image(images, row["image"]),
                   category=row.get("category") or categories.get((row["image"], row["question"])))
        rows.append(row)
    return rows


def load_vqamed(split: str = "test", root: str | Path | None = None, edition: int = 2019,
                limit: int | None = None, on_invalid: str = "error", check_images: bool | str = "exists") -> VQADataset:
    """Load a VQA-Med split (``train``, ``val``, ``test``) of ``edition`` 2019 or 2021.
    ``on_invalid`` (``"error"``/``"skip"``) and ``check_images`` (``"exists"``/``"decode"``/``"none"``):
    see :mod:`medvqa_env.datasets.common`."""
    if edition not in LAYOUTS:
        raise DatasetError(f"VQA-Med editions are {sorted(LAYOUTS)}, got {edition!r}")
    base = local_root(root, "MEDVQA_VQAMED", "VQA-Med")
    key = canonical_split(split, tuple(LAYOUTS[edition]), "VQA-Med")
    out = RecordCollector(f"vqamed{edition}", on_invalid, check_images, limit=limit)
    seen: dict[str, int] = {}
    for part in LAYOUTS[edition][key]:
        for row in _rows(base, part, edition, key, out) or ():
            k = seen[row["image"]] = seen.get(row["image"], -1) + 1
            rid = f"vqamed{edition}_{key}_{row['image']}_{k}"
            answer = row["variants"][0] if row["variants"] else ""
            try:
                record = VQARecord(
                    id=rid,
                    image_paths=(str(row["image_path"]),),
                    question=row["question"],
                    answer=answer,
                    answer_type=AnswerType.CLOSED if answer.lower() in ("yes", "no") else AnswerType.OPEN,
                    dataset=f"vqamed{edition}",
                    split=key,
                    question_type=row["category"],
                    metadata={"image_id": row["image"], "answer_alternatives": row["variants"],
                              "source_file": part.qa},
                )
            except DatasetError as e:
                out.reject(row["source"], f"line {row['line']}", str(e), rid)
                continue
            out.add(record, row["source"], f"line {row['line']}")
            if out.full:
                break
        if out.full:
            break
    return out.dataset()
