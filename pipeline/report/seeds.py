"""Sequential seeds: the second look's plan, a function of the first look's ledger (docs/methods.md).

Look 1 judges every ledger row on ``train.seeds``. A paired or floor row outside the budget axis that is
informative (its gate passed) but inconclusive, and whose power calculation asks for at most ``plan.max_seeds``
seeds, continues: its cells (both arms of a paired row, the one of a floor row) get seeds up to that count (new
seed numbers after the first look's, never ``tune.seed``; the ``train_more`` stage trains them), and look 2
judges it on them. So does a row whose only reason to be uninformative is a split arm: one whose seeds fall on
both sides of the learn threshold (2 of 3 learned), which a handful of seeds cannot call a learner or not; it
continues to ``report.min_seeds_bimodal`` seeds (at most ``plan.max_seeds``), where the gate judges it again.
The plan reads nothing but the first look's results, so ``dvc repro`` stays deterministic. A continued row gets
at least two new seeds: look 2 tests it on a combination of look 1 and its new seeds alone, in a Holm family of every
row (:mod:`pipeline.report.sequential`), which keeps the family-wise error within alpha whatever the plan picks.

Price: a row's extra seeds cost what its cells' first-look seeds cost, in thousands of ViT-step equivalents (each
cell's mean steps taken times its model's relative step cost, ``pipeline.families.STEP_COST``, the table the
training pool schedules by): counted, not timed, so the plan is the same on every machine. Rows are bought
cheapest first, a greedy rule (a cell shared with a row already bought costs nothing again; with no shared cells it
continues the most rows a budget affords); with ``plan.budget`` set, a row whose price exceeds what is left stays
at its first look.
"""

from __future__ import annotations

import math

import pandas as pd

from pipeline.report.cells import main_config, select
from pipeline.report.gate import UNREACHED, gate
from pipeline.report.stats import look_alphas, second_look


def extra_seeds(params, n: int) -> list[int]:
    """The first ``n`` seed numbers after the first look's (``tune.seed`` skipped: no trial shares a seed)."""
    out, s = [], max(params.train.seeds) + 1
    while len(out) < n:
        if s != params.tune.seed:
            out.append(s)
        s += 1
    return out


def split_arms(r: dict, tol: float) -> list[str]:
    """The arms that keep an uninformative row from its gate only by being split (some seeds at or above the
    learn threshold, some below); [] when anything else keeps it there (an arm no seed of which learned, both
    at the ceiling or at chance, a speed row's seed that never reached the criterion, which more seeds cannot
    undo). ``r``: a ledger row with ``learned_a``/``learned_b`` (seeds that learned)."""
    if UNREACHED in str(r.get("reason", "")):
        return []
    nan = math.nan
    split = [arm for arm in ("a", "b") if not r.get(f"in_{arm}", nan) >= r.get("learn_at", nan)
             and not math.isnan(k := float(r.get(f"learned_{arm}", nan))) and 0 < k < r["seeds"]]
    learned = {**r, **{f"in_{arm}": r["learn_at"] for arm in split}}  # as if the split arms had learned
    if not split or gate(learned, learned, tol) != "":
        return []
    return [r[arm] for arm in split]


def seed_prices(runs: pd.DataFrame) -> dict[tuple[str, str], float]:
    """{(task, arch): what one more seed of the cell costs, in thousands of ViT-step equivalents}: the mean steps its
    first-look main-grid seeds took, times its model's relative step cost (``pipeline.families.STEP_COST``)."""
    from pipeline.families import STEP_COST  # torch and timm: the report's other readers of this module need neither

    config, out = main_config(runs), {}
    for (task, arch), _ in runs[runs.source == "runs"].groupby(["task", "arch"]):
        sel = select(runs, task, arch, config)
        if len(sel):
            out[(task, arch)] = float(sel.steps_done.mean()) * STEP_COST[sel.model.iloc[0]] / 1000
    return out


def _arms(r: dict) -> tuple[str, ...]:
    """The cells a row's extra seeds go to: both arms of a paired row, the one of a floor row."""
    return (r["a"], r["b"]) if r["kind"] == "paired" else (r["a"],)


