"""The measured side of a ledger row, before its gate, Holm and verdict: a paired row's per-seed differences on
the same test items (t interval, directional t, TOST against its margin), a speed row's shares of the step cap,
a floor row against the task's shortcut floor (and its Wilson or analytic bound), and the exact checks."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipeline.report import cells, learnability, sources, stats
from pipeline.report.cells import Items
from pipeline.report.contrasts import ANALYTIC_FLOORS, TEACHERS_SPLIT
from pipeline.report.gate import SPEED, UNREACHED


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


def _slice_acc(rec: dict, subset: str) -> float | None:
    """A baseline's accuracy on ``subset`` ("test": the whole test set); None where it was not scored there."""
    if subset == "test":
        return rec["acc"]
    got = (rec.get("slices") or {}).get(subset)
    return got["acc"] if got else None


def floor_of(floors: dict, task: str, exclude: tuple[str, ...] = (), subset: str = "test") -> tuple[float, str]:
    """(floor accuracy, baseline name) of a task on ``subset`` (the slice a row decides on), leaving out the
    ``exclude`` baselines, those that see the task's own factor (reported, never a floor) and those shown beside
    it (``beside``: natural's pooled bags); a slice the
    shortcuts stage did not score falls back to the whole test set's floor; NaN when absent."""
    base = {k: v for k, v in (floors.get(task) or {}).get("baselines", {}).items()
            if k not in exclude and not v.get("uses_factor") and not v.get("beside")}
    if subset != "test" and not any(_slice_acc(v, subset) is not None for v in base.values()):
        subset = "test"
    base = {k: a for k, v in base.items() if (a := _slice_acc(v, subset)) is not None}
    if not base:
        rec = floors.get(task) or {}
        return (float(rec["floor"]), rec.get("floor_baseline", "")) if "floor" in rec and not exclude \
            else (math.nan, "")
    best = max(base.values())
    tied = [k for k, a in base.items() if a == best]
    rec = floors.get(task) or {}
    recorded = rec.get("floor_baseline") if subset == "test" else (rec.get("floor_slice_baselines") or {}).get(subset)
    name = recorded if recorded in tied else tied[0]  # a tie names the shortcuts stage's own pick
    return float(best), name


def floor_interval(floors: dict, task: str, name: str, level: float, subset: str = "test") -> tuple[float, float]:
    """Wilson interval of the floor baseline's accuracy on its n items of ``subset`` (the floor is an estimate
    from one test set); NaN when floors.json gives no n."""
    rec = ((floors.get(task) or {}).get("baselines") or {}).get(name) or {}
    if subset != "test":
        rec = (rec.get("slices") or {}).get(subset) or rec
    if "n" not in rec:
        return math.nan, math.nan
    n = int(rec["n"])
    return stats.wilson(round(float(rec["acc"]) * n), n, level)


def chance_of(floors: dict, runs: pd.DataFrame, task: str) -> float:
    """The task's chance: floors.json's (the majority share of the test labels), else 1 / classes."""
    if "chance" in (floors.get(task) or {}):
        return float(floors[task]["chance"])
    classes = pd.to_numeric(runs.loc[runs.task == task, "num_classes"], errors="coerce").max()
    return 1 / float(classes) if classes == classes and classes > 0 else math.nan


# Tasks whose in-distribution slice is easy by design: the question is generalisation to unseen factor values, so
# the learn rule's base stays the whole test set's floor there instead of the in-distribution slice's. None today:
# glyph alignment was (a bag of tokens named the glyphs at the training offsets, ~1.0); its pairs are not.
ID_EASY_BY_DESIGN: tuple[str, ...] = ()


def own_teachers(arms: pd.DataFrame, teachers: pd.DataFrame) -> dict[str, str]:
    """Run dir -> the dir of its own teacher among ``teachers`` (one type on one task; sources.own_teacher)."""
    return {r.dir: d for r in arms.itertuples() if (d := sources.own_teacher(r, teachers)) is not None}


def floored_slice(subset: str) -> str:
    """The slice whose shortcut floor a row is held to: its own, or for a ``teachers/<slice>`` row (a subset
    picked by the teachers' correctness, where no shortcut was fitted) the whole slice it is cut from."""
    if not subset.startswith(TEACHERS_SPLIT):
        return subset
    within = subset.removeprefix(TEACHERS_SPLIT)
    return "test" if within == "test" else f"slice/{within}"


