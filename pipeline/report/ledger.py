"""The prediction ledger: minimal-pair contrasts, shortcut floors and exact checks, each decided.

What is predicted is data (:mod:`.contrasts`), fixed before any accuracy is read; a row exists only when both of
its arms are configured in params. Every row is measured (:mod:`.measure`) and gated (:mod:`.gate`) on
item-level results; this module decides and orders them:

- ``paired``: ``a - b`` on the same test items with the same seeds: per seed the difference of mean accuracy
  (twin pairs averaged first), then a seed-level paired t interval, a directional t test and TOST against the
  row's margin; decided only when both arms learned in distribution, are not both at the ceiling or at
  chance on the compared slice, and the arm its estimate favours clears that slice's shortcut floor by the margin
  (:func:`pipeline.report.gate.gate`), else "uninformative" with the reason in words;
- ``floor``: ``a - floor`` where floor = the strongest shortcut baseline on the row's slice
  (data/shortcuts/<task>/floors.json),
  judged against the floor's upper bound (Wilson on its n items, or the analytic bound where higher): a
  structural limit predicts "at the shortcut floor", not "chance" (every readout here sums per-token terms);
- ``exact``: algebra judged exactly, not by an interval (vit_nopos: twin logits equal, so accuracy on complete
  twin pairs is exactly 0.5).

One Holm family holds every decision test of the decided rows (:func:`family`); each row ends held / failed /
equivalent / uninformative / inconclusive (with the seeds needed for the target power) -- or "not run" when
its runs are missing.
"""

from __future__ import annotations

import math
from datetime import datetime

import pandas as pd

from pipeline.report import aggregate as agg
from pipeline.report import cells, sequential, stats
from pipeline.report.contrasts import CONTRASTS, budget_rows, check_margins, plan
from pipeline.report.gate import gate
from pipeline.report.measure import collision_rows, measure

# held: the predicted direction, significant; failed: significant the other way (a "+" or "<=" row); not
# equivalent: a "0" row's interval outside its margin (significant); equivalent: TOST within the margin (a "+" row;
# a "0" row's TOST is its "held"); inconclusive: none of these, with the smallest effect it could have detected.
VERDICTS = ("held", "failed", "not equivalent", "equivalent", "uninformative", "inconclusive", "not run")
# The README's findings, in this order (at most five are shown).
FINDINGS = ("alignment", "arrangement", "relation", "distillation", "natural", "scale", "budget", "collisions",
            "floors")


def budget_context(reach: pd.DataFrame, row: dict, config: dict) -> str:
    """"<steps> steps: step N (k of n seeds)" or "not reached", for both arms of a budget row."""
    parts = []
    for steps in (config["steps"], row["a_cfg"]["steps"]):
        sub = reach[(reach.task == row["task"]) & (reach.arch == row["a"]) & (reach.steps == steps)
                    & (reach.data_seed == 0) & (reach.train_size == config["train_size"])]
        if len(sub):
            parts.append(f"{int(steps)} steps: {sub.reached.iloc[0]}")
    return "; ".join(parts)


def family(t: pd.DataFrame) -> pd.DataFrame:
    """Every decision test of the decided rows, one line each (row position, member, p): a "+" row's
    directional two-sided t (held or failed) and its TOST (equivalent); a "0" row's TOST (held) and its
    non-equivalence test (failed); a "<=" row's directional t against the floor's bound (held or failed)."""
    members = {"+": ("p", "p_tost"), "0": ("p_tost", "p_out"), "<=": ("p",)}
    lines = [(i, col, r[col]) for i, r in enumerate(t.to_dict("records")) if r["decided"]
             for col in members.get(r["expect"], ())]
    return pd.DataFrame(lines, columns=["row", "member", "p"])


def _needed(r: dict, level: float, margin: float, rp) -> int | None:
    """Seeds for rp.power at the row's Holm level for its smallest effect of interest (``sesoi``, never the
    observed estimate: a power calculation from the estimate only restates the p-value): one-sided at level / 2
    for "+" and "<=" (the directional t is two-sided); TOST within the margin at the level for "0", sized for a
    true difference of 0. The sd is the row's per-seed sd made median-unbiased (:func:`stats.pilot_sd`)."""
    cap, sd = rp.max_seeds, stats.pilot_sd(r["seed_sd"], int(r["seeds"]))
    if r["expect"] == "0":
        return stats.seeds_for_tost(0.0, margin, sd, level, rp.power, cap)
    return stats.seeds_for_power(r["sesoi"], sd, level / 2, rp.power, cap)


