"""The embedded default dataset: synthetic phantoms with exact, balanced, templated questions.

``MedVQAEnv()`` runs on it, so the demo, the tests and the CPU training demo need no download.
Everything is generated from a seed by :mod:`medvqa_env.datasets.phantoms`; images (RGB PNG) and
masks (L PNG, 255 = inside) are written on first use into a cache folder and reused afterwards.

Cache folder: ``root``, else ``$MEDVQA_CACHE/embedded/<VERSION>``, else
``~/.cache/medvqa-gym/embedded/<VERSION>``; inside it one folder per ``<split>_seed<seed>``. Every
file is written to a temporary name and renamed into place, and a stamp file
(``complete.json``) is renamed in last, so processes racing on the same folder (Ray workers, async
vector envs) only ever see whole files; a later call that finds the stamp writes nothing.

Four questions per image (see ``docs/datasets.md``): a lesion count (MCQ 0/1/2/3), a presence
question about one organ (CLOSED, answers balanced yes/no over the split), then either the organ
holding the (largest) lesion (OPEN) and its image quadrant (MCQ), or, for a lesion-free image, the
modality (OPEN or MCQ) and a second presence question. MCQ answer letters are balanced.
"""

from __future__ import annotations

import collections
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from medvqa_env.datasets import phantoms as ph
from medvqa_env.datasets.common import RecordCollector
from medvqa_env.errors import DatasetError
from medvqa_env.records import Annotations, AnswerType, Box, VQADataset, VQARecord

VERSION = "v2"  # bump whenever the generator's output changes
QUESTIONS_PER_IMAGE = 4
SPLIT_SIZES = {"train": 800, "val": 100, "test": 200, "test_ood": 200}  # questions
SPLIT_CODES = {"train": 1, "val": 2, "test": 3, "test_ood": 4}
SPLIT_ALIASES = {"validation": "val", "valid": "val", "validate": "val", "dev": "val", "ood": "test_ood"}
DEFAULT_SEED = 0
LETTERS = "ABCD"
MANIFEST = "manifest.json"
MODALITY_CHOICES = ("CT", "MRI", "X-Ray", "Ultrasound")

# question templates: the whole vocabulary a policy has to learn
Q_COUNT = "How many lesions are visible in this image?"
Q_PRESENCE = "Is there a lesion in the {host}?"
Q_ORGAN_ONE = "Which organ contains the lesion?"
Q_ORGAN_MANY = "Which organ contains the largest lesion?"
Q_QUADRANT_ONE = "In which quadrant of the image is the lesion?"
Q_QUADRANT_MANY = "In which quadrant of the image is the largest lesion?"
Q_MODALITY_OPEN = "What is the imaging modality?"
Q_MODALITY_MCQ = "Which imaging modality was used to acquire this image?"

# ``test_ood``: test-like scenes asked in wordings no other split uses (a phrasing shift: a policy
# that learned to read its tool, not one sentence, should not notice). The k-th question of a kind
# takes wording ``k mod len``. Every wording keeps the word the gold tool call keys on ("lesion",
# "modality"), so a forced gold call still applies.
OOD_WORDINGS = {
    "count": ("What is the number of lesions in this scan?", "Count the lesions shown in the image."),
    "presence": ("Does the {host} contain a lesion?", "Is a lesion present in the {host}?",
                 "Can a lesion be seen in the {host}?"),
    "organ_one": ("In which organ is the lesion located?", "Name the organ that holds the lesion."),
    "organ_many": ("In which organ is the biggest lesion located?", "Name the organ that holds the biggest lesion."),
    "quadrant_one": ("Where in the image is the lesion: which quadrant?",),
    "quadrant_many": ("Where in the image is the biggest lesion: which quadrant?",),
    "modality_open": ("Which modality produced this image?",),
    "modality_mcq": ("Which modality was this scan acquired with?",),
}


def default_cache_root() -> Path:
    base = os.environ.get("MEDVQA_CACHE")
    base_path = Path(base) if base else Path.home() / ".cache" / "medvqa-gym"
    return base_path / "embedded" / VERSION


def _canonical_split(split: str) -> str:
    s = SPLIT_ALIASES.get(str(split).lower(), str(split).lower())
    if s not in SPLIT_SIZES:
        raise DatasetError(f"expected an embedded split in {sorted(SPLIT_SIZES)}, got {split!r}")
    return s


