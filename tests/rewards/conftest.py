"""Fixtures for reward tests: MiniLM is loaded once per session and shared."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One intra-op thread while these tests run: on a shared 2-core machine two OpenMP threads
    that compete with other processes make small forward passes 5-20x slower."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def minilm():
    """A loaded all-MiniLM-L6-v2 :class:`TokenEncoder` (BERTScore tokens + sentence vectors)."""
    from rewards.encoders import TokenEncoder

    enc = TokenEncoder()
    enc.encode(["warm up"])
    return enc


@pytest.fixture(scope="session")
def minilm_sentences():
    """A loaded sentence-transformers all-MiniLM-L6-v2 :class:`SentenceEncoder`."""
    from rewards.encoders import SentenceEncoder

    enc = SentenceEncoder()
    enc.encode(["warm up"])
    return enc


@pytest.fixture
def armed(minilm):
    """A fresh ARMed reward (fresh thresholds) sharing the session's encoder."""
    from rewards.armed import ARMedReward

    return ARMedReward(token_encoder=minilm)


@pytest.fixture(scope="session")
def llm_server():
    """agents.openai_server with SmolLM2-135M-Instruct on loopback, requiring an API key.

    Yields ``(url, api_key_env)``. The dequantised model is cached across sessions under
    ``$MEDVQA_TEST_LLM_CACHE`` (default ``~/.cache/medvqa-gym``) so only the first run pays ~20-50 s.
    """
    import os
    import secrets
    from pathlib import Path

    from agents.openai_server import ServerProcess

    key_env = "MEDVQA_TEST_JUDGE_KEY"
    os.environ[key_env] = "sk-test-" + secrets.token_hex(8)
    cache = os.environ.get("MEDVQA_TEST_LLM_CACHE", str(Path.home() / ".cache" / "medvqa-gym"))
    with ServerProcess(api_key_env=key_env, env={"MEDVQA_CACHE": cache}, torch_threads=1) as srv:
        yield srv.url, key_env


@pytest.fixture(scope="session")
def ScriptedJudge():  # noqa: N802 - it hands out a class
    """The scripted loopback judge server class (see scripted_server.py)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("scripted_server", Path(__file__).with_name("scripted_server.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ScriptedJudge