def _detectable(r: dict, level: float, rp) -> float:
    """The smallest true effect the row had rp.power to detect at its seeds and Holm level (one-sided at level / 2
    for "+" and "<="; for "0" the smallest margin TOST would show a true 0 inside)."""
    sd = stats.pilot_sd(r["seed_sd"], int(r["seeds"]))
    if r["expect"] == "0":
        return stats.detectable_effect(sd, int(r["seeds"]), level, 1 - (1 - rp.power) / 2)
    return stats.detectable_effect(sd, int(r["seeds"]), level / 2, rp.power)


def _verdict(r: dict, alpha: float) -> str:
    """held / failed / not equivalent / equivalent / inconclusive from the row's Holm-adjusted p-values (see
    :func:`family`)."""
    if r["expect"] == "0":
        return "held" if r["p_tost_holm"] < alpha else "not equivalent" if r["p_out_holm"] < alpha else "inconclusive"
    if r["p_holm"] < alpha:
        above = r["estimate"] > 0 if r["expect"] == "+" else r["acc_a"] > r["floor_bound"]
        return ("failed" if above else "held") if r["expect"] == "<=" else ("held" if above else "failed")
    return "equivalent" if r["expect"] == "+" and r["p_tost_holm"] < alpha else "inconclusive"


def _needs_text(verdict: str, needed: int | None, seeds: int, cap: int) -> str:
    if verdict != "inconclusive":
        return ""
    if seeds < 2:
        return "2+ (one seed: no seed-level variance to size from)"
    return str(needed) if needed is not None else f">{cap}"


def decide(table: pd.DataFrame, rp, alpha: float | None = None) -> pd.DataFrame:
    """One Holm family at ``alpha`` (default ``1 - rp.confidence``) over every decision test of the decided rows
    (those that ran, are not exact and have no gate ``reason``), each row's verdict and, if inconclusive, the
    seeds needed for rp.power at its Holm level (``needs_seeds`` as text: capped at ">max_seeds"; a one-seed row
    has no variance to size from)."""
    alpha = 1 - rp.confidence if alpha is None else alpha
    if table.empty:
        return table.assign(p_holm=[], p_tost_holm=[], p_out_holm=[], verdict=[], seeds_needed=[], detectable=[],
                            needs_seeds=[])
    t = table.copy().reset_index(drop=True)
    t["decided"] = (t.seeds > 0) & (t.kind != "exact") & (t.reason == "")
    fam = family(t)
    fam["holm"] = stats.holm(fam.p.to_numpy(dtype=float), alpha)
    fam["level"] = stats.holm_levels(fam.p.to_numpy(dtype=float), alpha)
    adjusted = fam.pivot_table(index="row", columns="member", values="holm", aggfunc="first")
    levels = fam.pivot_table(index="row", columns="member", values="level", aggfunc="first")
    for col in ("p", "p_tost", "p_out"):
        t[f"{col}_holm"] = adjusted[col].reindex(t.index) if col in adjusted else math.nan
    t["p_holm"] = t["p_holm"].where(t.expect != "0", t["p_tost_holm"])  # the prediction's own test
    verdicts, needed, detectable = [], [], []
    for i, r in enumerate(t.to_dict("records")):
        if r["seeds"] == 0:
            v = "not run"
        elif r["kind"] == "exact":
            v = "held" if r["exact"] else "failed"
        elif r["reason"]:
            v = "uninformative"
        else:
            v = _verdict(r, alpha)
        member = "p_tost" if r["expect"] == "0" else "p"
        level = levels[member].get(i, math.nan) if member in levels else math.nan
        needed.append(_needed(r, level, r["margin"], rp) if v == "inconclusive" else None)
        detectable.append(_detectable(r, level, rp) if v == "inconclusive" else math.nan)
        verdicts.append(v)
    t["verdict"] = verdicts
    t["seeds_needed"] = pd.array(needed, dtype="Int64")
    t["detectable"] = detectable
    t["needs_seeds"] = [_needs_text(v, n, seeds, rp.max_seeds)
                        for v, n, seeds in zip(verdicts, needed, t.seeds, strict=True)]
    return t.drop(columns=["decided"])


COLUMNS = ["id", "label", "finding", "kind", "task", "a", "b", "subset", "expect", "isolates", "margin",
           "margin_reason", "sesoi", "registered", "registration", "seeds", "items", "estimate", "ci_lo", "ci_hi",
           "ci_method", "p", "p_tost", "p_out", "seed_sd", "item_se", "acc_a", "acc_b", "speed_a", "speed_b", "in_a",
           "in_b", "learned_a", "learned_b",
           "learn_at", "chance", "floor", "floor_baseline", "floor_lo", "floor_hi", "analytic_floor", "floor_bound",
           "beside_floor", "beside_baseline", "reason", "exact", "max_logit_diff", "context", "claim", "detail"]


