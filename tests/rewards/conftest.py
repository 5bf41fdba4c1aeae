"""Fixtures for reward tests: MiniLM is loaded once per session and shared."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def minilm():
    """A loaded all-MiniLM-L6-v2 :class:`TokenEncoder` (BERTScore tokens + sentence vectors)."""
    from rewards.encoders import TokenEncoder

    enc = TokenEncoder()
    enc.encode(["warm up"])
    return enc


@pytest.fixture
def armed(minilm):
    """A fresh ARMed reward (fresh thresholds) sharing the session's encoder."""
    from rewards.armed import ARMedReward

    return ARMedReward(token_encoder=minilm)
