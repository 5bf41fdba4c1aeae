"""The bootstrap interval is the stated level's: its ends are the (1 - level) / 2 and (1 + level) / 2
quantiles of the resampled statistic, and it covers the true rate about ``level`` of the time.

Checked against things known without the code under test: the resampled mean of n 0/1 answers with
k ones is exactly Binomial(n, k/n) / n, whose quantiles are summed here from the binomial pmf; and
the coverage over many data sets drawn with a known rate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from eval.metrics import ratio_with_ci


def binomial_quantile(n: int, p: float, q: float) -> int:
    """The smallest j with P(Binomial(n, p) <= j) >= q."""
    cdf = 0.0
    for j in range(n + 1):
        cdf += math.exp(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
                        + j * math.log(p) + (n - j) * math.log1p(-p))
        if cdf >= q:
            return j
    return n


@pytest.mark.parametrize("level", [0.95, 0.8])
def test_interval_ends_are_the_binomial_quantiles_of_the_level(level):
    n, k = 1000, 300
    m = ratio_with_ci([1.0] * k + [0.0] * (n - k), [1.0] * n, resamples=4000, seed=0, level=level)
    tail = (1 - level) / 2
    low, high = binomial_quantile(n, k / n, tail), binomial_quantile(n, k / n, 1 - tail)
    # a 4000-draw estimate of a quantile lies within ~1 answer of it; a wrong tail (1 - level, the
    # interval of level 2*level - 1) puts the ends 4 (0.95) or 7 (0.8) answers inside
    assert m.value == 0.3 and m.n == n
    assert m.ci_low * n == pytest.approx(low, abs=1.5) and m.ci_high * n == pytest.approx(high, abs=1.5)


def test_an_80_percent_interval_covers_the_true_rate_about_80_percent_of_the_time():
    rng = np.random.default_rng(2026)
    rate, n, trials = 0.3, 150, 150
    covered = 0
    for i in range(trials):
        answers = (rng.random(n) < rate).astype(float)
        m = ratio_with_ci(answers, np.ones(n), resamples=500, seed=i, level=0.8)
        covered += m.ci_low <= rate <= m.ci_high
    assert 0.7 <= covered / trials <= 0.9, covered / trials      # a 60 % interval would cover ~0.6