def learning_floor(floors: dict, task: str, learned_on: str = "") -> float:
    """The best accuracy available without learning the task's factor where learning is judged (the row's
    ``learned_on`` slice, else ``slice/id`` where the task has it, else test; the whole test set for
    :data:`ID_EASY_BY_DESIGN`): the fitted shortcut floor there or the analytic bound, whichever is higher (NaN
    when neither exists); with chance, the base of the learn rule."""
    subset = "test" if task in ID_EASY_BY_DESIGN else learned_on or "slice/id"
    return max((v for v in (floor_of(floors, task, subset=subset)[0], ANALYTIC_FLOORS.get(task, math.nan))
                if v == v), default=math.nan)


def _empty(row: dict) -> dict:
    return {"seeds": 0, "items": 0, "estimate": math.nan, "ci_lo": math.nan, "ci_hi": math.nan, "p": math.nan,
            "p_tost": math.nan, "p_out": math.nan, "seed_sd": math.nan, "item_se": math.nan, "acc_a": math.nan,
            "acc_b": math.nan, "in_a": math.nan, "in_b": math.nan, "learned_a": math.nan, "learned_b": math.nan,
            "ci_method": ""}


def _in_seeds(items: cells.Items, rows: pd.DataFrame, task: str, seeds: list[int],
              learned_on: str = "") -> np.ndarray | None:
    """Per seed (of ``seeds``), an arm's accuracy where its learning is judged: the row's ``learned_on`` slice if
    it names one, else ``slice/id`` where the task has it, else the whole test set."""
    subset = items.subset(task, learned_on or "slice/id")
    got = items.matrix(rows, subset if subset is not None else items.subset(task, "test"), seeds)
    return got[1].mean(axis=1) if got is not None else None


def _in_distribution(items: cells.Items, rows: pd.DataFrame, task: str, seeds: list[int],
                     learned_on: str = "") -> float:
    """Mean over ``seeds`` of :func:`_in_seeds`: the accuracy the learn gate reads."""
    got = _in_seeds(items, rows, task, seeds, learned_on)
    return float(got.mean()) if got is not None else math.nan


def _units(items: cells.Items, task: str, index: np.ndarray) -> np.ndarray | None:
    pool = items.pools.get(task) or {}
    return cells.twin_ids(task, index, pool.get("factors"))


def _margin_tests(mean_a, mean_b, margin: float) -> dict:
    """TOST p of per-seed means within ``margin`` and the non-equivalence p (``p_out``: 2 x the smaller one-sided
    p of the difference beyond either side of the margin)."""
    diff = np.asarray(mean_a, dtype=float) - np.asarray(mean_b, dtype=float)
    out_p = 2 * min(stats.one_sided_p(diff, margin, "greater"), stats.one_sided_p(diff, -margin, "less"))
    return {"p_tost": stats.tost(mean_a, mean_b, margin), "p_out": min(1.0, out_p)}


def measure_paired(row: dict, a_rows, b_rows, items: cells.Items, rp, seed: int, margin: float,
                   scored: cells.Items | None = None) -> dict:
    """Per-seed means of both arms on the compared slice (twin pairs averaged first), their paired t interval,
    two-sided p, TOST p, the non-equivalence p (``p_out``), the within-seed item precision, and each arm's
    in-distribution accuracy. ``scored``: the items the compared slice is scored on (default ``items``; an
    agreement row's view scores agreement with a teacher)."""
    scored = scored or items
    subset = scored.subset(row["task"], row["subset"])
    seeds = sorted(set(a_rows.seed) & set(b_rows.seed))
    ga = scored.matrix(a_rows, subset, seeds, with_index=True)
    gb = scored.matrix(b_rows, subset, seeds, with_index=True)
    if ga is None or gb is None or ga[1].shape != gb[1].shape or not np.array_equal(ga[2], gb[2]):
        return {}
    units = _units(items, row["task"], ga[2])
    d = stats.paired_seeds(ga[1], gb[1], units, rp.confidence)
    unit = "twin pairs averaged first, " if units is not None else ""
    return {"seeds": d["seeds"], "items": d["items"], "estimate": d["estimate"], "ci_lo": d["ci_lo"],
            "ci_hi": d["ci_hi"], "p": d["p"], **_margin_tests(d["mean_a"], d["mean_b"], margin), "seed_sd": d["sd"],
            "item_se": stats.item_precision(ga[1], gb[1], rp.bootstrap_samples, seed, units),
            "acc_a": float(d["mean_a"].mean()), "acc_b": float(d["mean_b"].mean()),
            "in_a": _in_distribution(items, a_rows, row["task"], seeds, row.get("learned_on", "")),
            "in_b": _in_distribution(items, b_rows, row["task"], seeds, row.get("learned_on", "")),
            "_in_seeds": [_in_seeds(items, r, row["task"], seeds, row.get("learned_on", "")) for r in (a_rows, b_rows)],
            "ci_method": f"seed-level paired t ({unit}{d['seeds']} seeds)"}


