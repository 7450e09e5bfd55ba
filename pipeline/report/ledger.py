"""The prediction ledger: minimal-pair contrasts, shortcut floors and exact checks, each decided.

What is predicted is data (``contrasts.csv``, :data:`FLOOR_ROWS`), fixed before any accuracy is read; a row
exists only when both of its arms are configured in params (a pair that is not configured is not a row, so
nothing is "untestable"). Every row is judged on item-level results:

- ``paired``: ``a - b`` on the same test items with the same seeds, hierarchical-bootstrap CI and p-value;
- ``floor``: ``a - floor`` where floor = the task's strongest shortcut baseline (data/shortcuts/<task>/floors.json):
  a structural limit predicts "at the shortcut floor", not "chance" (every readout here sums per-token terms);
- ``exact``: algebra judged exactly, not by an interval (vit_nopos: twin logits equal, so accuracy on complete
  twin pairs is exactly 0.5).

Holm's correction runs over every row with a p-value; each row ends held / failed / equivalent /
underpowered (with the seeds needed) -- or "not run" when its runs are missing.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.report import aggregate as agg
from pipeline.report import cells, stats


def _contrasts(path: Path) -> tuple[dict, ...]:
    """The minimal-pair predictions (``contrasts.csv``): ``a - b`` on ``subset`` of each task, ``expect`` "+"
    (a beats b) or "0" (no effect). A row's finding (which groups rows for the README) and its task are its
    id's prefix; the ``distill.*`` rows run on every task in ``distill.tasks``."""
    rows = []
    for r in pd.read_csv(path, dtype=str, keep_default_na=False).to_dict("records"):
        prefix = r["id"].split(".")[0]
        finding, tasks = ("distillation", None) if prefix == "distill" else (prefix, (prefix,))
        rows.append({"id": r["id"], "finding": finding, "a": r["a"], "b": r["b"], "tasks": tasks,
                     "subset": r["subset"], "expect": r["expect"], "isolates": r["isolates"]})
    return tuple(rows)


CONTRASTS = _contrasts(Path(__file__).with_name("contrasts.csv"))
# Predicted "at the shortcut floor" (one arm vs the task's floor; `exclude` = baselines that are the arm itself).
FLOOR_ROWS = (
    {"id": "reach.swin_local", "finding": "relation", "a": "swin_local", "tasks": ("relation",),
     "subset": "slice/window=cross", "exclude": (),
     "isolates": "reachability: one windowed stage without shift never joins marks in different windows"},
    {"id": "floor.nomix", "finding": "floors", "a": "nomix", "tasks": ("alignment", "scale", "relation",
                                                                        "arrangement", "natural"),
     "subset": "test", "exclude": ("nomix",), "isolates": "no token mixing at all"},
)
VERDICTS = ("held", "failed", "equivalent", "underpowered", "not run")
# The README's findings, in this order (at most five are shown).
FINDINGS = ("alignment", "arrangement", "relation", "distillation", "natural", "scale", "budget", "collisions",
            "floors")


def configured_cells(params) -> dict[str, set[str]]:
    """arch -> tasks it is configured on (train.archs, distill students); tolerant of both the old
    (``arch: section``) and the new (``arch: {models, tasks}``) layout of train.archs."""
    t, d = params.train, params.distill
    out: dict[str, set[str]] = {}
    for arch, spec in dict(t.archs).items():
        tasks = getattr(spec, "tasks", None) or (spec.get("tasks") if isinstance(spec, dict) else None)
        out[arch] = set(tasks or getattr(t, "tasks", []))
    for student in dict(d.students):
        out.setdefault(student, set()).update(d.tasks)
    return out


