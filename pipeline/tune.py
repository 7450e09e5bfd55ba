"""Matched tuning: every cell of the main grid gets the same learning-rate trials, judged on validation only.

Policy (docs/methods.md): each (arch, task) cell, distilled students included, trains once per value of
``tune.lrs`` at the main budget (``train.recipe`` with only the learning rate changed, to the criterion or the
cap) on ``tune.seed``, a seed no run of the study trains with. The cell's learning rate is the trial that held the
criterion (in-distribution validation accuracy) in the fewest steps, ties to the higher validation accuracy; if
none held it, the trial with the highest validation accuracy; remaining ties to the value listed first. The test
split is never read. Teachers keep ``train.recipe.lr`` (they are fixed inputs of their students).

Racing: the values run in rounds, in the listed order, and a trial stops (``race``) once it has taken as many
steps as its cell's best steps to criterion so far without holding the criterion itself: it can no longer win.
The learning-rate schedule still runs to the cap, so every trial follows the same path as an unraced one up to its
stop and the choice is the one full-length trials would make.
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


def race_steps(trials: pd.DataFrame) -> dict[tuple[str, str], int]:
    """{(arch, task): the fewest steps to criterion among the cell's trials so far}, for cells where one held it:
    the step by which a later trial of the cell must hold the criterion to win."""
    held = trials[trials.stop_reason == "criterion"]
    return {k: int(v) for k, v in held.groupby(["arch", "task"]).steps_done.min().items()}


def choose(trials: pd.DataFrame, lrs: list[float]) -> pd.DataFrame:
    """The chosen trial per (arch, task): held the criterion (then fewer steps), then higher validation accuracy,
    then the first-listed lr. A cell whose trials did not all run is refused (equal trials per cell is the
    point)."""
    counts = trials.groupby(["arch", "task"]).lr.nunique()
    if (short := counts[counts != len(lrs)]).size:
        arch, task = short.index[0]
        raise StageError(f"tune: {arch}/{task} has {short.iloc[0]} of {len(lrs)} trials; every cell gets all of "
                         "tune.lrs")
    order = {lr: i for i, lr in enumerate(lrs)}
    held = trials.stop_reason == "criterion"
    ranked = trials.assign(_held=~held, _steps=trials.steps_done.where(held, 0), _acc=-trials.val_acc.fillna(-1.0),
                           _order=trials.lr.map(order))
    keys = ["_held", "_steps", "_acc", "_order"]
    ranked = ranked.sort_values(["arch", "task", *keys], kind="stable")
    best = ranked.groupby(["arch", "task"], sort=False).head(1).drop(columns=keys)
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
    """``reports/tune/tuning.md``: the policy, the trial table (validation accuracy, stop rule and steps per lr)
    and the choice."""
    head = ("# Matched tuning: the same trials for every cell, chosen on validation accuracy\n\n"
            f"Each (arch, task) cell of the main grid trains once per learning rate in `tune.lrs` "
            f"({', '.join(f'{x:g}' for x in params.tune.lrs)}, in rounds in this order) on seed "
            f"{params.tune.seed}, which no run of the study uses, at the main budget (the recipe with only the "
            "learning rate changed). The cell's learning rate is the trial that held the criterion on validation "
            "in the fewest steps (ties: higher validation accuracy); if none held it, the highest validation "
            "accuracy; then the first listed. A trial stops (`race`) once it has taken as many steps as its "
            "cell's best steps to criterion so far without holding it: it can no longer win, and the "
            "learning-rate schedule runs to the cap either way, so racing saves steps without changing a choice. "
            "The test split is never read. Teachers keep `train.recipe.lr`.\n\n")
    if chosen is None:
        return head + f"One value in `tune.lrs`: no trials; every cell trains at {params.tune.lrs[0]:g}.\n"
    cell = trials.assign(text=[f"{a:.3f} ({r} {s})" for a, r, s in
                               zip(trials.val_acc.fillna(float("nan")), trials.stop_reason, trials.steps_done,
                                   strict=True)])
    wide = cell.pivot(index=["task", "arch"], columns="lr", values="text").sort_index()
    wide = wide[[lr for lr in params.tune.lrs if lr in wide.columns]]
    wide.columns = [f"val acc @ {c:g} (stop, steps)" for c in wide.columns]
    pick = chosen.set_index(["task", "arch"])
    wide["chosen lr"] = pick.lr.map(lambda x: f"{x:g}")  # unrounded (5e-4)
    wide["trials"] = pick.trials
    counts = chosen.groupby("arch").trials.agg(["min", "max"])
    same = "every arch got the same number of trials per cell" if (counts["min"] == counts["max"]).all() and \
        counts["min"].nunique() == 1 else "trial counts differ between archs"
    raced = int((trials.stop_reason == "race").sum())
    return head + f"{len(chosen)} cells, {len(trials)} trials ({raced} stopped by the race): {same}.\n\n" + \
        wide.reset_index().to_markdown(index=False) + "\n"
