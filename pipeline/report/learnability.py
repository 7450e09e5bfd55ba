"""The learnability table: did each architecture learn each task in distribution, how fast, and how did it
generalise (main configuration only; one row per task x arch).

Pure pandas on the runs frame (:func:`pipeline.report.aggregate.runs_frame`); intervals are over seeds
(Student t), because "did it learn" is a property of a training run, not of test items.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as sps

from pipeline.report.aggregate import first_step
from pipeline.report.cells import select

COLUMNS = ["task", "arch", "seeds", "lr", "id_mean", "id_lo", "id_hi", "chance", "floor", "learn_at", "learned",
           "k_criterion", "median_steps_to_criterion", "stop_reasons", "ood_mean", "ood_lo", "ood_hi"]


def learn_threshold(chance: float, floor: float, fraction: float) -> float:
    """In-distribution accuracy an arm must reach to count as having learned a task: a ``fraction`` of the way
    from the best accuracy available without learning it (chance or the task's floor, whichever is higher; the
    floor is :func:`pipeline.report.measure.learning_floor`, an absent one is chance) to 1. The ledger's
    informativeness gate uses this same function."""
    base = chance if floor != floor else max(chance, floor)
    return base + fraction * (1.0 - base)


def learned(acc: float, chance: float, floor: float, fraction: float) -> bool:
    """Whether an in-distribution accuracy clears :func:`learn_threshold` (a missing accuracy has not)."""
    return acc == acc and acc >= learn_threshold(chance, floor, fraction)


def learn_fraction(rp, task: str) -> float:
    """``report.learn_fraction`` (default 0.5), overridden per task by ``report.learn_fraction_tasks``."""
    per_task = dict(getattr(rp, "learn_fraction_tasks", None) or {})
    return float(per_task.get(task, getattr(rp, "learn_fraction", 0.5)))


def criterion_accuracy(params) -> float:
    """``train.criterion.accuracy``; params without a criterion fall back to the escape threshold (the same
    validation-accuracy bar the old steps-to-reach table used)."""
    crit = getattr(params.train, "criterion", None)
    acc = getattr(crit, "accuracy", None) if crit is not None else None
    return float(acc) if acc is not None else float(params.report.escape_threshold)


def seed_interval(values, level: float) -> tuple[float, float, float]:
    """(mean, lo, hi): Student-t interval of the mean over seeds; lo/hi NaN with fewer than two seeds."""
    x = np.asarray([v for v in values if v == v], dtype=float)
    if not len(x):
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(sps.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, max(0.0, mean - half), min(1.0, mean + half)  # an accuracy interval stays inside [0, 1]


def steps_to_criterion(run, criterion: float) -> float:
    """The step at which a run first held its criterion (NaN: not reached). A run that recorded the key is
    taken at its word (null = not reached); an older run is read off its validation curve (first logged step
    at or above ``criterion``)."""
    if bool(getattr(run, "criterion_recorded", False)):
        return float(run.criterion_step)
    return first_step(getattr(run, "curve", None), criterion)


def stop_text(reasons: pd.Series) -> str:
    """``"criterion 3, cap 2"``: how many seeds stopped for each reason (most common first, ties by name)."""
    counts = reasons.fillna("cap").value_counts()
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def lr_text(lrs: pd.Series) -> str:
    """The learning rate(s) a cell's seeds trained at (one, when the tune stage chose it); "-" if unrecorded."""
    values = sorted({float(v) for v in lrs.dropna()})
    return ", ".join(f"{v:g}" for v in values) or "-"


def _chance(floors: dict, task: str, runs: pd.DataFrame) -> float:
    """The task's chance accuracy: floors.json's ``chance``, else 1 / classes of its runs."""
    rec = floors.get(task) or {}
    if rec.get("chance") is not None:
        return float(rec["chance"])
    k = pd.to_numeric(runs["num_classes"], errors="coerce").dropna()
    return 1.0 / float(k.iloc[0]) if len(k) else math.nan


