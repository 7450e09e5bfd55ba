"""The statistics behind the bench's Lightning-vs-plain verdict (fast: no training)."""

from __future__ import annotations

import numpy as np


def test_median_interval_is_the_order_statistic_interval_and_covers():
    from bench.__main__ import StepResult, median_interval

    assert median_interval([float(v) for v in range(15, 0, -1)]) == (4.0, 12.0)  # binomial: 96.5% for n = 15
    assert median_interval([1.0, 3.0, 2.0]) == (1.0, 3.0)  # too few for 95%: the widest pair
    rng = np.random.default_rng(0)
    samples = rng.lognormal(0.1, 0.2, (2000, 15))  # skewed, like step-time ratios; true median e^0.1
    covered = np.mean([lo <= np.exp(0.1) <= hi for lo, hi in map(median_interval, samples.tolist())])
    assert 0.95 <= covered <= 0.98
    r = StepResult("vit", [1.2, 1.0, 3.0], [1.0, 1.0, 1.0], 1, True)
    assert r.ratio == 1.2 and r.interval == (1.0, 3.0) and r.lightning_s == 1.2