def measure_speed(row: dict, a_rows, b_rows, items: cells.Items, rp) -> dict:
    """Per seed, each arm's share of the step cap left unused at the criterion (:data:`SPEED`), their
    seed-paired t interval, two-sided p, TOST p and non-equivalence p; each arm's mean share (``speed_a``,
    ``speed_b``), its test accuracy (``acc_a``, ``acc_b``: held to the test set's shortcut floor like every
    accuracy row, ``floor_slice``) and its in-distribution accuracy.
    ``unreached``: the arms with seeds that never reached the criterion (the gate's reasons: a run stopped by
    the cap or the plateau rule has no time to criterion, and scoring it as the cap would bias the pair)."""
    seeds = sorted(set(a_rows.seed) & set(b_rows.seed))
    if not seeds:
        return {}
    speed, unreached = [], []
    for arm, rows in ((row["a"], a_rows), (row["b"], b_rows)):
        r = rows.set_index("seed").loc[seeds]
        missing = int(r.criterion_step.isna().sum())
        if missing:
            unreached.append(f"{arm} {UNREACHED} in {missing} of {len(seeds)} seeds")
        speed.append((1 - r.criterion_step / r.steps).to_numpy(dtype=float))
    d = speed[0] - speed[1]
    out = stats.seed_interval(d, rp.confidence)
    in_seeds = [_in_seeds(items, r, row["task"], seeds) for r in (a_rows, b_rows)]
    test = [items.matrix(r, items.subset(row["task"], "test"), seeds) for r in (a_rows, b_rows)]
    return {"seeds": out["seeds"], "items": 0, "estimate": out["estimate"], "ci_lo": out["ci_lo"],
            "ci_hi": out["ci_hi"], "p": stats.one_sided_p(d, 0.0, "two-sided"),
            **_margin_tests(*speed, row["margin"]), "seed_sd": out["sd"], "item_se": math.nan,
            **{f"acc_{arm}": float(got[1].mean()) if got is not None else math.nan
               for arm, got in zip("ab", test, strict=True)}, "floor_slice": "test",
            "speed_a": float(np.mean(speed[0])), "speed_b": float(np.mean(speed[1])),
            "in_a": float(np.mean(in_seeds[0])) if in_seeds[0] is not None else math.nan,
            "in_b": float(np.mean(in_seeds[1])) if in_seeds[1] is not None else math.nan,
            "_in_seeds": in_seeds, "unreached": unreached,
            "ci_method": f"seed-level paired t of the share of the step cap left at criterion ({out['seeds']} seeds)"}


def measure_floor(row: dict, a_rows, items: cells.Items, rp, seed: int, floor: float, bound: float) -> dict:
    """One arm's per-seed accuracy on the slice minus the floor, its t interval, and the two-sided t p of its
    mean against ``bound`` (the floor's upper bound: the verdict's reference)."""
    got = items.matrix(a_rows, items.subset(row["task"], row["subset"]), with_index=True)
    if got is None or floor != floor:
        return {}
    learned = row.get("learned_on", "")
    in_a = _in_distribution(items, a_rows, row["task"], sorted(set(a_rows.seed)), learned) if learned else math.nan
    units = _units(items, row["task"], got[2])
    acc = stats.unit_means(got[1], units)
    d = stats.seed_interval(acc - floor, rp.confidence)
    return {"seeds": d["seeds"], "items": int(got[1].shape[1]), "estimate": d["estimate"], "ci_lo": d["ci_lo"],
            "ci_hi": d["ci_hi"], "p": stats.one_sided_p(acc, bound, "two-sided"), "seed_sd": d["sd"],
            "item_se": stats.item_precision(got[1], None, rp.bootstrap_samples, seed, units),
            "acc_a": float(acc.mean()), "in_a": in_a, "ci_method": f"seed-level t of a - floor ({d['seeds']} seeds)"}


