"""The two-look design's error control: the combination test and a simulation of the whole procedure.

The rule (docs/methods.md, "Error rates"): look 1 is one Holm family at alpha_1 over every decision test of every
decided row; look 2 is one Holm family at alpha_2 over the same members, where a row the plan continued is tested
on a pre-specified inverse-normal combination of its look-1 one-sided p and the one-sided p of its **new seeds
only** (weights sqrt(n1 / N) and sqrt(1 - n1 / N), n1 = the first look's seeds, N = ``plan.max_seeds``), and a row
not continued has p = 1. alpha_1 + alpha_2 = alpha, alpha_1 = alpha x n1 / N (linear spending in the information
fraction). Why it holds: the new seeds are independent of look 1, so under a row's null the combined p is
uniform whatever look 1 saw and however many seeds it bought (the weights are fixed before any data); the
non-continued rows' p = 1 is super-uniform too; so each look's Holm family is valid at its level *with* the
selection, and the union bound gives alpha over both. The previous rule (Holm at alpha / 2 over only the continued
rows, on all their seeds) is neither: the family was chosen by look 1 and reused its seeds.

:func:`simulate` replays either rule on normal per-seed differences (rows given by their expect, per-seed sd, margin,
smallest effect of interest and true difference), with the plan's continuation rule (an undecided row continues
when the seeds for ``power`` at its look-1 Holm level fit the cap; sized for its ``sesoi`` under the rules in
force, for the observed estimate under the previous one) -- vectorised over studies. With ``escape`` it replays them
on seeds that learn or stay at chance instead, the null under which the t test's normal model fails (both arms of a
row one bimodal distribution: a seed learns with probability ``escape``).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

# ``simulate(escape=...)``: a seed's accuracy when it learns and when it stays at chance, and its spread within
# either (the committed study's arrangement cells: vit_sincos seeds 0.985-0.989, vit at 0.500 in every seed)
LEARNED, CHANCE, WITHIN_SD = 0.98, 0.5, 0.004


def look_levels(alpha: float, first: int, cap: int) -> tuple[float, float]:
    """(alpha_1, alpha_2): linear spending in the information fraction n1 / N; no second look: (alpha, 0)."""
    if cap <= first:
        return alpha, 0.0
    a1 = alpha * first / cap
    return a1, alpha - a1


def weights(first: int, cap: int) -> tuple[float, float]:
    """The inverse-normal weights, fixed by the planned seed counts (first look n1 of N), not by what look 1 saw."""
    w1 = np.sqrt(first / cap)
    return float(w1), float(np.sqrt(1 - first / cap))


def combine(p1, p2, w: tuple[float, float]):
    """Inverse-normal combination of two one-sided p-values of the same direction: 1 - Phi(w1 z1 + w2 z2)."""
    with np.errstate(invalid="ignore"):
        z = w[0] * stats.norm.isf(np.asarray(p1, dtype=float)) + w[1] * stats.norm.isf(np.asarray(p2, dtype=float))
    return np.where(np.isnan(z), 1.0, stats.norm.sf(z))  # 0 on one look, 1 on the other: not rejected


def one_sided(mean, sd, n, null, side: str):
    """One-sided t p of ``mean`` vs ``null`` from summary statistics (``side`` "greater"/"less"): the same number
    as scipy's ``ttest_1samp`` on the seeds; zero spread decides by the side the mean is on, on the null p = 1."""
    mean, sd, n = (np.asarray(v, dtype=float) for v in (mean, sd, n))
    diff = (mean - null) if side == "greater" else (null - mean)
    with np.errstate(all="ignore"):
        t = diff / (sd / np.sqrt(n))
        p = stats.t.sf(t, n - 1)
    p = np.where(sd > 0, p, np.where(diff > 0, 0.0, 1.0))
    return np.where(n >= 2, p, np.nan)


def members(mean, sd, n, margin):
    """The ledger's decision p-values from summary statistics: the two-sided directional p, TOST and the
    non-equivalence p (``p_out``), each from one-sided pieces (dict of arrays)."""
    return pieces_to_members(pieces(mean, sd, n, margin))


def pieces(mean, sd, n, margin) -> dict:
    """The five one-sided p-values the members are made of: > 0, < 0, > -margin, < +margin, > +margin, < -margin."""
    return {"g0": one_sided(mean, sd, n, 0.0, "greater"), "l0": one_sided(mean, sd, n, 0.0, "less"),
            "g_lo": one_sided(mean, sd, n, -margin, "greater"), "l_hi": one_sided(mean, sd, n, margin, "less"),
            "g_hi": one_sided(mean, sd, n, margin, "greater"), "l_lo": one_sided(mean, sd, n, -margin, "less")}


def pieces_to_members(pc: dict) -> dict:
    return {"p": np.minimum(1.0, 2 * np.minimum(pc["g0"], pc["l0"])), "p_tost": np.maximum(pc["g_lo"], pc["l_hi"]),
            "p_out": np.minimum(1.0, 2 * np.minimum(pc["g_hi"], pc["l_lo"])), "up": pc["g0"] < pc["l0"]}


