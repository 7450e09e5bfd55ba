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


def test_item_precision_is_deterministic_and_shrinks_with_items():
    rng = np.random.default_rng(0)
    a, b = rng.random((5, 400)) < 0.7, rng.random((5, 400)) < 0.6
    se = stats.item_precision(a, b, reps=500, seed=3)
    assert se == stats.item_precision(a, b, reps=500, seed=3)
    # the sd of a mean of 400 paired differences of independent 0/1 items: sqrt((0.21 + 0.24 + 0.01) / 400)
    assert se == pytest.approx(math.sqrt(0.46 / 400), rel=0.15)
    assert stats.item_precision(a, a, reps=100, seed=0) == 0.0


def test_paired_seeds_recovers_a_known_difference():
    # Shared item difficulty (items a model gets right), the same for both arms: the pairing removes it.
    rng = np.random.default_rng(1)
    easy = rng.random(2000) < 0.6
    b = np.tile(easy, (5, 1))
    a = b.copy()
    flip = np.flatnonzero(~easy)[:200]  # a also gets 200 of the hard items right: +0.1 exactly, every seed
    a[:, flip] = True
    d = stats.paired_seeds(a, b)
    assert (d["estimate"], d["ci_lo"], d["ci_hi"], d["sd"]) == pytest.approx((0.1, 0.1, 0.1, 0.0))
    assert d["p"] == 0.0  # no spread over five seeds: decided by the side the mean is on
    same = stats.paired_seeds(b, b)
    assert (same["estimate"], same["ci_lo"], same["ci_hi"], same["p"]) == (0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="shapes differ"):
        stats.paired_seeds(a, b[:3])


def test_holm_textbook_example():
    # Holm (1979) style example: p = 0.01, 0.04, 0.03, 0.005 -> sorted 0.005*4, 0.01*3, 0.03*2, 0.04*1
    adj = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert np.isnan(stats.holm([np.nan, 0.5])[0]) and stats.holm([np.nan, 0.5])[1] == 0.5


@pytest.mark.parametrize("expect, estimate, p_holm, p_tost_holm, p_out_holm, verdict", [
    ("+", 0.05, 0.001, 1.0, math.nan, "held"),
    ("+", -0.05, 0.001, 1.0, math.nan, "failed"),  # significant, the wrong way
    ("+", 0.002, 0.6, 0.01, math.nan, "equivalent"),  # TOST within the margin: no effect
    ("+", 0.05, 0.2, 0.9, math.nan, "inconclusive"),
    ("0", 0.001, 0.01, 0.01, 1.0, "held"),
    ("0", 0.2, 0.01, 1.0, 0.001, "not equivalent"),  # outside the margin, significantly
    ("0", 0.01, 0.5, 0.3, 0.4, "inconclusive"),
])
def test_verdicts(expect, estimate, p_holm, p_tost_holm, p_out_holm, verdict):
    from pipeline.report.ledger import _verdict

    r = {"expect": expect, "estimate": estimate, "p_holm": p_holm, "p_tost_holm": p_tost_holm,
         "p_out_holm": p_out_holm}
    assert _verdict(r, alpha=0.05) == verdict


def test_seeds_asked_come_from_the_smallest_effect_of_interest_not_the_estimate():
    """A wrong-sign or tiny estimate asks the same seeds as a large one: the plan is sized for the row's sesoi (its
    anchored effect or margin); the inconclusive row states the smallest effect it could have detected."""
    from types import SimpleNamespace

    from pipeline.report.ledger import _detectable, _needed

    rp = SimpleNamespace(max_seeds=200, power=0.8)
    base = {"expect": "+", "seed_sd": 0.02, "seeds": 3, "sesoi": 0.04}
    asked = {est: _needed({**base, "estimate": est}, 0.01, 0.04, rp) for est in (-0.03, 0.001, 0.2)}
    assert len(set(asked.values())) == 1 and asked[0.001] is not None
    n = asked[0.001]
    # at the seeds it asks (the same sd, less inflated by the pilot factor) it detects its sesoi; at 3 it cannot
    assert _detectable({**base, "seeds": n}, 0.01, rp) <= 0.04 < _detectable(base, 0.01, rp)
    # a "0" row is sized for a true 0 inside its margin, whatever it measured
    zero = {**base, "expect": "0"}
    assert _needed({**zero, "estimate": 0.035}, 0.01, 0.04, rp) == _needed({**zero, "estimate": 0.0}, 0.01, 0.04, rp)


@pytest.mark.parametrize("acc, p_holm, verdict", [(0.4, 0.001, "held"), (0.9, 0.001, "failed"),
                                                   (0.55, 0.3, "inconclusive")])
def test_floor_verdicts_use_the_floor_bound(acc, p_holm, verdict):
    from pipeline.report.ledger import _verdict

    r = {"expect": "<=", "estimate": acc - 0.5, "acc_a": acc, "floor_bound": 0.56, "p_holm": p_holm,
         "p_tost_holm": math.nan, "p_out_holm": math.nan}
    assert _verdict(r, alpha=0.05) == verdict
