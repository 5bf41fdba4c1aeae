"""The judge client: real HTTP on loopback -- a scripted server for failure paths, and
agents.openai_server with SmolLM2-135M for the real model path."""

from __future__ import annotations

import os
import pickle
import time

import pytest

from rewards.judge import JudgeClient, JudgeConfig


ITEMS = [("Which organ?", "liver", "Liver"), ("Which side?", "left", "right"), ("Which organ?", "liver", "Liver")]


def test_verdicts_concurrency_and_cache(ScriptedJudge):
    with ScriptedJudge() as srv:
        client = JudgeClient(JudgeConfig(srv.url, max_concurrency=3))
        v = client.judge(ITEMS)
        assert [x.score for x in v] == [1.0, 0.0, 1.0]
        assert len(srv.requests) == 2                      # the duplicate item was asked once
        again = client.judge(ITEMS[:2])
        assert all(x.cached for x in again) and len(srv.requests) == 2
        assert srv.requests[0]["temperature"] == 0.0 and srv.requests[0]["max_tokens"] == 4


def test_retries_with_backoff_then_success(ScriptedJudge):
    with ScriptedJudge(fail_first=2) as srv:
        client = JudgeClient(JudgeConfig(srv.url, max_retries=3, backoff_s=0.05))
        t = time.perf_counter()
        (v,) = client.judge(ITEMS[:1])
        assert v.score == 1.0 and v.error is None
        assert len(srv.requests) == 3 and time.perf_counter() - t >= 0.05 + 0.1


def test_gives_up_after_retries_and_does_not_cache_failures(ScriptedJudge):
    with ScriptedJudge(fail_first=100) as srv:
        client = JudgeClient(JudgeConfig(srv.url, max_retries=2, backoff_s=0.01))
        (v,) = client.judge(ITEMS[:1])
        assert v.score is None and "HTTP 503" in v.error and len(srv.requests) == 3
        client.judge(ITEMS[:1])
        assert len(srv.requests) == 6                      # asked again, not served from cache


def test_client_errors_are_not_retried(ScriptedJudge):
    with ScriptedJudge(fail_first=100, status=400) as srv:
        (v,) = JudgeClient(JudgeConfig(srv.url, max_retries=3, backoff_s=0.01)).judge(ITEMS[:1])
        assert v.score is None and "HTTP 400" in v.error and len(srv.requests) == 1


def test_timeout_is_an_error_verdict_not_a_hang(ScriptedJudge):
    with ScriptedJudge(delay_s=1.0) as srv:
        client = JudgeClient(JudgeConfig(srv.url, timeout_s=0.2, max_retries=1, backoff_s=0.01))
        t = time.perf_counter()
        (v,) = client.judge(ITEMS[:1])
        assert v.score is None and "Timeout" in v.error and time.perf_counter() - t < 1.5


def test_unreachable_server():
    (v,) = JudgeClient(JudgeConfig("http://127.0.0.1:9", max_retries=0)).judge(ITEMS[:1])
    assert v.score is None and v.error


def test_api_key_from_env_and_never_shown(monkeypatch, ScriptedJudge):
    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-secret-123")
    with ScriptedJudge(api_key="sk-secret-123") as srv:
        client = JudgeClient(JudgeConfig(srv.url, api_key_env="TEST_JUDGE_KEY"))
        assert client.judge(ITEMS[:1])[0].score == 1.0
        assert "sk-secret" not in repr(client) and "sk-secret" not in repr(client.config)
        assert "sk-secret" not in str(pickle.dumps(client))
        monkeypatch.delenv("TEST_JUDGE_KEY")
        (v,) = JudgeClient(JudgeConfig(srv.url, api_key_env="TEST_JUDGE_KEY")).judge(ITEMS[1:2])
        assert v.score is None and "HTTP 401" in v.error


def test_config_checks():
    with pytest.raises(ValueError, match="http"):
        JudgeConfig("127.0.0.1:8000")
    with pytest.raises(ValueError, match="max_concurrency"):
        JudgeConfig("http://x", max_concurrency=0)
    assert JudgeConfig("http://h:1/v1").endpoint == "http://h:1/v1/chat/completions"


def test_pickled_client_still_works(ScriptedJudge):
    with ScriptedJudge() as srv:
        client = JudgeClient(JudgeConfig(srv.url))
        client.judge(ITEMS[:1])
        clone = pickle.loads(pickle.dumps(client))
        assert clone.judge(ITEMS[1:2])[0].score == 0.0


# -- the real model path: agents.openai_server with SmolLM2-135M-Instruct -----------------------
def test_against_smollm2_server(llm_server):
    url, key_env = llm_server
    client = JudgeClient(JudgeConfig(url, model="smollm2-135m-instruct", api_key_env=key_env, timeout_s=120))
    verdicts = client.judge([("Which organ is shown?", "liver", "liver"), ("Is it CT?", "MRI", "CT")])
    # a 135M model is a poor judge: we check the pipeline (a parsed verdict, no error), not its opinion
    assert all(v.error is None and v.score in (0.0, 1.0) for v in verdicts), verdicts
    assert os.environ[key_env] not in repr(client)