def plan(params) -> list[dict]:
    """Every ledger row for this configuration (a function of params only)."""
    conf = configured_cells(params)
    rows = []
    for c in CONTRASTS:
        for task in c["tasks"] or params.distill.tasks:
            if task in conf.get(c["a"], ()) and task in conf.get(c["b"], ()):
                rows.append({**c, "id": f"{c['id']}.{task}", "task": task, "kind": "paired"})
    for f in FLOOR_ROWS:
        rows += [{**f, "id": f"{f['id']}.{task}", "task": task, "b": "floor", "kind": "floor", "expect": "<="}
                 for task in f["tasks"] if task in conf.get(f["a"], ())]
    if "arrangement" in conf.get("vit_nopos", ()):
        rows.append({"id": "exact.vit_nopos.twins", "finding": "arrangement", "a": "vit_nopos", "b": "",
                     "task": "arrangement", "subset": "test", "kind": "exact", "expect": "= 0.5",
                     "claim": "vit_nopos: twin-pair accuracy = 0.5 exactly, twin logits equal",
                     "isolates": "no position + mean readout: permutation-invariant logits, twins are permutations"})
    return rows


def collision_rows(table: pd.DataFrame, exact_tol: float, atol: float) -> list[dict]:
    """Two exact rows from the trained-weights null-space check (:mod:`.collisions`), over every task and seed:
    the ViT's logits do not move (float64, within ``exact_tol``); the other model's do (by more than ``atol``)."""
    if table is None or table.empty:
        return []
    tasks = ", ".join(sorted(set(table.task)))
    other = str(table.other_arch.iloc[0])
    vit, moved = float(table.vit_max_diff_f64.max()), float(table.other_max_diff_f64.min())
    base = {"finding": "collisions", "kind": "exact", "task": tasks, "b": "", "subset": "test",
            "seeds": int(table.seed.nunique()), "items": 0, "ci_lo": math.nan, "ci_hi": math.nan, "p": math.nan,
            "floor": math.nan, "floor_baseline": "", "context": ""}
    null = f"{int(table.null_dim.iloc[0])} of {int(table.D.iloc[0])} patch dimensions"
    return [
        {**base, "id": "exact.collision.vit", "a": "vit", "expect": "= 0", "exact": vit <= exact_tol,
         "estimate": vit, "max_logit_diff": vit,
         "isolates": f"patch projection: its null space ({null}) is invisible to the trained ViT",
         "claim": f"vit logits unchanged by a null-space pattern in every patch (float64, max abs diff <= "
                  f"{exact_tol:g})",
         "detail": f"max abs logit diff {vit:.2g} (float64), {table.vit_max_diff_f32.max():.2g} (float32); "
                   f"pixel change RMS {table.pixel_rms_grey_levels.mean():.0f} grey levels; "
                   f"{len(table)} task x seed pairs"},
        {**base, "id": f"exact.collision.{other}", "a": other, "expect": "> 0", "exact": moved > atol,
         "estimate": moved, "max_logit_diff": moved,
         "isolates": "the same pixel change, seen by overlapping convolutions",
         "claim": f"{other} logits moved by the vit's null-space pattern (every pair: max abs diff > {atol:g})",
         "detail": f"smallest max abs logit diff {moved:.3g}; predictions changed on "
                   f"{table.other_flips.mean():.1%} of test items (vit: {table.vit_flips.mean():.1%})"},
    ]


def budget_rows(runs: pd.DataFrame, config: dict) -> list[dict]:
    """The budget axis: every (task, arch) also trained under another budget than the main grid's (more steps,
    or ``budget_mode: flops``) at the same size and data gives a row "that budget - main budget" on the same
    items and seeds ("cannot" vs "not yet"; step- vs FLOP-matched side by side)."""
    if not config:
        return []
    same = runs[(runs.source == "runs") & (runs.data_seed == 0) & (runs.train_size == config["train_size"])]
    rows = []
    main = (config["steps"], config["budget_mode"])
    for (task, arch), g in same.groupby(["task", "arch"], sort=True):
        alts = g[["steps", "budget_mode"]].drop_duplicates()
        if main not in set(alts.itertuples(index=False, name=None)):
            continue  # no main-budget partner: a pair with one arm is not a row (steps_to_reach shows the runs)
        for steps, mode in sorted(alts.itertuples(index=False, name=None), key=str):
            if (steps, mode) == main:
                continue
            rows.append({"id": f"budget.{arch}.{task}.{mode}{int(steps)}", "finding": "budget", "a": arch,
                         "b": arch, "a_cfg": {"steps": steps, "budget_mode": mode}, "task": task, "subset": "test",
                         "kind": "paired", "expect": "+", "isolates": f"training budget: {int(steps)} steps "
                         f"({mode}-matched) vs {int(config['steps'])} ({config['budget_mode']}-matched)"})
    return rows


