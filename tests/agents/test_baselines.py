"""Baseline agents run real episodes through MedVQAEnv (VQA-RAD and a tiny annotated set)."""

from __future__ import annotations

import re

import pytest

from agents.baselines import (AnswerPriorAgent, OracleAgent, RandomAgent, ToolThenAnswerAgent,
                              fill_arguments, observations)
from agents.registry import available_agents, build_agent
from medvqa_env.chat import Conversation
from medvqa_env.env import MedVQAEnv
from medvqa_env.errors import ConfigError
from medvqa_env.records import AnswerType
from rewards import RuleReward


def test_random_agent_is_seeded_and_answers_the_right_type(episodes, rad_env):
    indices = list(range(12))
    a = episodes(rad_env, RandomAgent(seed=3, p_tool=0.5), indices)
    b = episodes(rad_env, RandomAgent(seed=3, p_tool=0.5), list(reversed(indices)))[::-1]
    assert [r["actions"] for r in a] == [r["actions"] for r in b]  # batch order does not matter
    c = episodes(rad_env, RandomAgent(seed=4, p_tool=0.5), indices)
    assert [r["actions"] for r in a] != [r["actions"] for r in c]
    assert all(r["end_reason"] == "answer" and r["format_ok"] for r in a)
    for r in a:
        if r["answer_type"] == "CLOSED":
            assert r["answer"] in ("yes", "no")
    tool_turns = [act for r in a for act in r["actions"] if "<tool_call>" in act]
    assert tool_turns, "p_tool=0.5 over 12 episodes should call a tool"


def test_random_agent_tool_calls_are_accepted_by_the_tools(episodes, rad_env):
    results = episodes(rad_env, RandomAgent(seed=0, p_tool=1.0, max_tool_turns=1), range(5))
    for r in results:
        assert r["turns"] == 2 and r["end_reason"] == "answer"
    env = MedVQAEnv(dataset=rad_env.dataset, reward=RuleReward())
    obs, info = env.reset(options={"index": 0})
    conv = Conversation.start(obs, info)
    _, _, _, _, step_info = env.step(RandomAgent(seed=0, p_tool=1.0).act(conv))
    assert step_info["tool_calls"] and step_info["tool_calls"][0]["error"] is None


def test_prior_fits_the_train_split_and_beats_random_on_closed(episodes, rad_train, rad_test, rad_env):
    prior = AnswerPriorAgent().fit(rad_train)
    assert prior.predict("CLOSED", "Is there a fracture?") in ("yes", "no")
    closed = [i for i, r in enumerate(rad_test) if r.answer_type is AnswerType.CLOSED][:60]
    acc_prior = sum(r["correct"] for r in episodes(rad_env, prior, closed)) / len(closed)
    acc_random = sum(r["correct"] for r in episodes(rad_env, RandomAgent(seed=0, p_tool=0.0), closed)) / len(closed)
    assert acc_prior > 0.5 and acc_prior >= acc_random


def test_prior_uses_question_words_and_backs_off(tiny_annotated):
    from medvqa_env.records import VQARecord

    base = tiny_annotated[0]
    recs = [VQARecord(f"r{i}", base.image_paths, q, a, AnswerType.CLOSED, "tiny")
            for i, (q, a) in enumerate([("Is the heart enlarged?", "No")] * 4 + [("Are there nodules?", "Yes")] * 5)]
    prior = AnswerPriorAgent(min_count=3).fit(recs)
    assert prior.predict("CLOSED", "Is the liver enlarged?") == "no"  # key ("is the") seen 4 times
    assert prior.predict("CLOSED", "Was it broken?") == "yes"  # falls back to the type's majority
    assert prior.predict("OPEN", "What organ?") == "normal"  # never-seen type: the fixed default
    assert prior.predict("MCQ", "Which?", {"A": "x", "B": "y"}) == "A"
    with pytest.raises(ValueError, match="non-empty"):
        AnswerPriorAgent().fit([])


def test_oracle_is_an_upper_bound_and_uses_annotations(episodes, tiny_annotated, rad_test, rad_env):
    env = MedVQAEnv(dataset=tiny_annotated, reward=RuleReward())
    results = episodes(env, OracleAgent(tiny_annotated), range(3))
    assert all(r["correct"] for r in results if r["answer_type"] != "OPEN")
    assert all(r["turns"] == 2 and "image_zoom_in" in r["actions"][0] for r in results)
    rad = episodes(rad_env, OracleAgent(rad_test), range(20))
    assert all(r["turns"] == 1 and r["reward"] == 1.0 for r in rad if r["answer_type"] == "CLOSED")
    with pytest.raises(ValueError, match="VQADataset"):
        OracleAgent([1, 2])


def test_tool_then_answer_calls_tools_then_answers(episodes, rad_train, rad_env):
    agent = ToolThenAnswerAgent().fit(rad_train)
    results = episodes(rad_env, agent, range(10))
    for r in results:
        assert r["turns"] == 2 and r["end_reason"] == "answer" and r["format_ok"]
        assert '"image_zoom_in"' in r["actions"][0]


def test_tool_then_answer_reads_negative_tool_text(tiny_annotated):
    env = MedVQAEnv(dataset=tiny_annotated, reward=RuleReward())
    obs, info = env.reset(options={"index": 0})
    conv = Conversation.start(obs, info)
    conv.add_turn("<tool_call>...</tool_call>", {"text": "<observation>[segment] No lesion found.</observation>"})
    assert ToolThenAnswerAgent().act(conv) == "\\boxed{no}"
    assert observations(conv) == ["<observation>[segment] No lesion found.</observation>"]


