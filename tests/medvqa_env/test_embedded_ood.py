"""Issue 46's generalisation split, ``test_ood``: test-like scenes asked in wordings that no other
split uses, the answers still exact; the other splits unchanged by it."""

from __future__ import annotations

import collections
import hashlib
import json

import pytest

from medvqa_env.datasets import load_dataset
from medvqa_env.datasets.embedded import OOD_WORDINGS, SPLIT_SIZES, load_embedded
from medvqa_env.env import MedVQAEnv
from medvqa_env.records import AnswerType


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedded")
    return {s: load_embedded(s, root=root) for s in ("train", "val", "test", "test_ood")}


def _wording_of(question: str) -> tuple[str, str, str] | None:
    """(kind, OOD wording, host or "") of a question, or ``None`` when it is no OOD wording."""
    for kind, texts in OOD_WORDINGS.items():
        for text in texts:
            head, has_host, tail = text.partition("{host}")
            if question == text:
                return kind, text, ""
            if has_host and question.startswith(head) and question.endswith(tail) and len(question) > len(head + tail):
                return kind, text, question[len(head):len(question) - len(tail)]
    return None


def test_no_ood_question_is_asked_in_any_other_split(splits):
    seen = {r.question for s in ("train", "val", "test") for r in splits[s]}
    ood = splits["test_ood"]
    assert len(ood) == SPLIT_SIZES["test_ood"] == 200
    assert not {r.question for r in ood} & seen
    # and no other split's template wording appears in it either: every question is an OOD wording
    assert all(_wording_of(r.question) is not None for r in ood)
    assert not any(_wording_of(r.question) for s in ("train", "val", "test") for r in splits[s])


def test_every_wording_is_used_and_keeps_the_gold_calls_keyword(splits):
    used = collections.Counter(_wording_of(r.question)[1] for r in splits["test_ood"])
    for kind, texts in OOD_WORDINGS.items():
        for text in texts:
            assert used[text] > 0, f"wording never used: {text!r}"
            assert ("modality" if kind.startswith("modality") else "lesion") in text.lower()


def test_answers_are_exact_and_balanced_as_in_test(splits):
    ood = splits["test_ood"]
    for r in ood:
        lesions = r.metadata["lesions"]
        if r.question_type == "PRES":
            host = _wording_of(r.question)[2]
            assert r.answer == ("yes" if any(l["host"] == host for l in lesions) else "no"), r.question
        if r.question_type == "ORGAN":
            assert r.answer in {l["host"] for l in lesions}
        if r.question_type == "COUNT":
            assert r.options[r.answer] == str(len(lesions))
    closed = collections.Counter(r.answer for r in ood if r.answer_type == AnswerType.CLOSED)
    assert abs(closed["yes"] - closed["no"]) <= 2
    assert {r.question_type for r in ood} == {"COUNT", "PRES", "ORGAN", "POS", "MODALITY"}


def test_its_images_are_its_own(splits):
    def digests(ds):
        return {hashlib.sha256(open(p, "rb").read()).hexdigest() for r in ds for p in r.image_paths}
    ood = digests(splits["test_ood"])
    assert not ood & digests(splits["test"]) and not ood & digests(splits["train"])


def test_the_other_splits_are_unchanged(splits):
    """The generator's train/val/test output before the OOD split was added (the records and tool
    builds were made on it): a change here must bump ``embedded.VERSION``."""
    got = {}
    for s in ("train", "val", "test"):
        rows = [(r.id, r.question, r.answer, r.answer_type.value, json.dumps(r.options, sort_keys=True)) for r in splits[s]]
        got[s] = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
    assert got == {"train": "e4a530d91de0884c", "val": "7fb5e6e4a8f3cdd0", "test": "1dd365f18d6f8285"}


def test_it_loads_by_name_and_alias_and_runs_in_the_env(tmp_path):
    ds = load_dataset("embedded", split="ood", root=str(tmp_path))
    assert ds[0].split == "test_ood" and ds[0].id == "embedded_test_ood_0000"
    env = MedVQAEnv(dataset="embedded", split="test_ood", dataset_options={"root": str(tmp_path)})
    obs, info = env.reset(seed=0)
    assert _wording_of(info["question"]) and info["question"] in obs["text"]
