"""Pure statistics for the report: proportion intervals, seed-level t inference, TOST, Holm, power.

Conventions (stated in the report and in docs/methods.md):

- one proportion (an accuracy on n items, a share of seeds): Wilson (scipy ``binomtest(...).proportion_ci``);
- "k of n seeds reached the threshold": Clopper-Pearson exact (same scipy call, ``method="exact"``);
- the seed is the unit of replication: every seed saw the same fixed test items, so a mean over seeds or a
  paired difference gets a t interval on the per-seed means (one number per seed; twin pairs averaged first);
  with one seed there is no interval (NaN), never a narrow one;
- "no effect": TOST on the per-seed differences (statsmodels ``ttost_paired``) against a stated margin;
- a family of decisions: Holm (statsmodels ``multipletests``); t and TOST p-values are continuous, so no p
  floor exists that the family's size could push over alpha;
- seeds needed: statsmodels ``TTestPower`` at the row's Holm-adjusted alpha, from the per-seed sd scaled to a
  median-unbiased variance (:func:`pilot_sd`: a 3-seed sd is below the true one more often than not);
- the item bootstrap survives only as a within-seed precision figure (items resampled, seeds kept).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

from pipeline.report.sequential import look_levels


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


def counts_p(k_a: int, k_b: int, n: int) -> float:
    """Fisher's exact two-sided p that two arms of ``n`` seeds each learn equally often, given ``k_a`` and ``k_b``
    seeds that did: a test on seeds that learn or stay at chance which, unlike a t test, assumes nothing about
    their spread (3 of 3 against 0 of 3: 0.10)."""
    return float(stats.fisher_exact([[k_a, n - k_a], [k_b, n - k_b]]).pvalue)


# --------------------------------------------------------------------------- per-seed means
def unit_matrix(matrix: np.ndarray, units: np.ndarray | None = None) -> np.ndarray:
    """``(..., seeds, items)`` -> ``(..., seeds, units)``: the items of a unit (e.g. a twin pair) averaged, so
    a unit counts once; without ``units`` every item is its own unit."""
    m = np.asarray(matrix, dtype=float)
    if units is None:
        return m
    _, inverse, counts = np.unique(np.asarray(units), return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.add.reduceat(m[..., order], starts, axis=-1) / counts


def unit_means(matrix: np.ndarray, units: np.ndarray | None = None) -> np.ndarray:
    """Per-seed mean over units (twin pairs averaged first) of ``(..., seeds, items)``."""
    return unit_matrix(matrix, units).mean(axis=-1)


def t_bounds(x: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided t interval of the mean over the last axis (the seeds); NaN with fewer than two seeds.
    Vectorised over leading axes (the coverage test runs thousands of simulated studies at once)."""
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    mean = x.mean(axis=-1)
    if n < 2:
        nan = np.full_like(mean, np.nan)
        return nan, nan
    half = stats.t.ppf((1 + level) / 2, n - 1) * x.std(axis=-1, ddof=1) / math.sqrt(n)
    return mean - half, mean + half


def _t_p(x: np.ndarray, null: float, alternative: str) -> float:
    """t-test p of mean(x) vs ``null``; zero spread over >= 2 seeds decides by the side the mean is on
    (scipy gives inf or 0/0 there), a mean exactly on the null is not rejected."""
    if len(x) < 2:
        return math.nan
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_1samp(x, null, alternative=alternative).pvalue)
    return 1.0 if p != p else p


def seed_interval(per_seed, level: float = 0.95, bounds: tuple[float, float] = (-1.0, 1.0)) -> dict:
    """Mean of per-seed values with its seed-level t interval (clipped to ``bounds``: an accuracy cannot
    leave [0, 1], a difference [-1, 1]) and the seeds' sd (ddof=1); NaN interval and sd for one seed."""
    x = np.asarray(per_seed, dtype=float)
    lo, hi = t_bounds(x, level)
    sd = float(x.std(ddof=1)) if len(x) > 1 else math.nan
    return {"estimate": float(x.mean()), "ci_lo": float(np.clip(lo, *bounds)), "ci_hi": float(np.clip(hi, *bounds)),
            "sd": sd, "seeds": len(x)}