def measure(row: dict, runs: pd.DataFrame, items: cells.Items, config: dict, floors: dict, rp, seed: int) -> dict:
    """The measured side of one planned row (before Holm, the gate and the verdict)."""
    task = row["task"]
    a_rows = cells.select(runs, task, row["a"], {**config, **row.get("a_cfg", {})})
    judged = floored_slice(row["subset"])
    floor, floor_name = floor_of(floors, task, row.get("exclude", ()), judged)
    lo, hi = floor_interval(floors, task, floor_name, rp.confidence, judged)
    analytic = ANALYTIC_FLOORS.get(task, math.nan)
    bound = max((v for v in (hi if hi == hi else floor, analytic) if v == v), default=math.nan)
    chance = chance_of(floors, runs, task)
    fraction = dict(rp.learn_fraction_tasks).get(task, rp.learn_fraction)
    base = learning_floor(floors, task, row.get("learned_on", ""))
    rec = floors.get(task) or {}  # a stronger reference beside the floor (natural's pooled bags), on the row's slice
    beside_acc, beside_name = (rec.get("beside_slices") or {}).get(
        judged, [rec.get("beside_floor", math.nan), rec.get("beside_baseline", "")])
    out = {**_empty(row), "floor": floor, "floor_baseline": floor_name, "floor_lo": lo, "floor_hi": hi,
           "analytic_floor": analytic, "floor_bound": bound if row["kind"] == "floor" else math.nan,
           "beside_floor": float(beside_acc), "beside_baseline": beside_name,
           "chance": chance, "learn_at": learnability.learn_threshold(chance, base, fraction)}
    if row["kind"] == "paired":
        b_rows = cells.select(runs, task, row["b"], config)
        scored = items
        if row.get("teacher"):  # scored by agreement with each run's own teacher (the gate still reads accuracy)
            t = runs[(runs.source == "teachers") & (runs.task == task) & (runs.arch == row["teacher"])]
            got = {d: items.runs[d][::2] for d in t["dir"] if d in items.runs}
            if not got:
                return out
            scored = items.agreeing_with(task, got, own_teachers(pd.concat([a_rows, b_rows]), t))
        elif row["subset"].startswith(TEACHERS_SPLIT):  # where a's teacher type is right and b's wrong
            ta, tb = (runs[(runs.source == "teachers") & (runs.task == task) & (runs.arch == arm)]["dir"].tolist()
                      for arm in (row["teacher_a"], row["teacher_b"]))
            where = items.where_teachers_split(task, ta, tb, row["subset"].removeprefix(TEACHERS_SPLIT))
            scored = Items({task: {**items.pools[task], "subsets": {**items.pools[task]["subsets"],
                                                                   row["subset"]: where}}}, items.runs)
        m = {**out, **(measure_speed(row, a_rows, b_rows, items, rp) if row["subset"] == SPEED
                       else measure_paired(row, a_rows, b_rows, items, rp, seed, row["margin"], scored))}
        if judged != row["subset"] and m.get("seeds"):  # the floor is the whole slice's: so is what clears it
            m["floor_slice"], seeds = judged, sorted(set(a_rows.seed) & set(b_rows.seed))
            for arm, rows in (("a", a_rows), ("b", b_rows)):
                got = items.matrix(rows, items.subset(task, judged), seeds)
                m[f"floor_acc_{arm}"] = float(got[1].mean()) if got is not None else math.nan
        # seeds of each arm at or above the learn threshold: a split arm (some did, some not) is one the plan
        # continues rather than calls a non-learner on a handful of seeds
        for arm, got in zip(("a", "b"), m.pop("_in_seeds", (None, None)), strict=True):
            m[f"learned_{arm}"] = int((got >= out["learn_at"]).sum()) if got is not None else math.nan
        return m
    if row["kind"] == "floor":
        return {**out, **measure_floor(row, a_rows, items, rp, seed, floor, bound)}
    return {**out, **exact_twins(a_rows, items, task)}


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
