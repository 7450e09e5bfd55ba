"""What the plan and report stages read, loaded once: the runs' frame, every run's per-item correctness on its
task's test items, the shortcut floors and the teachers' disagreement with the labels.

The plan stage judges the first look from this alone; the report adds the null-space check on trained weights
(:func:`pipeline.report.pages.load`), which needs the models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pipeline.report import aggregate as agg
from pipeline.report import cells, sources


@dataclass
class Inputs:
    """Everything the report reads, already loaded (paths resolved by the stage)."""

    params: object
    records: list[dict]
    runs: pd.DataFrame
    items: cells.Items
    floors: dict[str, dict]
    disagreement: dict
    transfer_disagreement: dict  # (teacher, task) -> its disagreement with the labels on the transfer set
    interface: dict
    curve_runs: pd.DataFrame
    collisions: pd.DataFrame = field(default_factory=pd.DataFrame)  # the report's check on trained weights
    seed_plan: dict | None = None  # the plan stage's second look (data/plan/plan.json)


def load(params, records: list[dict], tasks_dir: Path | None, slices_dir: Path | None,
         shortcuts_dir: Path | None, teachers_dir: Path | None, interface: dict,
         seed_plan: dict | None = None) -> Inputs:
    """Frames, per-item correctness of every run, floors and teacher disagreement."""
    runs = agg.runs_frame(records)
    task_names = sorted(set(runs.task))
    pools = {t: p for t in task_names if (p := sources.read_pool(tasks_dir, slices_dir, t)) is not None}
    items = cells.Items(pools)
    for r in runs.itertuples():
        if r.task in pools and (pred := sources.read_predictions(r.dir)) is not None:
            items.add(r.dir, r.task, *pred)
    return Inputs(params, records, runs, items, sources.read_floors(shortcuts_dir, task_names),
                  sources.teacher_disagreement(teachers_dir),
                  sources.teacher_disagreement(teachers_dir, "transfer_disagree"), interface,
                  runs[runs.source == "curve"], seed_plan=seed_plan)