def paired_seeds(a: np.ndarray, b: np.ndarray, units: np.ndarray | None = None, level: float = 0.95) -> dict:
    """Item-paired difference of two seeds x items matrices (row i = seed i, column j = item j in both): per
    seed the mean of a and of b (units averaged first), then the seed-level t interval and two-sided p of
    their difference. ``mean_a``/``mean_b`` (per seed) feed TOST; ``sd`` sizes more seeds."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired difference: shapes differ {a.shape} vs {b.shape} (pair seeds and items first)")
    ma, mb = unit_means(a, units), unit_means(b, units)
    d = ma - mb
    out = seed_interval(d, level)
    return {**out, "p": _t_p(d, 0.0, "two-sided"), "items": int(a.shape[1]), "mean_a": ma, "mean_b": mb}


def one_sided_p(x, null: float, alternative: str) -> float:
    """One-sided seed-level t p of mean(x) ``alternative`` ("less"/"greater") ``null``."""
    return _t_p(np.asarray(x, dtype=float), null, alternative)


def tost(mean_a, mean_b, margin: float) -> float:
    """TOST p of "|mean(a - b)| < margin" on per-seed means (statsmodels ``ttost_paired``); NaN for one seed,
    and a difference with zero spread is decided by whether it lies strictly inside the margin."""
    a, b = np.asarray(mean_a, dtype=float), np.asarray(mean_b, dtype=float)
    if len(a) < 2:
        return math.nan
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(ttost_paired(a, b, -margin, margin)[0])
    return 1.0 if p != p else p


def item_precision(a: np.ndarray, b: np.ndarray | None, reps: int, seed: int,
                   units: np.ndarray | None = None) -> float:
    """Within-seed precision: the bootstrap sd of a seed's mean (of a - b) over resampled test items (units),
    root-mean-square over seeds. One draw per replicate is shared by the seeds; the seeds are not resampled,
    so this is the test set's contribution only, not the row's interval."""
    d = unit_matrix(np.asarray(a, dtype=float) - (0.0 if b is None else np.asarray(b, dtype=float)), units)
    rng = np.random.default_rng(seed)
    n = d.shape[1]
    weights = rng.multinomial(n, np.full(n, 1 / n), size=reps) / n  # (reps, units): a resample as counts / n
    boots = weights @ d.T  # (reps, seeds)
    return float(np.sqrt((boots.std(axis=0, ddof=1) ** 2).mean()))


# --------------------------------------------------------------------------- one family
def holm(pvalues, alpha: float = 0.05) -> np.ndarray:
    """Holm's step-down adjusted p-values (statsmodels ``multipletests``), same order as given; NaN stays NaN
    and is not counted in the family."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = multipletests(p[ok], alpha=alpha, method="holm")[1]
    return out