def judge(params, runs: pd.DataFrame, items: cells.Items, floors: dict, disagreement: dict,
          seed: int, collisions: pd.DataFrame | None = None, seed_plan: dict | None = None,
          transfer_rates: dict | None = None) -> pd.DataFrame:
    """The ledger: one row per planned prediction with its measurement, gate, Holm p-values and verdict.

    Look 1 judges every row on ``train.seeds``; with a ``seed_plan`` (the ``plan`` stage's, :mod:`.seeds`), look 2
    judges the rows it continued, and replaces their look-1 line (column ``look``). Look 1 is one Holm family at
    alpha_1 over every row; look 2 one at alpha_2 over every row too (:func:`pipeline.report.stats.look_alphas`),
    a continued row tested on the combination of look 1 and its new seeds alone, the others at p = 1
    (:mod:`pipeline.report.sequential`); its estimate and interval are over all its seeds."""
    rp = params.report
    check_margins(CONTRASTS, rp.equivalence_margin)
    alpha1, alpha2 = stats.look_alphas(params)
    first = _rows(params, runs, items, floors, disagreement, transfer_rates or {}, seed, set(params.train.seeds))
    ip = params.interface
    first += [{**r, "reason": "", "margin": math.nan, "margin_reason": "", "registration": "exact"}
              for r in collision_rows(collisions, ip.exact_tol, ip.atol)]
    table = decide(_frame(first), rp, alpha1).assign(look=1)
    more = {r["id"]: set(r["seeds"]) for r in (seed_plan or {}).get("rows", []) if r["continued"]}
    if more and len(table):
        args = (params, runs, items, floors, disagreement, transfer_rates or {}, seed)
        shown = _frame(_rows(*args, more)).set_index("id")  # every seed: the estimate and interval shown
        new = _frame(_rows(*args, {i: s - set(params.train.seeds) for i, s in more.items()})).set_index("id")
        look1 = table.set_index("id")
        w = sequential.weights(len(params.train.seeds), params.plan.max_seeds)
        for i in shown.index:
            shown.loc[i, ["p", "p_tost", "p_out"]] = _combined(look1.loc[i], new.loc[i], w)
        rest = look1.drop(index=shown.index).reindex(columns=shown.columns).assign(p=1.0, p_tost=1.0, p_out=1.0)
        # look 2's family is every row: a row not continued is in it with p = 1 (it has no new seeds)
        again = decide(pd.concat([rest, shown]).reset_index(), rp, alpha2).assign(look=2)
        again = again[again["id"].isin(shown.index)]
        order = list(table["id"])  # each continued row's look-2 line in place of its look-1 line
        table = pd.concat([table[~table["id"].isin(again["id"])], again]).set_index("id").loc[order].reset_index()
    return table


def _up(r) -> bool:
    """The side a row's directional p is on: the estimate above 0 (paired), the arm above the floor's bound."""
    return r["acc_a"] > r["floor_bound"] if r["kind"] == "floor" else r["estimate"] > 0


def _combined(first, new, w: tuple[float, float]) -> list[float]:
    """A continued row's look-2 p, p_tost and p_out: the inverse-normal combination (fixed weights ``w``) of its
    look-1 one-sided p-values and those of its new seeds alone (docs/methods.md, "Error rates")."""
    def greater(r) -> float:  # the directional two-sided t p made one-sided ("greater"), by the estimate's side
        return r["p"] / 2 if _up(r) else 1 - r["p"] / 2

    g = sequential.combine(greater(first), greater(new), w)
    p = float(min(1.0, 2 * min(g, 1 - g)))
    if first["kind"] != "paired":
        return [p, math.nan, math.nan]
    pc = [sequential.pieces(r["estimate"], r["seed_sd"], r["seeds"], r["margin"]) for r in (first, new)]
    mem = sequential.combined_members(*pc, w)
    return [p, float(mem["p_tost"]), float(mem["p_out"])]


def _frame(rows: list[dict]) -> pd.DataFrame:
    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    table["reason"] = table["reason"].fillna("")
    return table