def learnability_table(runs: pd.DataFrame, config: dict, floors: dict, floor: dict[str, float],
                       criterion: float, fraction, level: float) -> pd.DataFrame:
    """One row per task x arch at the main ``config`` (columns :data:`COLUMNS`), sorted by task then arch.

    floors: task -> floors.json (for chance); floor: task -> the shortcut floor the ledger uses
    (:func:`pipeline.report.measure.floor_of`); fraction: task -> learn fraction (:func:`learn_fraction`)."""
    main = runs[runs.source == "runs"]
    rows = []
    for task, arch in sorted(set(zip(main.task, main.arch, strict=True))):
        g = select(runs, task, arch, config).drop_duplicates("seed") if config else main.iloc[0:0]
        if g.empty:
            continue
        chance, fl = _chance(floors, task, g), floor.get(task, math.nan)
        frac = fraction(task) if callable(fraction) else float(fraction)
        idm, idlo, idhi = seed_interval(g.id_acc, level)
        oodm, oodlo, oodhi = seed_interval(g.ood_acc, level)
        steps = pd.Series([steps_to_criterion(r, criterion) for r in g.itertuples()], dtype=float).dropna()
        rows.append({"task": task, "arch": arch, "seeds": len(g), "lr": lr_text(g.lr),
                     "id_mean": idm, "id_lo": idlo, "id_hi": idhi,
                     "chance": chance, "floor": fl, "learn_at": learn_threshold(chance, fl, frac),
                     "learned": "yes" if learned(idm, chance, fl, frac) else "no", "k_criterion": len(steps),
                     "median_steps_to_criterion": float(steps.median()) if len(steps) else math.nan,
                     "stop_reasons": stop_text(g.stop_reason), "ood_mean": oodm, "ood_lo": oodlo, "ood_hi": oodhi})
    return pd.DataFrame(rows, columns=COLUMNS)


def _ci(mean: float, lo: float, hi: float) -> str:
    if mean != mean:
        return "-"
    return f"{mean:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo == lo else " (one seed)")


def learnability_view(table: pd.DataFrame) -> pd.DataFrame:
    """The reading view: intervals as text, "k of n" and the median step side by side."""
    if table.empty:
        return table

    def reached(r) -> str:
        k = f"{r.k_criterion} of {r.seeds}"
        return f"{k}, median step {r.median_steps_to_criterion:.0f}" if r.k_criterion else f"{k} (not reached)"

    return pd.DataFrame({
        "task": table.task, "arch": table.arch, "lr": table.lr,
        "in-distribution acc (seed CI)": [_ci(r.id_mean, r.id_lo, r.id_hi) for r in table.itertuples()],
        "learned (needs)": [f"{r.learned} (>= {r.learn_at:.3f})" for r in table.itertuples()],
        "reached criterion": [reached(r) for r in table.itertuples()],
        "stopped by": table.stop_reasons,
        "out-of-distribution acc (seed CI)": [_ci(r.ood_mean, r.ood_lo, r.ood_hi) for r in table.itertuples()],
    })


NOTE = ("Main configuration ({config}), one row per task x architecture. lr: the learning rate the cell trained "
        "at, chosen for it by the `tune` stage on validation accuracy ([tuning table](../tune/tuning.md)). "
        "In-distribution accuracy: each seed's "
        "accuracy on the task's `slice/id` (the whole test split where the task has no such slice), their mean "
        "and a {level:.0%} Student-t interval over seeds (none with one seed). `learned`: the mean clears "
        "base + f x (1 - base), base = the higher of chance and the task's shortcut floor, f = `report."
        "learn_fraction` ({fractions}); the ledger's informativeness gate uses the same rule. Reached criterion: "
        "k of n seeds whose validation accuracy reached {criterion:g} (the run's recorded `criterion_step`; for "
        "runs from before training to a criterion, the first logged validation step at or above it), and the "
        "median step among those k. Stopped by: seeds per stop reason (criterion, plateau, or cap = the step "
        "budget ran out; fixed-budget runs read cap). Out-of-distribution accuracy: `slice/ood` where the task "
        "has one, same interval.")
