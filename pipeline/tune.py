"""Matched tuning: every cell of the main grid gets the same learning-rate trials, judged on validation only.

Policy (docs/design.md §4): each (arch, task) cell, distilled students included, trains once per value of
``tune.lrs`` at the main budget (``train.recipe`` with only the learning rate changed, to the criterion or the
cap) on ``tune.seed``, a seed no run of the study trains with. The cell's learning rate is the trial with the
highest validation accuracy; a tie goes to the trial that stopped after fewer steps, then to the value listed
first. The test split is never read. Teachers keep ``train.recipe.lr`` (they are fixed inputs of their students).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pipeline.config import Params
from pipeline.errors import StageError
from pipeline.grid import cells
from pipeline.io import check_field, read_json
from pipeline.schemas import TUNE_CHOICE

COLUMNS = ["arch", "task", "lr", "val_acc", "steps_done", "stop_reason"]


def trial_table(metrics: list[dict]) -> pd.DataFrame:
    """One row per trial from the trials' ``metrics.json`` records, by task, arch and lr (not by finish time)."""
    table = pd.DataFrame([{c: m.get(c) for c in COLUMNS} for m in metrics], columns=COLUMNS)
    return table.sort_values(["task", "arch", "lr"], kind="stable").reset_index(drop=True)


def choose(trials: pd.DataFrame, lrs: list[float]) -> pd.DataFrame:
    """The chosen trial per (arch, task): best validation accuracy, then fewer steps, then the first-listed lr.
    A cell whose trials did not all run is refused (equal trials per cell is the point)."""
    counts = trials.groupby(["arch", "task"]).lr.nunique()
    if (short := counts[counts != len(lrs)]).size:
        arch, task = short.index[0]
        raise StageError(f"tune: {arch}/{task} has {short.iloc[0]} of {len(lrs)} trials; every cell gets all of "
                         "tune.lrs")
    order = {lr: i for i, lr in enumerate(lrs)}
    ranked = trials.assign(_acc=-trials.val_acc.fillna(-1.0), _order=trials.lr.map(order))
    ranked = ranked.sort_values(["arch", "task", "_acc", "steps_done", "_order"], kind="stable")
    best = ranked.groupby(["arch", "task"], sort=False).head(1).drop(columns=["_acc", "_order"])
    return best.assign(trials=len(lrs)).reset_index(drop=True)


def choice_record(params: Params, chosen: pd.DataFrame | None) -> dict:
    """What the train stage reads: ``{"lrs": {"<arch>/<task>": lr}}`` for every cell, plus the policy's inputs.
    ``chosen=None`` (one value in ``tune.lrs``): that value everywhere, no trials."""
    if chosen is None:
        lrs = {f"{a}/{t}": params.tune.lrs[0] for a, t in cells(params)}
    else:
        lrs = {f"{r.arch}/{r.task}": float(r.lr) for r in chosen.itertuples()}
    return {"lrs": lrs, "tried": params.tune.lrs, "seed": params.tune.seed,
            "trials_per_cell": len(params.tune.lrs) if chosen is not None else 0}


def read_choice(path: Path, params: Params) -> dict[tuple[str, str], float]:
    """The tuned learning rate of every configured cell from the tune stage's ``choice.json``."""
    record = read_json(path, TUNE_CHOICE)
    out = {}
    for arch, task in cells(params):
        if f"{arch}/{task}" not in record["lrs"]:
            raise StageError(f"{path}: no tuned learning rate for {arch}/{task}; rerun the tune stage (dvc repro)")
        lr = check_field(path, record, f"lrs.{arch}/{task}", float)
        if not lr > 0:
            raise StageError(f"{path}: lrs.{arch}/{task} is {lr}, not a positive learning rate")
        if not any(math.isclose(lr, x) for x in params.tune.lrs):
            raise StageError(f"{path}: lrs.{arch}/{task} is {lr:g}, not one of tune.lrs {params.tune.lrs} "
                             f"(chosen under another configuration); rerun the tune stage (dvc repro)")
        out[(arch, task)] = float(lr)
    return out


def markdown(trials: pd.DataFrame, chosen: pd.DataFrame | None, params: Params) -> str:
    """``reports/tune/tuning.md``: the policy, the trial table (validation accuracy per lr) and the choice."""
    head = ("# Matched tuning: the same trials for every cell, chosen on validation accuracy\n\n"
            f"Each (arch, task) cell of the main grid trains once per learning rate in `tune.lrs` "
            f"({', '.join(f'{x:g}' for x in params.tune.lrs)}) on seed {params.tune.seed}, which no run of the "
            "study uses, at the main budget (the recipe with only the learning rate changed). The cell's "
            "learning rate is the trial with the highest validation accuracy (ties: fewer steps, then the first "
            "listed); the test split is never read. Teachers keep `train.recipe.lr`.\n\n")
    if chosen is None:
        return head + f"One value in `tune.lrs`: no trials; every cell trains at {params.tune.lrs[0]:g}.\n"
    wide = trials.pivot_table(index=["task", "arch"], columns="lr", values="val_acc").sort_index()
    wide.columns = [f"val acc @ {c:g}" for c in wide.columns]
    pick = chosen.set_index(["task", "arch"])
    wide["chosen lr"] = pick.lr
    wide["trials"] = pick.trials
    fmt = [".3f"] * wide.shape[1] + ["g", "g"]  # task, arch and accuracies; the lr unrounded (5e-4)
    counts = chosen.groupby("arch").trials.agg(["min", "max"])
    same = "every arch got the same number of trials per cell" if (counts["min"] == counts["max"]).all() and \
        counts["min"].nunique() == 1 else "trial counts differ between archs"
    return head + f"{len(chosen)} cells, {len(trials)} trials: {same}.\n\n" + \
        wide.reset_index().to_markdown(index=False, floatfmt=fmt) + "\n"