def test_agents_follow_the_xml_protocol(episodes, tiny_annotated):
    env = MedVQAEnv(dataset=tiny_annotated, reward=RuleReward(), answer_protocol="xml")
    results = episodes(env, AnswerPriorAgent(), range(3))
    assert all(r["format_ok"] and r["end_reason"] == "answer" for r in results)


def test_fill_arguments_for_unknown_schemas():
    schema = {"properties": {"prompt": {"type": "string"}, "k": {"type": "integer", "minimum": 1},
                             "mode": {"type": "string", "enum": ["fast", "slow"]}},
              "required": ["prompt", "k", "mode"]}
    assert fill_arguments(schema, [0, 0, 1, 1], (10, 10), text="lung") == {"prompt": "lung", "k": 1, "mode": "fast"}


def test_registry_builds_by_name_and_fails_helpfully(tiny_annotated):
    assert {"random", "prior", "zoom-then-answer", "oracle", "openai", "vlm", "text-llm"} <= set(available_agents())
    assert isinstance(build_agent("oracle", dataset=tiny_annotated), OracleAgent)
    assert isinstance(build_agent("tool-then-answer"), ToolThenAnswerAgent)
    with pytest.raises(ConfigError, match="Did you mean 'oracle'"):
        build_agent("oracel")
    with pytest.raises(ConfigError, match="needs dataset"):
        build_agent("oracle")
    with pytest.raises(ConfigError, match="agent 'random' has no option 'temperature'"):
        build_agent("random", temperature=2)


def test_registry_loads_datasets_from_command_line_forms():
    prior = build_agent("prior", fit_on="embedded")  # the embedded train split
    assert prior.fitted_on.startswith("embedded (n=")
    oracle = build_agent("oracle", dataset="embedded:val")
    assert oracle.dataset[0].split == "val"
    with pytest.raises(ConfigError, match="name\\[:split\\]"):
        build_agent("oracle", dataset=3)


def test_tool_then_answer_fills_every_builtin_tool_and_reads_the_classifier(episodes, tiny_annotated):
    env = MedVQAEnv(dataset="embedded", split="test", tools=["image_zoom_in", "segment", "ground", "classify"],
                    reward=RuleReward())
    agent = ToolThenAnswerAgent().fit(env.dataset)
    followed = 0
    for index in range(4):
        obs, info = env.reset(options={"index": index})
        conv = Conversation.start(obs, info)
        action = agent.act(conv)
        obs, _, _, _, step = env.step(action)
        assert [c["name"] for c in step["tool_calls"]] == ["image_zoom_in", "segment", "ground", "classify"]
        assert all(c["error"] is None for c in step["tool_calls"]), [c["text"] for c in step["tool_calls"]]
        conv.add_turn(action, obs)
        scores = [(label, float(v)) for label, v in
                  re.findall(r"([^,:]+?) (\d\.\d+)", step["tool_calls"][-1]["text"].split(": ", 1)[1].split(". ")[0])]
        (top, p1), (_, p2) = sorted(scores, key=lambda x: -x[1])[:2]
        best = {v.lower(): k for k, v in info["options"].items()}.get(top.strip().lower())
        if info["answer_type"] == "MCQ" and best and p1 - p2 >= agent.decisive_margin and "how many" not in info["question"].lower():
            assert agent.act(conv) == "\\boxed{" + best + "}"  # a decisive classifier picks the option
            followed += 1
    assert followed, "expected a question whose classifier answer is decisive in the first four"
    assert all(r["end_reason"] == "answer" for r in episodes(env, agent, range(8)))


def test_tool_heuristic_with_oracle_tools_is_an_upper_bound_on_label_only_data(episodes, tiny_annotated):
    """Issue 12: on a dataset annotated with image labels only, oracle grounding finds no boxes;
    that absence must not override the oracle classifier (which knows the label)."""
    from medvqa_env.records import Annotations, VQADataset, VQARecord

    image = tiny_annotated[0].image_paths
    cases = [("Is there a pneumothorax?", "yes", ("pneumothorax",)), ("Is there a pneumothorax?", "no", ("normal",)),
             ("Is there an effusion?", "yes", ("effusion", "cardiomegaly")), ("Is there an effusion?", "no", ()),
             ("Is there a fracture?", "yes", ("fracture",)), ("Is there a fracture?", "no", ("normal",))]
    labelled = VQADataset([VQARecord(f"l{i}", image, q, a, AnswerType.CLOSED, "labels", annotations=Annotations(labels=lab))
                           for i, (q, a, lab) in enumerate(cases)], name="labels")
    oracle_tools = {"image_zoom_in": "local", "segment": {"engine": "oracle"}, "ground": {"engine": "oracle"},
                    "classify": {"engine": "oracle"}}
    env = MedVQAEnv(dataset=labelled, tools=oracle_tools, reward=RuleReward())
    results = episodes(env, ToolThenAnswerAgent(), range(len(labelled)))
    assert all(r["turns"] == 2 and all(f'"{t}"' in r["actions"][0] for t in oracle_tools) for r in results)
    assert [r["answer"] for r in results] == [a for _, a, _ in cases]  # every one right: an upper bound
    env.close()