def combined_members(first: dict, new: dict, w: tuple[float, float]) -> dict:
    """Members from look-1 and new-seed-only one-sided pieces combined side by side."""
    return pieces_to_members({k: combine(first[k], new[k], w) for k in first})


# --------------------------------------------------------------------------- vectorised study simulation
def holm_adjusted(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values along the last axis (NaN counts as 1: never rejected, still in the family)."""
    p = np.where(np.isnan(p), 1.0, p)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ps = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    adj = np.minimum(1.0, np.maximum.accumulate(ps, axis=-1))
    out = np.empty_like(adj)
    np.put_along_axis(out, order, adj, axis=-1)
    return out


def _levels(p: np.ndarray, alpha: float) -> np.ndarray:
    """Holm's per-test level alpha / (m - rank) along the last axis."""
    m = p.shape[-1]
    rank = np.argsort(np.argsort(np.where(np.isnan(p), 1.0, p), axis=-1), axis=-1)
    return alpha / (m - rank)


def _verdicts(mem: dict, adj: dict, zero: np.ndarray, alpha: float) -> np.ndarray:
    """0 undecided, 1 held, 2 failed, 3 equivalent (a "+" row), as the ledger's ``_verdict``."""
    plus = np.where(adj["p"] < alpha, np.where(mem["up"], 1, 2), np.where(adj["p_tost"] < alpha, 3, 0))
    eq = np.where(adj["p_tost"] < alpha, 1, np.where(adj["p_out"] < alpha, 2, 0))
    return np.where(zero, eq, plus)


def _family(mem: dict, zero: np.ndarray, alpha: float) -> tuple[dict, np.ndarray]:
    """Holm over each row's two members (p and p_tost for "+", p_tost and p_out for "0"): adjusted p per member
    and the level of the row's own test (p for "+", p_tost for "0")."""
    first = np.where(zero, mem["p_tost"], mem["p"])
    second = np.where(zero, mem["p_out"], mem["p_tost"])
    both = np.concatenate([first, second], axis=-1)
    adj, lev = holm_adjusted(both), _levels(both, alpha)
    r = first.shape[-1]
    a1, a2 = adj[..., :r], adj[..., r:]
    out = {"p": np.where(zero, np.nan, a1), "p_tost": np.where(zero, a1, a2), "p_out": np.where(zero, a2, np.nan)}
    return out, lev[..., :r]


def _needed(mean, sd, n, margin, zero, level, power: float, cap: int, sesoi=None) -> np.ndarray:
    """The plan's seeds for ``power`` (the ledger's ``_needed``: pilot sd, one-sided at level / 2 for "+", TOST at
    the level for "0"), the first n in 2..cap that reaches it; cap + 1 when none does. With ``sesoi`` (the rule in
    force) a "+" row is sized for it and a "0" row for a true 0 inside its margin; without it (the previous rule)
    for the observed estimate."""
    df = np.maximum(n - 1, 1)
    pilot = sd * np.sqrt(df / stats.chi2.ppf(0.5, df))
    alpha = np.where(zero, level, level / 2)
    if sesoi is None:
        effect = np.where(zero, margin - np.abs(mean), mean)
        target = power  # an estimate is never exactly 0 here, where the ledger asks 1 - (1 - power) / 2
    else:
        effect = np.broadcast_to(np.where(zero, margin, sesoi), mean.shape)
        target = np.where(zero, 1 - (1 - power) / 2, power)
    out = np.full(mean.shape, cap + 1)
    with np.errstate(all="ignore"):
        es = effect / pilot
        for k in range(cap, 1, -1):
            pw = stats.nct.sf(stats.t.isf(alpha, k - 1), k - 1, es * np.sqrt(k))
            out = np.where((effect > 0) & (pw >= target), k, out)
    return out


def _summary(x: np.ndarray, lo, hi):
    """Mean, sd (ddof 1) and n of seeds [lo, hi) along the last axis, per (study, row) bounds."""
    idx = np.arange(x.shape[-1])
    mask = (idx >= np.asarray(lo)[..., None]) & (idx < np.asarray(hi)[..., None])
    n = mask.sum(-1)
    with np.errstate(all="ignore"):
        mean = (x * mask).sum(-1) / n
        sd = np.sqrt(((x - mean[..., None]) ** 2 * mask).sum(-1) / (n - 1))
    return mean, sd, n


def simulate(rows: list[dict], rule: str, studies: int, seed: int, alpha: float = 0.05, first: int = 3,
             cap: int = 15, power: float = 0.8, escape: float | None = None) -> dict:
    """Replay the two-look procedure on ``studies`` simulated studies. ``rows``: dicts with expect ("+"/"0"),
    sd, margin and the true difference ``true``. ``rule``: "union" (the previous rule: Holm at alpha / 2 per look,
    look 2 over the continued rows only, on all their seeds), "combination" (this module's rule), "new_only"
    (valid too: look 2 on the new seeds alone, Holm over the continued rows only, at alpha_2) or "single" (one look
    at alpha, no continuation: the reference). Returns per-row verdict shares and the share of studies
    with any wrong decision (a "+" row at 0 held or failed, a "0" row at its margin held or failed). ``escape``:
    every row's two arms instead draw each seed's accuracy from one bimodal distribution (:data:`LEARNED` with
    probability ``escape``, else :data:`CHANCE`; :data:`WITHIN_SD` within either), so every row's true difference
    is 0 and its ``sd`` and ``true`` are not used."""
    rng = np.random.default_rng(seed)
    zero = np.array([r["expect"] == "0" for r in rows])
    sd = np.array([r["sd"] for r in rows], dtype=float)
    margin = np.array([r["margin"] for r in rows], dtype=float)
    true = np.array([r["true"] for r in rows], dtype=float)
    sesoi = np.array([r.get("sesoi", r["margin"]) for r in rows], dtype=float)
    if escape is None:
        x = true[:, None] + sd[:, None] * rng.standard_normal((studies, len(rows), cap))
    else:
        shape = (2, studies, len(rows), cap)
        arms = np.where(rng.random(shape) < escape, LEARNED, CHANCE) + WITHIN_SD * rng.standard_normal(shape)
        x, true = arms[0] - arms[1], np.zeros(len(rows))
    shape = (studies, len(rows))
    m1, s1, n1 = _summary(x, np.zeros(shape, int), np.full(shape, first))
    a1 = alpha if rule == "single" else alpha / 2 if rule == "union" else look_levels(alpha, first, cap)[0]
    p1 = pieces(m1, s1, n1, margin)
    mem1 = pieces_to_members(p1)
    adj1, lev1 = _family(mem1, zero, a1)
    v = _verdicts(mem1, adj1, zero, a1)
    if rule != "single":
        needed = _needed(m1, s1, n1, margin, zero, lev1, power, cap, None if rule == "union" else sesoi)
        cont = (v == 0) & (needed <= cap)
        total = np.maximum(needed, first + (1 if rule == "union" else 2))  # the new rules test >= 2 new seeds alone
        if rule in ("union", "new_only"):  # look 2's family: the continued rows only
            lo = np.zeros(shape, int) if rule == "union" else np.full(shape, first)
            m2, s2, n2 = _summary(x, lo, total)
            mem2 = pieces_to_members(pieces(m2, s2, n2, margin))
            a2 = alpha / 2 if rule == "union" else look_levels(alpha, first, cap)[1]
            adj2 = _holm_over(mem2, zero, cont, a2)
        else:
            m2, s2, n2 = _summary(x, np.full(shape, first), total)
            mem2 = combined_members(p1, pieces(m2, s2, n2, margin), weights(first, cap))
            for k in ("p", "p_tost", "p_out"):  # every row stays in the family; not continued: p = 1
                mem2[k] = np.where(cont, mem2[k], 1.0)
            a2 = look_levels(alpha, first, cap)[1]
            adj2, _ = _family(mem2, zero, a2)
        v = np.where(cont, _verdicts(mem2, adj2, zero, a2), v)
    wrong = np.where(true == np.where(zero, margin, 0.0), (v == 1) | (v == 2), False)
    fw = wrong.any(axis=1)
    share = {name: (v == code).mean(axis=0) for code, name in enumerate(("undecided", "held", "failed", "equivalent"))}
    return {"fwer": float(fw.mean()), "fwer_ci": wilson_ci(int(fw.sum()), studies), "studies": studies, **share}


def _holm_over(mem: dict, zero: np.ndarray, keep: np.ndarray, alpha: float) -> dict:
    """Holm within each study over the kept rows' members only (the previous rule's look-2 family), via dropping
    the others: NaN members are set to 1 and the family size counts only kept members."""
    first = np.where(zero, mem["p_tost"], mem["p"])
    second = np.where(zero, mem["p_out"], mem["p_tost"])
    both = np.concatenate([first, second], axis=-1)
    k = np.concatenate([keep, keep], axis=-1)
    p = np.where(k, both, np.inf)
    order = np.argsort(p, axis=-1)
    ps = np.take_along_axis(p, order, axis=-1)
    m = k.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        scaled = np.where(np.isfinite(ps), ps * (m - np.arange(p.shape[-1])), 1.0)
    adj = np.minimum(1.0, np.maximum.accumulate(scaled, axis=-1))
    out = np.empty_like(adj)
    np.put_along_axis(out, order, adj, axis=-1)
    r = keep.shape[-1]
    a1, a2 = out[..., :r], out[..., r:]
    return {"p": np.where(zero, np.nan, a1), "p_tost": np.where(zero, a1, a2), "p_out": np.where(zero, a2, np.nan)}


def wilson_ci(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)
