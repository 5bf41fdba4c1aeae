"""The embedded default dataset: content, balance, determinism, cache reuse, and the env on it."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from medvqa_env.datasets import load_dataset
from medvqa_env.datasets.embedded import SPLIT_SIZES, VERSION, load_embedded
from medvqa_env.datasets.phantoms import HOSTS, QUADRANTS
from medvqa_env.errors import DatasetError
from medvqa_env.records import AnswerType

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def test_split(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedded")
    return root, load_embedded("test", root=root)


def _lesions(record):
    return [b for b in record.annotations.boxes if b.label.endswith(" lesion")]


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- content ---------------------------------------------------------------------------------------
def test_split_sizes_ids_and_fields(test_split):
    _, ds = test_split
    assert ds.name == "embedded" and len(ds) == SPLIT_SIZES["test"] == 200
    assert ds[7].id == "embedded_test_0007"
    for r in ds:
        assert r.dataset == "embedded" and r.split == "test"
        assert r.modality in ("CT", "MRI", "X-Ray") and r.organ in ("ABD", "HEAD", "CHEST")
        assert r.question_type in ("COUNT", "PRES", "ORGAN", "POS", "MODALITY")
        assert {"ABD": "CT", "HEAD": "MRI", "CHEST": "X-Ray"}[r.organ] == r.modality
        assert r.annotations.labels[0] == r.modality
        assert r.annotations.labels[1] == ("lesion" if _lesions(r) else "no lesion")
        with Image.open(r.image_paths[0]) as im:
            assert im.size == (256, 256)


def test_answers_follow_from_annotations(test_split):
    """Every answer can be derived from the boxes: what the oracle tools will report."""
    _, ds = test_split
    for r in ds:
        lesions = _lesions(r)
        tmpl = r.metadata["template"]
        if tmpl == "count":
            assert r.options == {"A": "0", "B": "1", "C": "2", "D": "3"}
            assert r.options[r.answer] == str(len(lesions))
        elif tmpl == "presence":
            host = r.question.removeprefix("Is there a lesion in the ").removesuffix("?")
            assert host in HOSTS[r.metadata["phantom"]]
            assert r.answer == ("yes" if any(b.label == f"{host} lesion" for b in lesions) else "no")
        elif tmpl in ("organ", "quadrant"):
            big = max(lesions, key=lambda b: b.bbox[2] - b.bbox[0])
            widths = sorted((b.bbox[2] - b.bbox[0] for b in lesions), reverse=True)
            assert len(widths) == 1 or widths[0] > widths[1]  # "the largest" is unambiguous
            if tmpl == "organ":
                assert r.answer_type is AnswerType.OPEN and big.label == f"{r.answer} lesion"
            else:
                cx, cy = (big.bbox[0] + big.bbox[2]) / 2, (big.bbox[1] + big.bbox[3]) / 2
                want = f"{'upper' if cy < 128 else 'lower'} {'left' if cx < 128 else 'right'}"
                assert r.options[r.answer] == want and sorted(r.options.values()) == sorted(QUADRANTS)
        elif tmpl == "modality_open":
            assert r.answer == r.modality and not lesions
        elif tmpl == "modality_mcq":
            assert r.options[r.answer] == r.modality and not lesions
        else:
            pytest.fail(f"unexpected template {tmpl!r}")


def test_lesion_boxes_and_masks_agree_and_lie_in_their_organ(test_split):
    _, ds = test_split
    seen = set()
    for r in ds:
        if r.image_paths[0] in seen:
            continue
        seen.add(r.image_paths[0])
        boxes = {b.label: b.bbox for b in r.annotations.boxes}
        masks = {}
        for m in r.annotations.masks:
            arr = np.array(Image.open(m.path)) > 0
            ys, xs = np.nonzero(arr)
            masks.setdefault(m.label, []).append((xs.min(), ys.min(), xs.max() + 1, ys.max() + 1))
        for host in HOSTS[r.metadata["phantom"]]:
            assert masks[host] == [boxes[host]]
        for b in _lesions(r):
            assert tuple(float(v) for v in b.bbox) in [tuple(float(v) for v in m) for m in masks[b.label]]
            host = boxes[b.label.removesuffix(" lesion")]
            assert host[0] <= b.bbox[0] and host[1] <= b.bbox[1] and b.bbox[2] <= host[2] and b.bbox[3] <= host[3]


def test_answers_are_balanced_so_priors_do_not_win(test_split):
    _, ds = test_split
    kinds = collections.Counter(r.answer_type for r in ds)
    assert all(kinds[t] >= 30 for t in AnswerType)
    yes_no = collections.Counter(r.answer for r in ds if r.answer_type is AnswerType.CLOSED)
    assert abs(yes_no["yes"] - yes_no["no"]) <= 2
    for tmpl in ("count", "quadrant"):
        letters = collections.Counter(r.answer for r in ds if r.metadata["template"] == tmpl)
        assert set(letters) == set("ABCD") and max(letters.values()) - min(letters.values()) <= 2
    modalities = collections.Counter(r.modality for r in ds)
    assert max(modalities.values()) - min(modalities.values()) <= 4


def test_some_lesions_are_small_and_faint(test_split):
    """The zoom tool must matter: a share of lesions are a few pixels wide and low contrast."""
    _, ds = test_split
    lesions = {(r.metadata["image_id"], i): l for r in ds for i, l in enumerate(r.metadata["lesions"])}
    subtle = [l for l in lesions.values() if l["subtle"]]
    assert 0.05 * len(lesions) <= len(subtle) <= 0.5 * len(lesions)
    assert all(l["radius"] <= 5 and l["contrast"] < 30 for l in subtle)


def test_splits_use_disjoint_images(tmp_path):
    hashes = {}
    for split in ("train", "val", "test"):
        ds = load_embedded(split, root=tmp_path, n=48)
        hashes[split] = {hashlib.sha256(np.array(Image.open(p)).tobytes()).hexdigest()
                         for p in {r.image_paths[0] for r in ds}}
        assert len(hashes[split]) == 12
    assert not (hashes["train"] & hashes["val"] or hashes["train"] & hashes["test"] or hashes["val"] & hashes["test"])
    assert len(load_embedded("validation", root=tmp_path)) == 100  # alias


# -- determinism and cache ---------------------------------------------------------------------------
def test_same_seed_gives_identical_bytes_and_questions(tmp_path, test_split):
    root, ds = test_split
    other = load_embedded("test", root=tmp_path / "again", n=40)
    assert [r.to_dict()["question"] for r in other] == [r.question for r in ds[:40]]
    assert [r.answer for r in other] == [r.answer for r in ds[:40]]
    for a, b in zip(other, ds[:40]):
        assert _sha(a.image_paths[0]) == _sha(b.image_paths[0])
        assert [_sha(m.path) for m in a.annotations.masks] == [_sha(m.path) for m in b.annotations.masks]
    reseeded = load_embedded("test", root=tmp_path / "again", n=40, seed=1)
    assert _sha(reseeded[0].image_paths[0]) != _sha(ds[0].image_paths[0])


def test_prefix_is_stable(test_split, tmp_path):
    _, ds = test_split
    small = load_embedded("test", root=tmp_path, n=9)
    assert len(small) == 9 and [r.to_dict() for r in small] != []
    assert [r.question for r in small] == [r.question for r in ds[:9]]
    bigger = load_embedded("test", root=tmp_path, n=260)  # past the default size: more images
    assert len(bigger) == 260 and [r.answer for r in bigger[:200]] == [r.answer for r in ds]


def test_second_call_and_second_process_reuse_the_cache(tmp_path):
    load_embedded("val", root=tmp_path)
    before = _files(tmp_path)
    assert (tmp_path / "val_seed0" / "manifest.json").is_file()
    again = load_embedded("val", root=tmp_path)
    assert _files(tmp_path) == before
    code = (f"from medvqa_env.datasets.embedded import load_embedded; "
            f"print(len(load_embedded('val', root={str(tmp_path)!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "100"
    assert _files(tmp_path) == before  # nothing rewritten
    assert again[0].image_paths[0].startswith(str(tmp_path))


def test_processes_racing_on_one_folder_agree(tmp_path):
    code = (f"import json; from medvqa_env.datasets.embedded import load_embedded; "
            f"ds = load_embedded('val', root={str(tmp_path)!r}); "
            f"print(json.dumps([r.answer for r in ds]))")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    answers = [json.loads(o) for o, _ in outs]
    assert answers[0] == answers[1] == answers[2]
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no temp file left behind
    assert [r.answer for r in load_embedded("val", root=tmp_path)] == answers[0]


def test_default_cache_folder_follows_medvqa_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDVQA_CACHE", str(tmp_path))
    ds = load_embedded("val", n=4)
    assert ds[0].image_paths[0].startswith(str(tmp_path / "embedded" / VERSION / "val_seed0"))


def test_deleted_cached_files_are_drawn_again(tmp_path):
    ds = load_embedded("val", root=tmp_path)
    image, mask = ds[3].image_paths[0], ds[3].annotations.masks[0].path
    want = _sha(image), _sha(mask)
    os.remove(image)
    os.remove(mask)
    again = load_embedded("val", root=tmp_path)
    assert (_sha(again[3].image_paths[0]), _sha(again[3].annotations.masks[0].path)) == want


def test_an_unwritable_cache_is_a_clear_error(tmp_path, monkeypatch):
    import medvqa_env.datasets.embedded as embedded

    ds = load_embedded("val", root=tmp_path, n=4)
    os.remove(ds[0].image_paths[0])

    def refuse(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(embedded, "_atomic_write", refuse)
    with pytest.raises(DatasetError, match=r"cannot write .*val_0000\.png.*Permission denied"):
        load_embedded("val", root=tmp_path, n=4)
    with pytest.raises(DatasetError, match=r"cannot write .*val_0000\.png"):
        load_embedded("val", root=tmp_path / "fresh", n=4)


@pytest.mark.parametrize("kwargs, match", [
    ({"split": "dev2"}, "expected an embedded split"),
    ({"n": 0}, "expected n to be a positive int"),
    ({"n": "10"}, "expected n to be a positive int"),
    ({"seed": -1}, "expected seed"),
])
def test_bad_arguments_raise(tmp_path, kwargs, match):
    with pytest.raises(DatasetError, match=match):
        load_embedded(root=tmp_path, **kwargs)


# -- the env on its default dataset ----------------------------------------------------------------
def test_registry_loads_it(test_split):
    root, ds = test_split
    assert [r.id for r in load_dataset("embedded", split="test", root=root)] == [r.id for r in ds]


def test_env_episode_zoom_on_the_lesion_then_answer(test_split):
    from medvqa_env.env import MedVQAEnv

    root, ds = test_split
    env = MedVQAEnv(dataset_options={"root": root})
    assert env.dataset.name == "embedded" and len(env.dataset) == 200
    index = next(i for i, r in enumerate(ds) if r.metadata["template"] == "presence" and r.answer == "yes")
    record = ds[index]
    obs, info = env.reset(options={"index": index})
    assert info["record_id"] == record.id and record.question in obs["text"]
    assert obs["images"][0].shape == (256, 256, 3)
    lesion = _lesions(record)[0]
    call = {"name": "image_zoom_in", "arguments": {"bbox": list(lesion.bbox)}}
    obs, reward, terminated, truncated, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert not terminated and reward == 0.0 and len(obs["images"]) == 1
    assert obs["images"][0].shape[0] >= 256  # the crop came back enlarged
    obs, reward, terminated, truncated, info = env.step(r"<think>bright spot</think>\boxed{yes}")
    assert terminated and not truncated and reward == 1.0 and info["correct"] is True
    obs, info = env.reset(options={"index": index})
    _, reward, terminated, _, info = env.step(r"\boxed{no}")
    assert terminated and reward == -1.0 and info["correct"] is False
    env.close()


def test_default_env_passes_check_env():
    from gymnasium.utils.env_checker import check_env

    from medvqa_env.env import MedVQAEnv

    env = MedVQAEnv()
    assert env.dataset.name == "embedded" and env.dataset[0].split == "test"
    check_env(env, skip_render_check=True)
    env.close()
