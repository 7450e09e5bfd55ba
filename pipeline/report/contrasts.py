"""What the ledger predicts, fixed before any accuracy is read: the minimal-pair contrasts (``contrasts.csv``), the
shortcut-floor rows and the exact checks, and which of them a configuration plans (a row exists only when both its
arms are configured in params, so nothing is "untestable"); the budget axis adds a row per extra budget trained."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pipeline.grid import configured_cells


def _contrasts(path: Path) -> tuple[dict, ...]:
    """The minimal-pair predictions (``contrasts.csv``): ``a - b`` on ``subset`` of each task, ``expect`` "+"
    (a beats b) or "0" (no effect), with its equivalence ``margin`` and why (``margin_reason``), and the
    literature effect it is about (``anchor``, empty when none), its smallest effect of interest (``sesoi``: what
    the seeds asked are sized for, never the observed effect; the anchored effect where there is one, else the
    margin; a "0" row's is its margin) and why (``sesoi_reason``), and ``learned_on``: the slice on which both arms
    must have learned (empty: in distribution; :func:`pipeline.report.gate.gate`), and when it was ``registered``
    (the commit time from which its decision fields stood as now: ``python -m bench.registration``). A row's
    finding (which groups rows for the README) and its task are its id's prefix; a ``distill.*`` row runs on every
    task where both its arms train."""
    rows = []
    for r in pd.read_csv(path, dtype=str, keep_default_na=False).to_dict("records"):
        prefix = r["id"].split(".")[0]
        finding, tasks = ("distillation", None) if prefix == "distill" else (prefix, (prefix,))
        rows.append({"id": r["id"], "label": r.get("label") or r["id"], "finding": finding, "a": r["a"], "b": r["b"],
                     "tasks": tasks,
                     "subset": r["subset"], "expect": r["expect"], "isolates": r["isolates"],
                     "margin": float(r["margin"]), "margin_reason": r["margin_reason"],
                     "sesoi": float(r["sesoi"]), "sesoi_reason": r["sesoi_reason"],
                     "learned_on": r.get("learned_on", ""), "registered": r.get("registered", ""),
                     "anchor": float(r["anchor"]) if r["anchor"] else math.nan})
    return tuple(rows)


CONTRASTS = _contrasts(Path(__file__).with_name("contrasts.csv"))


# Analytic bounds beside the fitted floors, keyed by task. relation: the label is an A x B interaction of two
# marks' colours over 8 colour configurations; the best rule without an A x B term (any additive score of A's
# and B's colour) gets at most 6 of the 8 right, so 0.75 bounds every model that cannot join the two marks.
# a subset ``teachers/<ood|test>``: the items where a's teacher type is right and b's wrong (by majority over each
# type's teachers): where the two biases part, so a student that inherits its teacher's differs there
TEACHERS_SPLIT = "teachers/"
ANALYTIC_FLOORS = {"relation": 0.75}


# Floor rows are judged against the floor's upper bound (its Wilson bound, or the analytic bound where
# higher), which already allows for the floor's own error: no margin on top.
FLOOR_MARGIN = {"margin": 0.0, "margin_reason": "none: judged against the floor's upper bound"}


# The floor rows live here, not in contrasts.csv: registered by hand, at the commit that last changed one of them.
FLOOR_ROWS_REGISTERED = "2026-12-06T06:42:08Z"

# Predicted "at the shortcut floor" (one arm vs the task's floor; `exclude` = baselines that are the arm itself).
FLOOR_ROWS = (
    {"id": "reach.swin_local", "label": "one-stage windows at the floor, marks in different windows",
     "finding": "relation", "a": "swin_local", "tasks": ("relation",),
     "subset": "slice/window=cross", "exclude": (), "learned_on": "slice/window=same",
     "isolates": "reachability: one windowed stage without shift never joins marks in different windows",
     "registered": FLOOR_ROWS_REGISTERED, **FLOOR_MARGIN},
    {"id": "floor.nomix", "label": "no token mixing at the floor", "finding": "floors", "a": "nomix",
     "tasks": ("alignment", "scale", "relation", "arrangement", "natural"),
     "subset": "test", "exclude": ("nomix",), "isolates": "no token mixing at all",
     "registered": FLOOR_ROWS_REGISTERED, **FLOOR_MARGIN},
)


def check_margins(contrasts, default: float) -> None:
    """Every contrast has a positive margin and its reason; none (and not the default, which budget rows use)
    exceeds the smallest literature effect a row is about, or "equivalent" could contain that effect."""
    anchors = [c["anchor"] for c in contrasts if c["anchor"] == c["anchor"]]
    for c in contrasts:
        if not (c["margin"] > 0 and c["margin_reason"]):
            raise ValueError(f"contrasts.csv: {c['id']} needs a positive margin and its reason")
        if c["margin"] > c["anchor"]:
            raise ValueError(f"contrasts.csv: {c['id']} margin {c['margin']} exceeds its anchored effect {c['anchor']}")
    if anchors and default > min(anchors):
        raise ValueError(f"report.equivalence_margin: {default} exceeds the smallest anchored effect {min(anchors)}")


def cell_readers(params, figures: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(arch, task) of every main-grid cell -> what reads it: ledger rows (paired, floor, exact, and the budget
    axis, whose rows pair the main cell with its other budget) and the per-factor figures (``figures``: task ->
    the archs its plot draws, from dvc.yaml). A cell with an empty list is trained for nothing."""
    out = {(arch, task): [] for arch, tasks in configured_cells(params).items() for task in tasks}
    for row in plan(params):
        for arm in (row["a"], row["b"]):
            if (arm, row["task"]) in out:
                out[arm, row["task"]].append(row["id"])
    for name, grid in params.train.grids.items():
        # another budget of the same cell (same size, the slice stage's subset): a budget row reads both
        if (grid.steps or grid.budget_mode) and grid.sizes in (None, [params.train.size]) \
                and grid.data_seeds in (None, [0]):
            for arch in grid.archs or list(params.train.archs):
                for task in grid.tasks or params.train.archs[arch].tasks:
                    if (arch, task) in out:
                        out[arch, task].append(f"budget ({name} grid)")
    for task, archs in figures.items():
        for arch in archs:
            if (arch, task) in out:
                out[arch, task].append(f"figure: {task}")
    return out


def plan(params) -> list[dict]:
    """Every ledger row for this configuration (a function of params only)."""
    conf = configured_cells(params)
    rows = []
    students = params.distill.students
    for c in CONTRASTS:
        for task in c["tasks"] or params.tasks.names:  # a distill.* row: wherever both its arms train
            if task in conf.get(c["a"], ()) and task in conf.get(c["b"], ()):
                # an agree/* row scores both arms against a's teacher type (cells.Items.agreeing_with)
                teacher = students[c["a"]].teacher if c["subset"].startswith("agree/") and c["a"] in students \
                    else ""
                pair = {}
                if c["subset"].startswith(TEACHERS_SPLIT):
                    if not (c["a"] in students and c["b"] in students):
                        raise ValueError(f"contrasts.csv: {c['id']}: a {TEACHERS_SPLIT} row compares two students")
                    pair = {"teacher_a": students[c["a"]].teacher, "teacher_b": students[c["b"]].teacher}
                rows.append({**c, "id": f"{c['id']}.{task}", "task": task, "kind": "paired", "teacher": teacher,
                             **pair})
    for f in FLOOR_ROWS:
        rows += [{**f, "id": f"{f['id']}.{task}", "task": task, "b": "floor", "kind": "floor", "expect": "<="}
                 for task in f["tasks"] if task in conf.get(f["a"], ())]
    if "arrangement" in conf.get("vit_nopos", ()):
        rows.append({"id": "exact.vit_nopos.twins", "label": "position-free ViT cannot tell twins apart (exact)",
                     "finding": "arrangement", "a": "vit_nopos", "b": "",
                     "task": "arrangement", "subset": "test", "kind": "exact", "expect": "= 0.5",
                     "claim": "vit_nopos: twin-pair accuracy = 0.5 exactly, twin logits equal",
                     "isolates": "no position + mean readout: permutation-invariant logits, twins are permutations"})
    return rows


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
            budgets = (f"{int(steps)} steps ({mode}-matched) vs {int(config['steps'])} "
                       f"({config['budget_mode']}-matched)")
            rows.append({"id": f"budget.{arch}.{task}.{mode}{int(steps)}", "finding": "budget", "a": arch,
                         "b": arch, "a_cfg": {"steps": steps, "budget_mode": mode}, "task": task, "subset": "test",
                         "kind": "paired", "expect": "+", "label": f"{arch}, {budgets}, {task}",
                         "isolates": f"training budget: {budgets}"})
    return rows
