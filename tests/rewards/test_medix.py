"""MediX-R1 composite: weights, terms, missing-term policies; judged over real loopback HTTP."""

from __future__ import annotations

import pytest

from medvqa_env.errors import ConfigError
from medvqa_env.records import AnswerType
from rewards.base import RewardInput
from rewards.medix import WEIGHTS, MediXReward, split_medix

GOOD = "<modality>CT</modality><think>the dense organ on the right</think><answer>liver</answer>"


def _s(completion, truth="liver", modality="CT", answer=None):
    return RewardInput(completion, answer, truth, AnswerType.OPEN,
                       metadata={"question": "Which organ?", "modality": modality})


def test_weights_are_the_papers():
    assert WEIGHTS == {"format": 0.1, "modality": 0.045, "llm": 0.5175, "embed": 0.3375}
    assert sum(WEIGHTS.values()) == pytest.approx(1.0)


def test_all_terms_right_scores_one_and_each_term_weighs_its_share(ScriptedJudge, minilm_sentences):
    with ScriptedJudge() as srv:
        r = MediXReward(judge={"base_url": srv.url}, embed_encoder=minilm_sentences)
        full, wrong_modality, no_format, wrong = r([
            _s(GOOD), _s(GOOD.replace("CT", "MRI")),
            _s("liver", answer="liver"),                              # env's boxed answer, no tags
            _s(GOOD.replace(">liver<", ">spleen<")),
        ])
    assert full.total == pytest.approx(1.0)
    assert full.components["embed_cosine"] == pytest.approx(1.0, abs=1e-5) and full.components["llm"] == 1.0
    assert wrong_modality.total == pytest.approx(1.0 - 0.045)
    assert no_format.total == pytest.approx(1.0 - 0.1 - 0.045)
    assert wrong.components["llm"] == 0.0 and wrong.components["embed"] == 0.0
    assert wrong.total == pytest.approx(0.1 + 0.045)
    assert wrong.components["accuracy"] == 0.0 and full.components["accuracy"] == 1.0


def test_embedding_threshold_is_binary_at_0_8(ScriptedJudge, minilm_sentences):
    with ScriptedJudge() as srv:
        r = MediXReward(judge={"base_url": srv.url}, embed_threshold=0.8, embed_encoder=minilm_sentences)
        (out,) = r([_s(GOOD.replace(">liver<", ">the liver<"))])
    cos = out.components["embed_cosine"]
    assert out.components["embed"] == float(cos >= 0.8)


def test_missing_modality_and_failed_judge_policies(ScriptedJudge, minilm_sentences):
    with ScriptedJudge(fail_first=100) as srv:
        judge = {"base_url": srv.url, "max_retries": 0}
        renorm = MediXReward(judge=judge, embed_encoder=minilm_sentences)([_s(GOOD, modality=None)])[0]
        zero = MediXReward(judge=judge, on_missing="zero", embed_encoder=minilm_sentences)([_s(GOOD, modality=None)])[0]
        abstain = MediXReward(judge=judge, on_missing="abstain", embed_encoder=minilm_sentences)([_s(GOOD, modality=None)])[0]
    assert renorm.components["judge_ok"] == 0.0 and "llm" not in renorm.components
    assert renorm.total == pytest.approx((0.1 + 0.3375) / (0.1 + 0.3375))
    assert zero.total == pytest.approx(0.1 + 0.3375)
    assert abstain.total is None


def test_configuration_errors(monkeypatch):
    monkeypatch.delenv("MEDVQA_JUDGE_URL", raising=False)
    with pytest.raises(ConfigError, match="needs a judge"):
        MediXReward()
    with pytest.raises(ConfigError, match="weights"):
        MediXReward(judge={"base_url": "http://127.0.0.1:9"}, weights={"lmm": 1.0})
    with pytest.raises(ConfigError, match="on_missing"):
        MediXReward(judge={"base_url": "http://127.0.0.1:9"}, on_missing="ignore")
    monkeypatch.setenv("MEDVQA_JUDGE_URL", "http://127.0.0.1:9")
    assert MediXReward().judge.config.base_url == "http://127.0.0.1:9"


def test_with_the_smollm2_judge(llm_server, minilm_sentences):
    url, key_env = llm_server
    r = MediXReward(judge={"base_url": url, "api_key_env": key_env, "timeout_s": 120}, embed_encoder=minilm_sentences)
    (out,) = r([_s(GOOD)])
    assert out.components["judge_ok"] == 1.0 and out.components["llm"] in (0.0, 1.0)
    assert out.total == pytest.approx(0.1 + 0.045 + 0.5175 * out.components["llm"] + 0.3375)


@pytest.mark.parametrize("completion,format_ok,tag", [
    (GOOD, True, "CT"),
    ("<think>t</think><answer>liver</answer>", True, None),                        # the tag is optional
    ("[MRI]\n<think>t</think> <answer>liver</answer>", True, "MRI"),
    ("Modality: X-Ray <think>t</think><answer>liver</answer>", True, "X-Ray"),
    ("Sure, here you go. <think>t</think><answer>liver</answer>", False, None),    # prose before <think>
    ("I see [CT] <think>t</think><answer>liver</answer>", False, None),            # prose around the tag
    ("[CT] [MRI] <think>t</think><answer>liver</answer>", False, None),            # two tags
    ("<think>t</think><answer>liver</answer> and that is all", False, None),       # text after </answer>
    ("<think>t</think><answer>liver</answer><answer>spleen</answer>", False, None),  # a second answer
    ("<think>a <think>b</think><answer>liver</answer>", False, None),              # nested <think>
    ("<answer>liver</answer><think>t</think>", False, None),                       # wrong order
    ("<think></think><answer></answer>", False, None),                               # empty spans
    ("<think> </think><answer>liver</answer>", False, None),                         # no reasoning
    ("<think>t</think><answer>\n</answer>", False, None),                           # no answer
    ("modality = CT, also some chatter <think>t</think><answer>liver</answer>", False, None),  # prose after
    ("Modality: CT and here is my long reasoning <think>t</think><answer>liver</answer>", False, None),
    ("<modality>Fundus Photography</modality><think>t</think><answer>x</answer>", True, "Fundus Photography"),
    ("modality = MRI T2-weighted <think>t</think><answer>liver</answer>", True, "MRI T2-weighted"),
])
def test_format_term_requires_think_then_answer_with_only_the_tag_before(completion, format_ok, tag):
    ok, got_tag, _ = split_medix(completion)
    assert (ok, got_tag) == (format_ok, tag)


def test_broken_format_still_scores_the_answer_span(ScriptedJudge, minilm_sentences):
    with ScriptedJudge() as srv:
        r = MediXReward(judge={"base_url": srv.url}, embed_encoder=minilm_sentences)
        (out,) = r([_s("Sure! <modality>CT</modality><think>t</think><answer>liver</answer>")])
    assert out.components["format"] == 0.0 and out.components["modality"] == 0.0
    assert out.components["llm"] == 1.0 and out.total == pytest.approx(1.0 - 0.1 - 0.045)
