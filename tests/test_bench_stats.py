"""The statistics and the pairing behind the bench's Lightning-vs-plain verdict (fast: no training)."""

from __future__ import annotations

import time
from unittest import mock

import numpy as np


def test_ratio_interval_carries_the_variation_between_fits():
    from bench.measure import StepResult, ratio_interval

    rng = np.random.default_rng(0)

    def fit(slow: float) -> tuple[list[float], list[float]]:  # one fit: 100 steps, both sides alike but noisy
        plain = list(rng.lognormal(0, 0.05, 100) * slow)
        return [p * 1.05 for p in plain], plain

    steady = [fit(1.0) for _ in range(5)]
    lo, hi = ratio_interval(steady, 20)
    assert lo <= 1.05 <= hi and hi - lo < 1e-9  # every step exactly 5% slower: no doubt about the ratio
    # the Lightning side of two of five fits caught a slow spell: the interval must widen to cover that
    spells = [(list(np.multiply(a, 1.2)), b) if i < 2 else (a, b) for i, (a, b) in enumerate(steady)]
    lo, hi = ratio_interval(spells, 20)
    assert lo < 1.07 and hi > 1.12
    assert ratio_interval(spells, 20) == (lo, hi)  # seeded
    assert ratio_interval([([1.0] * 30, [1.0] * 30)], 20) is None  # one block: too few to say
    r = StepResult("vit", [([2.0, 4.0], [1.0, 2.0])], 1, True, block=1)
    assert (r.lightning_s, r.plain_s, r.ratio, r.interval) == (3.0, 1.5, 2.0, None)


def test_interleaved_pairs_each_lightning_step_with_the_plain_step_after_it():
    from bench.measure import Interleaved

    # batch k starts at 10k; its plain step (run at its end) takes 1 + k: Lightning's step k is 10 - (1 + k)
    ticks = iter(t for k in range(5) for t in (10.0 * k, 10.0 * k + 5, 10.0 * k + 6 + k))
    harness = Interleaved(lambda: None, skip=1)
    with mock.patch.object(time, "perf_counter", lambda: next(ticks)):
        for k in range(5):
            harness.on_train_batch_start(None, None, None, k)
            if k < 4:
                harness.on_train_batch_end(None, None, None, None, k)
    assert harness.plain == [2.0, 3.0, 4.0] and harness.lightning == [8.0, 7.0, 6.0]