def budget_context(reach: pd.DataFrame, row: dict, config: dict) -> str:
    """"<steps> steps: step N (k of n seeds)" or "not reached", for both arms of a budget row."""
    parts = []
    for steps in (config["steps"], row["a_cfg"]["steps"]):
        sub = reach[(reach.task == row["task"]) & (reach.arch == row["a"]) & (reach.steps == steps)
                    & (reach.data_seed == 0) & (reach.train_size == config["train_size"])]
        if len(sub):
            parts.append(f"{int(steps)} steps: {sub.reached.iloc[0]}")
    return "; ".join(parts)


def floor_of(floors: dict, task: str, exclude: tuple[str, ...] = ()) -> tuple[float, str]:
    """(floor accuracy, baseline name) of a task, leaving out the ``exclude`` baselines and those that see the
    task's own factor (reported, never a floor); NaN when absent."""
    base = {k: v for k, v in (floors.get(task) or {}).get("baselines", {}).items()
            if k not in exclude and not v.get("uses_factor")}
    if not base:
        rec = floors.get(task) or {}
        return (float(rec["floor"]), rec.get("floor_baseline", "")) if "floor" in rec and not exclude \
            else (math.nan, "")
    best = max(v["acc"] for v in base.values())
    tied = [k for k, v in base.items() if v["acc"] == best]
    recorded = (floors.get(task) or {}).get("floor_baseline")
    name = recorded if recorded in tied else tied[0]  # a tie names the shortcuts stage's own pick
    return float(best), name


def _empty(row: dict) -> dict:
    return {"seeds": 0, "items": 0, "estimate": math.nan, "ci_lo": math.nan, "ci_hi": math.nan, "p": math.nan}


def measure(row: dict, runs: pd.DataFrame, items: cells.Items, config: dict, floors: dict, rp, seed: int) -> dict:
    """The measured side of one planned row (before Holm and the verdict)."""
    subset = items.subset(row["task"], row["subset"])
    a_rows = cells.select(runs, row["task"], row["a"], {**config, **row.get("a_cfg", {})})
    floor, floor_name = floor_of(floors, row["task"], row.get("exclude", ()))
    out = {**_empty(row), "floor": floor, "floor_baseline": floor_name}
    if row["kind"] == "paired":
        b_rows = cells.select(runs, row["task"], row["b"], config)
        seeds = sorted(set(a_rows.seed) & set(b_rows.seed))
        ga, gb = items.matrix(a_rows, subset, seeds), items.matrix(b_rows, subset, seeds)
        if ga is None or gb is None or ga[1].shape != gb[1].shape:
            return out
        d = stats.paired_difference(ga[1], gb[1], rp.bootstrap_samples, seed, rp.confidence)
        return {**out, **{k: d[k] for k in ("seeds", "items", "estimate", "ci_lo", "ci_hi", "p")}}
    if row["kind"] == "floor":
        got = items.matrix(a_rows, subset)
        if got is None or floor != floor:
            return out
        d = stats.paired_difference(got[1], np.full_like(got[1], floor), rp.bootstrap_samples, seed,
                                    rp.confidence)
        return {**out, **{k: d[k] for k in ("seeds", "items", "estimate", "ci_lo", "ci_hi", "p")}}
    return {**out, **exact_twins(a_rows, items, row["task"])}


def exact_twins(rows: pd.DataFrame, items: cells.Items, task: str) -> dict:
    """Exact row: per seed, twin logits equal and accuracy on complete twin pairs exactly 0.5."""
    pool = items.pools.get(task)
    checks = []
    for d in rows.sort_values("seed")["dir"]:
        if pool is None or (got := items.runs.get(d)) is None:
            continue
        index, _, logits = got
        twins = cells.twin_ids(task, index, pool["factors"])
        if twins is not None:
            checks.append(cells.twin_check(index, logits, pool["labels"], twins))
    checks = [c for c in checks if c["pairs"]]
    if not checks:
        return {}
    accs = [c["pair_acc"] for c in checks]
    ok = all(c["equal"] for c in checks) and all(a == 0.5 for a in accs)
    return {"seeds": len(checks), "items": 2 * checks[0]["pairs"], "estimate": float(np.mean(accs)),
            "ci_lo": min(accs), "ci_hi": max(accs), "exact": ok,
            "max_logit_diff": max(c["max_logit_diff"] for c in checks)}