# -- scene plan: which phantom, how many lesions --------------------------------------------------
def scene_plan(index: int) -> tuple[str, int]:
    """Kind and lesion count of image ``index``: every 12 consecutive images hold each
    (kind, count) pair once, so any prefix of a split is balanced.

    >>> [scene_plan(i) for i in (0, 1, 3, 11)]
    [('ct_abdomen', 0), ('mri_brain', 0), ('ct_abdomen', 1), ('xray_chest', 3)]
    """
    return ph.KINDS[index % len(ph.KINDS)], (index // len(ph.KINDS)) % (ph.MAX_LESIONS + 1)


def _image_rng(seed: int, split: str, index: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), SPLIT_CODES[split], int(index)])


# -- questions -----------------------------------------------------------------------------------
class _Balancer:
    """Keeps yes/no answers and each template's MCQ letters balanced over a split, in a
    prefix-stable way (the choice depends only on what came before)."""

    def __init__(self) -> None:
        self.yes = self.no = 0
        self.letters: dict[str, list[int]] = {}

    def want_yes(self) -> bool:
        return self.yes <= self.no

    def count_answer(self, yes: bool) -> None:
        if yes:
            self.yes += 1
        else:
            self.no += 1

    def pick_letter(self, rng: np.random.Generator, template: str) -> str:
        counts = self.letters.setdefault(template, [0] * len(LETTERS))
        low = min(counts)
        choices = [i for i, c in enumerate(counts) if c == low]
        i = choices[int(rng.integers(len(choices)))]
        counts[i] += 1
        return LETTERS[i]


def _mcq(rng, balancer: _Balancer, template: str, correct: str, distractors: list[str]) -> tuple[dict[str, str], str]:
    """Options dict with ``correct`` at the template's least used letter so far, distractors shuffled."""
    letter = balancer.pick_letter(rng, template)
    others = [distractors[i] for i in rng.permutation(len(distractors))]
    options, k = {}, 0
    for L in LETTERS[: len(distractors) + 1]:
        if L == letter:
            options[L] = correct
        else:
            options[L] = others[k]
            k += 1
    return options, letter


def _presence(rng, scene: ph.Scene, balancer: _Balancer, exclude: set[str]) -> tuple[str, bool]:
    hosts = [h for h in ph.HOSTS[scene.kind] if h not in exclude] or list(ph.HOSTS[scene.kind])
    with_lesion = [h for h in hosts if any(l.host == h for l in scene.lesions)]
    without = [h for h in hosts if h not in with_lesion]
    pool = with_lesion if (balancer.want_yes() and with_lesion) or not without else without
    host = pool[int(rng.integers(len(pool)))]
    yes = host in with_lesion
    balancer.count_answer(yes)
    return host, yes


class _Wording:
    """The question text of each kind: the usual template, or (``test_ood``) the held-out wordings
    in turn, prefix-stable (the k-th question of a kind always gets the same one)."""

    def __init__(self, wordings: dict[str, tuple[str, ...]] | None) -> None:
        self.wordings = wordings
        self.used: collections.Counter[str] = collections.Counter()

    def __call__(self, kind: str, usual: str) -> str:
        if self.wordings is None:
            return usual
        options = self.wordings[kind]
        text = options[self.used[kind] % len(options)]
        self.used[kind] += 1
        return text


def _questions(rng, scene: ph.Scene, balancer: _Balancer, wording: _Wording | None = None) -> Iterator[dict[str, Any]]:
    """The four questions of one image, as record fields (``wording``: ``test_ood``'s)."""
    say = wording or _Wording(None)
    n = len(scene.lesions)
    count_opts = {L: str(i) for i, L in enumerate(LETTERS)}
    yield dict(question=say("count", Q_COUNT), answer=LETTERS[n], answer_type=AnswerType.MCQ, options=count_opts,
               question_type="COUNT", template="count")
    host, yes = _presence(rng, scene, balancer, set())
    yield dict(question=say("presence", Q_PRESENCE).format(host=host), answer="yes" if yes else "no",
               answer_type=AnswerType.CLOSED, question_type="PRES", template="presence")
    if n:
        big = scene.largest
        yield dict(question=say("organ_one", Q_ORGAN_ONE) if n == 1 else say("organ_many", Q_ORGAN_MANY), answer=big.host,
                   answer_type=AnswerType.OPEN, question_type="ORGAN", template="organ")
        options, letter = _mcq(rng, balancer, "quadrant", big.quadrant, [q for q in ph.QUADRANTS if q != big.quadrant])
        yield dict(question=say("quadrant_one", Q_QUADRANT_ONE) if n == 1 else say("quadrant_many", Q_QUADRANT_MANY), answer=letter,
                   answer_type=AnswerType.MCQ, options=options, question_type="POS", template="quadrant")
    else:
        if rng.random() < 0.5:
            yield dict(question=say("modality_open", Q_MODALITY_OPEN), answer=scene.modality, answer_type=AnswerType.OPEN,
                       question_type="MODALITY", template="modality_open")
        else:
            options, letter = _mcq(rng, balancer, "modality_mcq", scene.modality,
                                   [m for m in MODALITY_CHOICES if m != scene.modality])
            yield dict(question=say("modality_mcq", Q_MODALITY_MCQ), answer=letter, answer_type=AnswerType.MCQ, options=options,
                       question_type="MODALITY", template="modality_mcq")
        host2, yes2 = _presence(rng, scene, balancer, {host})
        yield dict(question=say("presence", Q_PRESENCE).format(host=host2), answer="yes" if yes2 else "no",
                   answer_type=AnswerType.CLOSED, question_type="PRES", template="presence")


