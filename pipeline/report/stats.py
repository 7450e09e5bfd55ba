"""Pure statistics for the report: proportion intervals, hierarchical bootstraps, Holm, verdicts.

Conventions (stated in the report):

- one proportion (an accuracy on n items, a share of seeds): Wilson (scipy ``binomtest(...).proportion_ci``);
- "k of n seeds reached the threshold": Clopper-Pearson exact (same scipy call, ``method="exact"``);
- a mean accuracy over seeds x test items: a hierarchical bootstrap, seeds resampled, then test items
  (the test split is one fixed sample shared by every seed, so both sources of error are resampled);
- a difference between two architectures: the same bootstrap on the item-paired difference (same seeds,
  same test items, same resampling draws for both arms);
- a family of ledger tests: Holm's step-down correction of the bootstrap p-values.

Every bootstrap takes an explicit ``seed`` (from params), so a report is reproducible bit for bit. No
interval of a proportion leaves [0, 1]: Wilson and Clopper-Pearson cannot, and a bootstrap of a mean of
0/1 values cannot either (percentile interval).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def _binom_ci(k: int, n: int, level: float, method: str) -> tuple[float, float]:
    if n <= 0:
        return math.nan, math.nan
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method=method)
    return float(min(max(ci.low, 0.0), 1.0)), float(min(max(ci.high, 0.0), 1.0))


def wilson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of the proportion k/n; (nan, nan) when n = 0."""
    return _binom_ci(k, n, level, "wilson")


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of k/n, e.g. "k of n seeds reached 0.9"; (nan, nan) when n = 0."""
    return _binom_ci(k, n, level, "exact")


def _weights(rng: np.random.Generator, n: int, reps: int) -> np.ndarray:
    """(reps, n) resampling weights: counts of a with-replacement draw of n out of n, divided by n."""
    draws = rng.integers(0, n, size=(reps, n)) + n * np.arange(reps)[:, None]  # row r counts into bins r*n..
    return np.bincount(draws.ravel(), minlength=reps * n).reshape(reps, n) / n


def bootstrap_means(matrix: np.ndarray, reps: int, seed: int) -> np.ndarray:
    """Bootstrap distribution (reps,) of the grand mean of ``matrix`` (seeds x items): seeds resampled, then
    items; one item draw per replicate is shared by every seed (the seeds saw the same test items)."""
    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2 or 0 in m.shape:
        raise ValueError(f"bootstrap: expected a non-empty seeds x items matrix, got shape {m.shape}")
    rng = np.random.default_rng(seed)
    seed_w = _weights(rng, m.shape[0], reps)  # (reps, S)
    item_w = _weights(rng, m.shape[1], reps)  # (reps, N)
    # a weighted mean lies within the values' range; the clip only removes float rounding (1 + 1e-16)
    return np.clip(((seed_w @ m) * item_w).sum(axis=1), m.min(), m.max())


def _summary(estimate: float, boots: np.ndarray, level: float) -> dict[str, float]:
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    # two-sided bootstrap p-value of "no difference" (mean 0), floored at 1 / (reps + 1)
    tail = min(float((boots <= 0).mean()), float((boots >= 0).mean()))
    p = min(1.0, max(2 * tail, 1.0 / (len(boots) + 1)))
    return {"estimate": float(estimate), "ci_lo": float(lo), "ci_hi": float(hi), "p": p}


def hierarchical_mean(matrix: np.ndarray, reps: int, seed: int, level: float = 0.95) -> dict[str, float]:
    """Mean accuracy of a seeds x items 0/1 matrix with its hierarchical-bootstrap percentile interval."""
    m = np.asarray(matrix, dtype=float)
    out = _summary(m.mean(), bootstrap_means(m, reps, seed), level)
    del out["p"]  # a p-value of "accuracy = 0" means nothing
    return {**out, "seeds": int(m.shape[0]), "items": int(m.shape[1])}


def paired_difference(a: np.ndarray, b: np.ndarray, reps: int, seed: int, level: float = 0.95) -> dict:
    """Item-paired difference mean(a) - mean(b) of two seeds x items matrices (row i of both = seed i,
    column j of both = test item j) with its hierarchical-bootstrap interval and two-sided p-value.

    Also returns ``seed_sd``: the sd (ddof=1) of the per-seed differences, used to size more seeds."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired difference: shapes differ {a.shape} vs {b.shape} (pair seeds and items first)")
    d = a - b
    out = _summary(d.mean(), bootstrap_means(d, reps, seed), level)
    per_seed = d.mean(axis=1)
    sd = float(per_seed.std(ddof=1)) if len(per_seed) > 1 else math.nan
    return {**out, "seeds": int(d.shape[0]), "items": int(d.shape[1]), "seed_sd": sd}


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (same order as given; NaN stays NaN and is not counted)."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    m = len(order)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def equivalent(lo: float, hi: float, margin: float) -> bool:
    """"No effect": the whole interval lies within +-margin."""
    return -margin <= lo and hi <= margin


def seeds_needed(n: int, lo: float, hi: float, estimate: float, margin: float) -> int:
    """Seeds for a decisive interval, assuming its half-width shrinks as 1/sqrt(seeds) (seed-dominated).

    Decisive means either excluding 0 (half-width < |estimate|) or lying within +-margin (half-width <
    margin - |estimate|); the easier of the two is the target. Always at least n + 1."""
    half = (hi - lo) / 2
    target = max(abs(estimate), margin - abs(estimate))
    if not half > 0 or not target > 0 or n < 1:
        return n + 1
    return max(n + 1, math.ceil(n * (half / target) ** 2))


def verdict(lo: float, hi: float, p_holm: float, expect: str, margin: float, alpha: float) -> str:
    """held / failed / equivalent / underpowered for a difference predicted to be ``expect`` ("+", "0", "<=").

    "+": held when Holm-significant and above 0, failed when significant below 0, equivalent when the
    interval lies within +-margin (a tight null: no effect), else underpowered.
    "0" (no effect predicted): held when equivalent, failed when significant and outside the margin.
    "<=" (at most the reference): held when the CI ends below +margin, failed when it starts above it."""
    sig = p_holm < alpha
    if expect == "<=":  # at most a reference (a shortcut floor): held while the CI stays below it + margin
        if hi <= margin:
            return "held"
        return "failed" if sig and lo > margin else "underpowered"
    if expect == "0":
        if equivalent(lo, hi, margin):
            return "held"
        return "failed" if sig and (lo > margin or hi < -margin) else "underpowered"
    if equivalent(lo, hi, margin):
        return "equivalent"
    if sig and lo > 0:
        return "held"
    if sig and hi < 0:
        return "failed"
    return "underpowered"