def _buy(candidates: list[tuple[dict, dict]], first: list[int], prices: dict, budget: float | None) -> float:
    """Continue candidate rows cheapest first within ``budget`` (None: all), pricing each row at the extra seeds
    its cells still lack; writes ``continued``, ``seeds``, ``price_kvit`` and a refused row's ``why`` into each
    entry. Returns what was spent."""
    bought: dict[tuple[str, str], int] = {}

    def price(r: dict, entry: dict) -> float:
        extra = len(entry["seeds"]) - len(first)
        lack = {arm: extra - bought.get((r["task"], arm), 0) for arm in _arms(r)}
        return sum(n * prices.get((r["task"], arm), math.nan) for arm, n in lack.items() if n > 0)

    def order(c: tuple[dict, dict]) -> tuple[bool, float]:  # unknown prices last; ties keep the ledger's order
        p = price(*c)
        return math.isnan(p), 0.0 if math.isnan(p) else p

    spent, left = 0.0, list(candidates)
    while left:
        r, entry = min(left, key=order)
        left.remove((r, entry))
        cost = price(r, entry)
        entry["price_kvit"] = None if math.isnan(cost) else round(cost, 3)
        if budget is not None and not cost <= budget - spent:
            said = "an unknown price" if math.isnan(cost) else f"{cost:.1f} thousand ViT-step equivalents"
            entry.update(continued=False, why=f"not continued: its {len(entry['seeds'])} seeds would cost {said}, "
                                              f"over the {budget - spent:.1f} left of plan.budget {budget:g}")
            entry["seeds"] = first
            continue
        spent += 0.0 if math.isnan(cost) else cost
        for arm in _arms(r):
            bought[(r["task"], arm)] = max(bought.get((r["task"], arm), 0), len(entry["seeds"]) - len(first))
    return spent


def make_plan(ledger: pd.DataFrame, params, prices: dict[tuple[str, str], float] | None = None) -> dict:
    """``plan.json``: per eligible row, its first-look verdict, the seeds it needs, whether it continues and why,
    and, for a row the rules continue, its price (``price_kvit``: what its cells' extra seeds cost, see
    :func:`seed_prices`, beyond those bought for a cheaper row; a row over ``plan.budget`` is priced and stays at
    its first look); per cell (task, arch), the extra seeds ``train_more`` trains (the most
    any of its continued rows needs)."""
    first = sorted(params.train.seeds)
    cap, tol = params.plan.max_seeds, params.report.ceiling_tol
    rows, cells, candidates = [], {}, []
    for r in ledger.to_dict("records"):
        if r["kind"] not in ("paired", "floor") or r["finding"] == "budget":
            continue
        needed = None if pd.isna(r.get("seeds_needed")) else int(r["seeds_needed"])
        entry = {"id": r["id"], "task": r["task"], "a": r["a"], "b": r["b"], "look1": r["verdict"],
                 "seeds_needed": needed, "continued": False, "seeds": first}
        split = split_arms(r, tol) if r["verdict"] == "uninformative" and second_look(params) else []
        if split:
            needed = min(cap, max(params.report.min_seeds_bimodal, int(r["seeds"]) + 1))
            arms = ", ".join(f"{r[x]} learned in {int(r[f'learned_{x}'])} of {int(r['seeds'])} seeds"
                             for x in ("a", "b") if r[x] in split)
            why = (f"continued: {arms}; its gate is judged again on {needed} seeds (report.min_seeds_bimodal "
                   f"{params.report.min_seeds_bimodal}, at most plan.max_seeds)")
        elif r["verdict"] != "inconclusive":
            why = (f"uninformative at look 1: {r['reason']}" if r["verdict"] == "uninformative"
                   else f"{r['verdict']} at look 1" if r["verdict"] != "not run" else "not run")
        elif not second_look(params):
            why = f"no second look (plan.max_seeds {cap} <= {len(first)} first-look seeds)"
        elif needed is None:
            why = f"needs more than report.max_seeds ({params.report.max_seeds}) seeds"
        elif needed > cap:
            why = f"needs {needed} seeds, more than plan.max_seeds {cap}"
        else:
            why = f"continued: needs {needed} seeds for power {params.report.power:g} at its look-1 Holm level"
        entry.update(seeds_needed=needed, why=why)
        if why.startswith("continued"):
            total = max(needed, len(first) + 2)  # two new seeds at least: look 2 tests them alone
            entry.update(continued=True, seeds=first + extra_seeds(params, total - len(first)))
            candidates.append((r, entry))
        rows.append(entry)
    spent = _buy(candidates, first, prices or {}, params.plan.budget)
    for r, entry in candidates:
        for arch in _arms(r) if entry["continued"] else ():
            have = cells.setdefault((r["task"], arch), [])
            cells[(r["task"], arch)] = sorted(set(have) | set(entry["seeds"]) - set(first))
    return {"enabled": second_look(params), "alpha_per_look": list(look_alphas(params)), "first_seeds": first,
            "max_seeds": cap, "budget": params.plan.budget, "spent_kvit": round(spent, 3), "rows": rows,
            "cells": [{"task": t, "arch": a, "seeds": s} for (t, a), s in sorted(cells.items())]}


def seeds_table(seed_plan: dict | None) -> pd.DataFrame:
    """The plan as the report shows it: per row, its look-1 verdict, the seeds needed and given, its price where the
    rules continue it (thousands of ViT-step equivalents) and why."""
    cols = ["id", "look1", "seeds_needed", "continued", "seeds", "price_kvit", "why"]
    rows = [{**{k: r.get(k) for k in cols if k != "seeds"}, "seeds": len(r["seeds"])}
            for r in (seed_plan or {}).get("rows", [])]
    return pd.DataFrame(rows, columns=cols)