# -- files ---------------------------------------------------------------------------------------
def _slug(label: str) -> str:
    return label.replace(" ", "_")


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _png(array: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _scene_files(image_id: str, scene: ph.Scene) -> tuple[str, dict[str, Any], list[tuple[str, np.ndarray]]]:
    """Relative paths, annotations (as a manifest dict: mask paths stay relative to the cache
    folder, which :func:`_resolve` prepends) and arrays of one scene's image and masks (nothing
    written)."""
    image_path = f"images/{image_id}.png"
    files = [(image_path, scene.image)]  # grey PNG; loaders convert to RGB
    boxes, masks = [], []
    for label, mask in scene.organs.items():
        boxes.append(Box(label, tuple(float(v) for v in ph.mask_bbox(mask))))
        if label in ph.HOSTS[scene.kind]:  # masks for the organs questions ask about
            p = f"masks/{image_id}_{_slug(label)}.png"
            files.append((p, mask.astype(np.uint8) * 255))
            masks.append({"label": label, "path": p, "image_index": 0})
    for k, lesion in enumerate(scene.lesions):
        p = f"masks/{image_id}_lesion{k}.png"
        files.append((p, lesion.mask.astype(np.uint8) * 255))
        boxes.append(Box(lesion.label, tuple(float(v) for v in ph.mask_bbox(lesion.mask))))
        masks.append({"label": lesion.label, "path": p, "image_index": 0})
    labels = (scene.modality, "lesion" if scene.lesions else "no lesion")
    ann = {**Annotations(boxes=tuple(boxes), labels=labels).to_dict(), "masks": masks}
    return image_path, ann, files


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == VERSION else None


def _generate(folder: Path, split: str, seed: int, n_images: int) -> list[dict[str, Any]]:
    """Draw ``n_images`` scenes, write their files, return every question as a record dict
    (paths relative to ``folder``)."""
    try:
        (folder / "images").mkdir(parents=True, exist_ok=True)
        (folder / "masks").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"embedded: cannot create the cache folder {str(folder)!r}: {e}") from None
    balancer = _Balancer()
    wording = _Wording(OOD_WORDINGS if split == "test_ood" else None)
    rows: list[dict[str, Any]] = []
    for i in range(n_images):
        rng = _image_rng(seed, split, i)
        kind, count = scene_plan(i)
        scene = ph.draw_scene(rng, kind, count)
        image_id = f"{split}_{i:04d}"
        image_rel, ann, files = _scene_files(image_id, scene)
        for rel, array in files:
            if not (folder / rel).is_file():  # written whole by an earlier or racing call
                try:
                    _atomic_write(folder / rel, _png(array))
                except OSError as e:
                    raise DatasetError(f"embedded: image {image_id!r}: cannot write {str(folder / rel)!r}: {e}") from None
        lesions = [{"host": l.host, "bbox": list(ph.mask_bbox(l.mask)), "radius": l.radius,
                    "contrast": round(l.contrast, 1), "quadrant": l.quadrant, "subtle": l.subtle}
                   for l in scene.lesions]
        for q in _questions(rng, scene, balancer, wording):
            rows.append({
                "id": f"embedded_{split}_{len(rows):04d}", "image_paths": [image_rel],
                "question": q["question"], "answer": q["answer"], "answer_type": q["answer_type"].value,
                "dataset": "embedded", "split": split, "options": q.get("options", {}),
                "modality": scene.modality, "organ": ph.ORGAN[kind], "question_type": q["question_type"],
                "annotations": ann,
                "metadata": {"image_id": image_id, "phantom": kind, "template": q["template"],
                             "n_lesions": count, "lesions": lesions, "seed": seed},
            })
    return rows


