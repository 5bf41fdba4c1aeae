"""Issue 46's imperfect demonstrations: ``train.sft --misread_share`` makes a fixed, seeded share of
the tool-calling gold trajectories answer wrongly after the tool (a demonstrator who misreads it),
and ``--tool_share`` a share that never calls it; right ones stay exactly the gold script."""

from __future__ import annotations

import collections

import pytest

from medvqa_env.datasets import load_dataset
from medvqa_env.errors import ConfigError
from train.sft import gold_script, gold_tool_call, wrong_answers

TOOLS = ["ground", "classify", "image_zoom_in"]


@pytest.fixture(scope="module")
def train_split(tmp_path_factory):
    return load_dataset("embedded", split="train", root=str(tmp_path_factory.mktemp("emb")))


class _Conv:
    """The two fields the script reads (a Conversation's ``info`` and ``turns``)."""

    def __init__(self, record_id: str, turns: int):
        self.info, self.turns = {"record_id": record_id}, turns


def _episode(script, record) -> tuple[str, str]:
    first = script(_Conv(record.id, 0))
    return first, (script(_Conv(record.id, 1)) if first.startswith("<tool_call>") else first)


def test_every_record_has_a_wrong_answer_of_its_own_kind(train_split):
    wrong = wrong_answers(train_split)
    assert len(wrong) == len(train_split)
    for r in train_split:
        w = wrong[r.id]
        assert w != r.answer
        if r.answer in ("yes", "no"):
            assert w == {"yes": "no", "no": "yes"}[r.answer]
        elif r.options:
            assert w in r.options
        else:
            assert w in {x.answer for x in train_split if x.question_type == r.question_type}


def test_misread_share_flips_that_share_of_the_tool_calling_answers(train_split):
    perfect = gold_script(train_split, TOOLS, 1.0, seed=3)
    imperfect = gold_script(train_split, TOOLS, 1.0, seed=3, misread_share=0.3)
    counts = collections.Counter()
    for r in train_split:
        call, answer = _episode(imperfect, r)
        gold_call, gold_answer = _episode(perfect, r)
        assert call == gold_call  # the tool call itself is the gold one
        has_call = gold_tool_call(r, TOOLS) is not None
        assert gold_answer == f"\\boxed{{{r.answer}}}"
        if answer != gold_answer:
            assert has_call, "only an episode that read a tool can misread it"
            counts["misread"] += 1
        counts["calls"] += has_call
    assert 0.25 < counts["misread"] / counts["calls"] < 0.35
    again = gold_script(train_split, TOOLS, 1.0, seed=3, misread_share=0.3)
    assert all(_episode(again, r) == _episode(imperfect, r) for r in list(train_split)[:50])  # fixed, not redrawn


def test_tool_share_and_misread_share_mix(train_split):
    script = gold_script(train_split, TOOLS, 0.5, seed=0, misread_share=1.0)
    kinds = collections.Counter()
    for r in train_split:
        first, answer = _episode(script, r)
        called = first.startswith("<tool_call>")
        right = answer == f"\\boxed{{{r.answer}}}"
        kinds[(called, right)] += 1
    assert kinds[(True, True)] == 0 and kinds[(False, False)] == 0  # misread_share 1: every reader is wrong
    assert 0.4 < kinds[(True, False)] / len(train_split) < 0.6


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_shares_outside_0_1_are_refused(train_split, share):
    with pytest.raises(ConfigError, match="misread_share"):
        gold_script(train_split, TOOLS, 1.0, misread_share=share)