def holm_levels(pvalues, alpha: float) -> np.ndarray:
    """The per-test level Holm compares each p with: alpha / (m - rank), rank 0 for the smallest p (the
    level at which a seeds-needed calculation must aim); NaN where p is NaN."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    out[order] = alpha / (len(order) - np.arange(len(order)))
    return out


def pilot_sd(sd: float, seeds: int) -> float:
    """The per-seed sd scaled so its square is median-unbiased for the variance: s * sqrt(df / chi2_0.5(df)),
    df = seeds - 1. A pilot's s^2 is below the true variance more often than not (at 3 seeds with probability
    1 - e^-0.69 = 0.5 below 0.69 x the truth), so a power calculation from it under-asks; the factor is 1.20 at
    3 seeds, 1.04 at 10, and tends to 1. With fewer than 2 seeds there is no sd (NaN)."""
    if seeds < 2 or sd != sd:
        return math.nan
    df = seeds - 1
    return sd * math.sqrt(df / stats.chi2.ppf(0.5, df))


def seeds_for_power(effect: float, sd: float, alpha: float, power: float = 0.8, cap: int = 200) -> int | None:
    """Seeds for a one-sided paired t test of a true effect ``effect`` (> 0, in the tested direction) with
    per-seed sd ``sd`` at level ``alpha`` to reach ``power`` (statsmodels ``TTestPower``); None when no
    number of seeds up to ``cap`` does it (no effect in that direction, or too small), or sd is unknown."""
    if not (effect > 0 and sd == sd and alpha == alpha):
        return None
    if sd == 0:
        return 2  # no spread: two seeds estimate it (the fewest a t test takes)
    es = effect / sd
    solver = TTestPower()
    at_cap = solver.power(es, cap, alpha, alternative="larger")
    if at_cap != at_cap:  # an sd that is zero but for rounding: the noncentral t overflows; as sd == 0
        return 2
    if at_cap < power:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        n = float(np.atleast_1d(solver.solve_power(effect_size=es, alpha=alpha, power=power,
                                                     alternative="larger"))[0])
    if not math.isfinite(n):  # the root finder fails to bracket where very few seeds suffice: count up instead
        return next((k for k in range(2, cap + 1) if solver.power(es, k, alpha, alternative="larger") >= power), cap)
    return max(2, math.ceil(n))


def detectable_effect(sd: float, seeds: int, alpha: float, power: float = 0.8) -> float:
    """The smallest true effect a one-sided t test at ``alpha`` on ``seeds`` seeds of per-seed sd ``sd`` detects
    with ``power`` (statsmodels ``TTestPower``); NaN with fewer than two seeds or no sd."""
    if seeds < 2 or not sd == sd or not alpha == alpha:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        es = TTestPower().solve_power(nobs=seeds, alpha=alpha, power=power, alternative="larger")
    return float(np.atleast_1d(es)[0]) * sd


def seeds_for_tost(estimate: float, margin: float, sd: float, alpha: float, power: float = 0.8,
                   cap: int = 200) -> int | None:
    """Seeds for TOST within +-margin to reach ``power`` when the true difference is ``estimate``: the nearer
    bound decides, so the one-sided test against it (effect margin - |estimate|); at an estimate of 0 both
    bounds bind equally, so each side is sized for power 1 - (1 - power) / 2 (the usual approximation)."""
    gap = margin - abs(estimate)
    each = 1 - (1 - power) / 2 if abs(estimate) < 1e-12 else power
    return seeds_for_power(gap, sd, alpha, each, cap)


def seed_accuracy(per_seed, level: float) -> dict:
    """Mean accuracy over seeds with its seed-level t interval (clipped to [0, 1]); NaN interval for one seed."""
    b = seed_interval(per_seed, level, bounds=(0.0, 1.0))
    return {"mean": b["estimate"], "ci_lo": b["ci_lo"], "ci_hi": b["ci_hi"]}


# ---------------------------------------------------------------- the levels of the sequential looks (plan stage)
def second_look(params) -> bool:
    """A second look exists when ``plan.max_seeds`` exceeds the first look's seed count."""
    return params.plan.max_seeds > len(params.train.seeds)


def look_alphas(params) -> tuple[float, float]:
    """(alpha_1, alpha_2): each look's Holm family level, ``1 - report.confidence`` spent linearly in the first
    look's share of ``plan.max_seeds`` (:func:`pipeline.report.sequential.look_levels`); no second look: (alpha, 0)."""
    cap = params.plan.max_seeds if second_look(params) else len(params.train.seeds)
    return look_levels(1 - params.report.confidence, len(params.train.seeds), cap)


def look_alpha(params) -> float:
    """The first look's level (the plan sizes rows at it)."""
    return look_alphas(params)[0]