def _resolve(row: dict[str, Any], folder: Path) -> VQARecord:
    """A manifest row (relative paths) as a record with absolute paths."""
    row = dict(row)
    row["image_paths"] = [str(folder / p) for p in row["image_paths"]]
    ann = dict(row["annotations"])
    ann["masks"] = [{**m, "path": str(folder / m["path"])} for m in ann["masks"]]
    row["annotations"] = ann
    return VQARecord.from_dict(row)


# -- loader --------------------------------------------------------------------------------------
def load_embedded(split: str = "test", root: str | Path | None = None, n: int | None = None,
                  seed: int = DEFAULT_SEED, limit: int | None = None, on_invalid: str = "error",
                  check_images: bool | str = "exists") -> VQADataset:
    """The embedded synthetic dataset.

    Args:
        split: ``"train"`` (800 questions), ``"val"`` (100), ``"test"`` (200) or ``"test_ood"``
            (200, alias ``"ood"``: test-like scenes asked in wordings no other split uses, see
            :data:`OOD_WORDINGS`); images of different splits are drawn from different random
            streams and never shared.
        root: cache folder (default: see :func:`default_cache_root`).
        n: number of questions (default: the split's size). Any ``n`` gives a prefix of the
            same sequence, so ``n=40`` is the first 40 questions of ``n=800``.
        seed: generator seed; the same seed gives byte-identical images and the same questions.
        limit: alias of ``n`` (the keyword other loaders take).
        on_invalid, check_images: as for every loader (:mod:`medvqa_env.datasets.common`); the
            generated records are valid by construction, so ``"skip"`` never skips one, and
            ``check_images="decode"`` decodes every cached image.

    Raises :class:`DatasetError` for an unknown split or a bad ``n``/``seed``. Cached files that
    have gone missing are drawn again; if they cannot be written, the error names record and file.
    """
    split = _canonical_split(split)
    n = n if n is not None else limit
    n = SPLIT_SIZES[split] if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DatasetError(f"expected n to be a positive int, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DatasetError(f"expected seed to be an int >= 0, got {seed!r}")
    n_images = math.ceil(n / QUESTIONS_PER_IMAGE)
    folder = (Path(root) if root else default_cache_root()) / f"{split}_seed{seed}"
    manifest = _read_manifest(folder)
    if manifest is None or int(manifest.get("n_images", 0)) < n_images:
        rows = _generate(folder, split, seed, n_images)
        current = _read_manifest(folder)  # another process may have written a bigger one meanwhile
        if current is None or int(current.get("n_images", 0)) < n_images:
            _atomic_write(folder / MANIFEST, json.dumps(
                {"version": VERSION, "seed": seed, "split": split, "n_images": n_images, "records": rows},
                separators=(",", ":")).encode("utf-8"))
    else:
        rows = manifest["records"]
    records = [_resolve(row, folder) for row in rows[:n]]
    try:
        _check_files(records)
    except DatasetError:  # someone deleted cached files: redraw the missing ones, once
        _generate(folder, split, seed, n_images)
        _check_files(records)
    out = RecordCollector("embedded", on_invalid, "none" if check_images in (True, "exists") else check_images,
                          sources=[folder / MANIFEST])  # existence: checked above
    for i, record in enumerate(records):
        out.add(record, folder / MANIFEST, f"record {i}")
    dataset = out.dataset()
    if check_images in (True, "exists"):
        dataset.provenance.check_images = "exists"
        dataset.provenance.n_images_checked = len({p for r in records for p in r.image_paths})
    return dataset


def _check_files(records: list[VQARecord]) -> None:
    """Every cached file a record names exists (else a :class:`DatasetError` naming both)."""
    seen: set[str] = set()
    for r in records:
        for p in (*r.image_paths, *(m.path for m in r.annotations.masks)):
            if p in seen:
                continue
            seen.add(p)
            if not os.path.isfile(p):
                raise DatasetError(
                    f"embedded: record {r.id!r}: file {p!r} is missing from the cache and could not be "
                    f"written again; check that {str(Path(p).parent.parent)!r} is writable")