def decide(table: pd.DataFrame, rp) -> pd.DataFrame:
    """Holm over the rows with a p-value, then each row's verdict and (if underpowered) the seeds needed."""
    alpha = 1 - rp.confidence
    t = table.copy()
    t["p_holm"] = stats.holm(t["p"].to_numpy(dtype=float))
    verdicts, needed = [], []
    for r in t.itertuples():
        if r.seeds == 0:
            v = "not run"
        elif r.kind == "exact":
            v = "held" if r.exact else "failed"
        else:
            v = stats.verdict(r.ci_lo, r.ci_hi, r.p_holm, r.expect, rp.equivalence_margin, alpha)
        verdicts.append(v)
        needed.append(stats.seeds_needed(r.seeds, r.ci_lo, r.ci_hi, r.estimate, rp.equivalence_margin)
                      if v == "underpowered" else None)
    t["verdict"], t["needs_seeds"] = verdicts, pd.array(needed, dtype="Int64")
    return t


def judge(params, runs: pd.DataFrame, items: cells.Items, floors: dict, disagreement: dict,
          seed: int, collisions: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ledger: one row per planned prediction with its measurement, Holm p-value and verdict."""
    rp, config = params.report, cells.main_config(runs)
    rows = []
    reach = agg.steps_to_reach(runs, rp.escape_threshold, cells.CELL)
    for row in plan(params) + budget_rows(runs, config):
        m = measure(row, runs, items, config, floors, rp, seed)
        ctx = ""
        if row["finding"] == "budget":
            ctx = budget_context(reach, row, config)
        if row["id"].startswith("distill.teacher"):
            rates = {t: r for (t, task), r in disagreement.items() if task == row["task"]}
            ctx = ", ".join(f"{t} teacher disagrees with labels on {r:.1%}" for t, r in sorted(rates.items()))
            if len(rates) > 1:  # teachers are not accuracy-matched: the mismatch stands beside the comparison
                gap = max(rates.values()) - min(rates.values())
                ctx += f"; teacher accuracy mismatch on the students' data {gap:.1%}"
        rows.append({"id": row["id"], "finding": row["finding"], "kind": row["kind"], "task": row["task"],
                     "a": row["a"], "b": row["b"], "subset": row["subset"], "expect": row["expect"],
                     "isolates": row["isolates"], "exact": False, "max_logit_diff": math.nan, **m,
                     "context": ctx, "claim": row.get("claim", ""), "detail": ""})
    ip = params.interface
    rows += collision_rows(collisions, ip.exact_tol, ip.atol)
    cols = ["id", "finding", "kind", "task", "a", "b", "subset", "expect", "isolates", "seeds", "items",
            "estimate", "ci_lo", "ci_hi", "p", "floor", "floor_baseline", "exact", "max_logit_diff", "context",
            "claim", "detail"]
    table = pd.DataFrame(rows, columns=cols)
    if table.empty:
        return table.assign(p_holm=[], verdict=[], needs_seeds=[])
    return decide(table, rp)


def counts(ledger: pd.DataFrame) -> dict[str, int]:
    """Rows per verdict (every verdict named, zeros included)."""
    return {v: int((ledger.verdict == v).sum()) if len(ledger) else 0 for v in VERDICTS}


def leads(ledger: pd.DataFrame) -> list[tuple[str, pd.DataFrame, pd.Series]]:
    """(finding, its rows, its lead row) in :data:`FINDINGS` order; the lead is the group's first row with
    data (rows keep the order of :data:`CONTRASTS`, primary minimal pair first), never picked by outcome."""
    if ledger.empty:
        return []
    order = {name: i for i, name in enumerate(FINDINGS)}
    out = []
    for name, g in sorted(ledger.groupby("finding", sort=False), key=lambda kv: order.get(kv[0], len(order))):
        ran = g[g.verdict != "not run"]
        out.append((name, g, (ran if len(ran) else g).iloc[0]))
    return out