def _rows(params, runs: pd.DataFrame, items: cells.Items, floors: dict, disagreement: dict, transfer: dict,
          seed: int, seeds) -> list[dict]:
    """Every planned row measured and gated on ``seeds``: a set (every row) or row id -> set (only those rows)."""
    rp, config = params.report, cells.main_config(runs)
    rows = []
    reach = agg.steps_to_reach(runs, rp.escape_threshold, cells.CELL)
    default = {"margin": rp.equivalence_margin,
               "margin_reason": "report.equivalence_margin (no row of its own; at most the smallest anchored effect)"}
    for row in plan(params) + budget_rows(runs, config):
        allowed = seeds.get(row["id"]) if isinstance(seeds, dict) else seeds
        if allowed is None:
            continue
        row = {**default, **row}
        m = measure(row, runs[(runs.source != "runs") | runs.seed.isin(allowed)], items, config, floors, rp, seed)
        rows.append({"id": row["id"], "label": row.get("label", row["id"]), "finding": row["finding"],
                     "kind": row["kind"], "task": row["task"], "a": row["a"], "b": row["b"],
                     "subset": row["subset"], "expect": row["expect"],
                     "isolates": row["isolates"], "margin": row["margin"], "margin_reason": row["margin_reason"],
                     "sesoi": row.get("sesoi", row["margin"] if row["margin"] > 0 else rp.equivalence_margin),
                     "registered": row.get("registered", ""),
                     "registration": registration(row, rp.registered_before),
                     "exact": False, "max_logit_diff": math.nan, **m, "reason": gate(row, m, rp.ceiling_tol),
                     "context": _context(row, reach, config, disagreement, transfer), "claim": row.get("claim", ""),
                     "detail": ""})
    return rows


def registration(row: dict, cutoff) -> str:
    """"exact" for an exact check (algebra: no data draw to have seen); "confirmatory" when the row was registered
    before this data draw was first used (``report.registered_before``); else "exploratory" (registered later, or
    never: a row generated from params, such as a budget row)."""
    registered = row.get("registered", "")
    if row["kind"] == "exact":
        return "exact"
    if not registered or cutoff is None:
        return "exploratory"
    return "confirmatory" if datetime.fromisoformat(registered) < cutoff else "exploratory"


def _context(row: dict, reach: pd.DataFrame, config: dict, disagreement: dict, transfer: dict) -> str:
    """What stands beside a row's numbers: a budget row's steps to the threshold; a distillation row's teachers'
    disagreement with the labels (on the students' images, or on the transfer set for a transfer row)."""
    if row["finding"] == "budget":
        return budget_context(reach, row, config)
    if not row["id"].startswith("distill."):
        return ""
    on_transfer = row["id"].startswith(("distill.transfer", "distill.inherit", "distill.oracle", "distill.type_split"))
    rates = {t: r for (t, task), r in (transfer if on_transfer else disagreement).items() if task == row["task"]}
    where = "the transfer set" if on_transfer else "the students' images"
    ctx = ", ".join(f"{t} teacher disagrees with the labels on {r:.1%} of {where}" for t, r in sorted(rates.items()))
    if len(rates) > 1:  # teachers are not accuracy-matched: the mismatch stands beside the comparison
        ctx += f"; teacher accuracy mismatch there {max(rates.values()) - min(rates.values()):.1%}"
    return ctx


def counts(ledger: pd.DataFrame) -> dict[str, int]:
    """Rows per verdict (every verdict named, zeros included)."""
    return {v: int((ledger.verdict == v).sum()) if len(ledger) else 0 for v in VERDICTS}


def leads(ledger: pd.DataFrame) -> list[tuple[str, pd.DataFrame, pd.Series]]:
    """(finding, its rows, its lead row) in :data:`FINDINGS` order; the lead is the group's first decided row
    (rows keep the order of :data:`CONTRASTS`, primary minimal pair first), never picked by outcome. A finding
    is stated only from informative rows: a group whose rows that ran are all uninformative keeps its first row as
    lead, and the README says it is undecided (a reader sees which findings this profile could not decide).
    Exploratory rows (registered after this data draw was first used) take no part: they are reported apart."""
    if "registration" in ledger.columns:  # findings stand on confirmatory (and exact) rows only
        ledger = ledger[ledger.registration != "exploratory"]
    if ledger.empty:
        return []
    order = {name: i for i, name in enumerate(FINDINGS)}
    out = []
    for name, g in sorted(ledger.groupby("finding", sort=False), key=lambda kv: order.get(kv[0], len(order))):
        ran = g[g.verdict != "not run"]
        decided = ran[ran.verdict != "uninformative"]
        out.append((name, g, (decided if len(decided) else ran if len(ran) else g).iloc[0]))
    return out
