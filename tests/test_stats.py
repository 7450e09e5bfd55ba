"""pipeline.report.stats against known values, edge cases and synthetic cases with a known answer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.report import stats


@pytest.mark.parametrize("k, n, expected", [
    # Wilson score interval, z = 1.96: closed form (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    (0, 1, (0.0, 0.7934506856)),  # 3.8416 / 4.8416
    (1, 1, (0.2065493144, 1.0)),
    (0, 10, (0.0, 0.2775327998)),
    (10, 10, (0.7224672002, 1.0)),
    (5, 10, (0.2365930905, 0.7634069095)),
])
def test_wilson_known_values(k, n, expected):
    assert stats.wilson(k, n) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("k, n, expected", [
    # Clopper-Pearson: k = 0 -> [0, 1 - (a/2)^(1/n)], k = n -> [(a/2)^(1/n), 1]
    (0, 1, (0.0, 0.975)),
    (1, 1, (0.025, 1.0)),
    (0, 5, (0.0, 1 - 0.025 ** (1 / 5))),
    (5, 5, (0.025 ** (1 / 5), 1.0)),
    (3, 10, (0.0667395111, 0.6524528500)),  # textbook table value
])
def test_clopper_pearson_known_values(k, n, expected):
    assert stats.clopper_pearson(k, n) == pytest.approx(expected, abs=1e-6)


def test_intervals_stay_in_unit_range_and_empty_is_nan():
    for k, n in [(0, 1), (1, 1), (0, 3), (3, 3), (1, 2)]:
        for fn in (stats.wilson, stats.clopper_pearson):
            lo, hi = fn(k, n)
            assert 0.0 <= lo <= k / n <= hi <= 1.0
    assert all(math.isnan(v) for v in stats.wilson(0, 0))


def test_hierarchical_mean_is_deterministic_and_bounded():
    rng = np.random.default_rng(0)
    m = rng.random((5, 400)) < 0.7
    a = stats.hierarchical_mean(m, reps=500, seed=3)
    assert a == stats.hierarchical_mean(m, reps=500, seed=3)
    assert a["estimate"] == pytest.approx(m.mean())
    assert 0.0 <= a["ci_lo"] < a["estimate"] < a["ci_hi"] <= 1.0
    ones = stats.hierarchical_mean(np.ones((1, 10)), reps=200, seed=0)  # p = 1, one seed
    assert (ones["ci_lo"], ones["ci_hi"]) == (1.0, 1.0)


def test_paired_difference_recovers_a_known_difference():
    # Shared item difficulty (items a model gets right), the same for both arms: the pairing removes it.
    rng = np.random.default_rng(1)
    easy = rng.random(2000) < 0.6
    b = np.tile(easy, (5, 1))
    a = b.copy()
    flip = np.flatnonzero(~easy)[:200]  # a also gets 200 of the hard items right: +0.1 exactly
    a[:, flip] = True
    d = stats.paired_difference(a, b, reps=1000, seed=0)
    assert d["estimate"] == pytest.approx(0.1)
    assert d["ci_lo"] < 0.1 < d["ci_hi"] and d["ci_hi"] - d["ci_lo"] < 0.04
    assert d["p"] == pytest.approx(1 / 1001)
    same = stats.paired_difference(b, b, reps=200, seed=0)
    assert (same["estimate"], same["ci_lo"], same["ci_hi"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="shapes differ"):
        stats.paired_difference(a, b[:3], reps=10, seed=0)


def test_holm_textbook_example():
    # Holm (1979) style example: p = 0.01, 0.04, 0.03, 0.005 -> sorted 0.005*4, 0.01*3, 0.03*2, 0.04*1
    adj = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert np.isnan(stats.holm([np.nan, 0.5])[0]) and stats.holm([np.nan, 0.5])[1] == 0.5


@pytest.mark.parametrize("lo, hi, p, expect, verdict", [
    (-0.01, 0.015, 0.6, "+", "equivalent"),  # the whole CI within +-0.02: no effect
    (0.05, 0.15, 0.001, "+", "held"),
    (-0.15, -0.05, 0.001, "+", "failed"),
    (-0.05, 0.15, 0.3, "+", "underpowered"),
    (0.05, 0.15, 0.2, "+", "underpowered"),  # excluded 0 alone, not after Holm
    (-0.01, 0.01, 0.9, "0", "held"),
    (0.05, 0.15, 0.001, "0", "failed"),
    (-0.2, 0.01, 0.01, "<=", "held"),  # at or below the floor
    (0.05, 0.15, 0.001, "<=", "failed"),  # clearly above it
])
def test_verdicts(lo, hi, p, expect, verdict):
    assert stats.verdict(lo, hi, p, expect, margin=0.02, alpha=0.05) == verdict


def test_seeds_needed_scales_with_the_interval():
    # half-width 0.1 at 5 seeds, estimate 0.05, margin 0.02: target max(0.05, -0.03) = 0.05 -> 5 * 4 = 20
    assert stats.seeds_needed(5, -0.05, 0.15, 0.05, 0.02) == 20
    assert stats.seeds_needed(5, 0.04, 0.06, 0.05, 0.02) == 6  # already decisive: at least one more
