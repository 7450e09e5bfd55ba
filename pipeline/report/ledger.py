"""The prediction ledger: minimal-pair contrasts, shortcut floors and exact checks, each decided.

What is predicted is data (``contrasts.csv``, :data:`FLOOR_ROWS`), fixed before any accuracy is read; a row
exists only when both of its arms are configured in params (a pair that is not configured is not a row, so
nothing is "untestable"). Every row is judged on item-level results:

- ``paired``: ``a - b`` on the same test items with the same seeds: per seed the difference of mean accuracy
  (twin pairs averaged first), then a seed-level paired t interval, a directional t test and TOST against the
  row's margin; decided only when both arms learned in distribution and are not both at the ceiling or at
  chance on the compared slice (:func:`gate`), else "uninformative" with the reason in words;
- ``floor``: ``a - floor`` where floor = the task's strongest shortcut baseline (data/shortcuts/<task>/floors.json),
  judged against the floor's upper bound (Wilson on its n items, or the analytic bound where higher): a
  structural limit predicts "at the shortcut floor", not "chance" (every readout here sums per-token terms);
- ``exact``: algebra judged exactly, not by an interval (vit_nopos: twin logits equal, so accuracy on complete
  twin pairs is exactly 0.5).

One Holm family holds every decision test of the decided rows (:func:`family`); each row ends held / failed /
equivalent / uninformative / underpowered (with the seeds needed for the target power) -- or "not run" when
its runs are missing.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.report import aggregate as agg
from pipeline.report import cells, learnability, stats


def _contrasts(path: Path) -> tuple[dict, ...]:
    """The minimal-pair predictions (``contrasts.csv``): ``a - b`` on ``subset`` of each task, ``expect`` "+"
    (a beats b) or "0" (no effect), with its equivalence ``margin`` and why (``margin_reason``), and the
    literature effect it is about (``anchor``, empty when none), and ``learned_on``: the slice on which both arms
    must have learned (empty: in distribution; :func:`gate`). A row's finding (which groups rows for the
    README) and its task are its id's prefix; a ``distill.*`` row runs on every task where both its arms train."""
    rows = []
    for r in pd.read_csv(path, dtype=str, keep_default_na=False).to_dict("records"):
        prefix = r["id"].split(".")[0]
        finding, tasks = ("distillation", None) if prefix == "distill" else (prefix, (prefix,))
        rows.append({"id": r["id"], "finding": finding, "a": r["a"], "b": r["b"], "tasks": tasks,
                     "subset": r["subset"], "expect": r["expect"], "isolates": r["isolates"],
                     "margin": float(r["margin"]), "margin_reason": r["margin_reason"],
                     "learned_on": r.get("learned_on", ""),
                     "anchor": float(r["anchor"]) if r["anchor"] else math.nan})
    return tuple(rows)


CONTRASTS = _contrasts(Path(__file__).with_name("contrasts.csv"))
# Analytic bounds beside the fitted floors, keyed by task. relation: the label is an A x B interaction of two
# marks' colours over 8 colour configurations; the best rule without an A x B term (any additive score of A's
# and B's colour) gets at most 6 of the 8 right, so 0.75 bounds every model that cannot join the two marks.
ANALYTIC_FLOORS = {"relation": 0.75}
# Floor rows are judged against the floor's upper bound (its Wilson bound, or the analytic bound where
# higher), which already allows for the floor's own error: no margin on top.
FLOOR_MARGIN = {"margin": 0.0, "margin_reason": "none: judged against the floor's upper bound"}
# Predicted "at the shortcut floor" (one arm vs the task's floor; `exclude` = baselines that are the arm itself).
FLOOR_ROWS = (
    {"id": "reach.swin_local", "finding": "relation", "a": "swin_local", "tasks": ("relation",),
     "subset": "slice/window=cross", "exclude": (), "learned_on": "slice/window=same",
     "isolates": "reachability: one windowed stage without shift never joins marks in different windows",
     **FLOOR_MARGIN},
    {"id": "floor.nomix", "finding": "floors", "a": "nomix", "tasks": ("alignment", "scale", "relation",
                                                                        "arrangement", "natural"),
     "subset": "test", "exclude": ("nomix",), "isolates": "no token mixing at all", **FLOOR_MARGIN},
)
VERDICTS = ("held", "failed", "equivalent", "uninformative", "underpowered", "not run")
# The README's findings, in this order (at most five are shown).
FINDINGS = ("alignment", "arrangement", "relation", "distillation", "natural", "scale", "budget", "collisions",
            "floors")


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


def configured_cells(params) -> dict[str, set[str]]:
    """arch -> the tasks it trains on in the main grid (``train.archs``, the distilled students)."""
    out = {arch: set(entry.tasks) for arch, entry in params.train.archs.items()}
    for student in params.distill.students:
        out.setdefault(student, set()).update(params.distill.student_tasks(student))
    return out


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
                # an agree/* row scores both arms against a's teacher (cells.Items.agreeing_with)
                teacher = students[c["a"]].teacher if c["subset"].startswith("agree/") and c["a"] in students \
                    else ""
                rows.append({**c, "id": f"{c['id']}.{task}", "task": task, "kind": "paired", "teacher": teacher})
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


def floor_interval(floors: dict, task: str, name: str, level: float) -> tuple[float, float]:
    """Wilson interval of the floor baseline's accuracy on its n test items (the floor is an estimate from one
    test set); NaN when floors.json gives no n."""
    rec = ((floors.get(task) or {}).get("baselines") or {}).get(name) or {}
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


def learning_floor(floors: dict, task: str) -> float:
    """The best accuracy available without learning the task's factor: the fitted shortcut floor or the analytic
    bound, whichever is higher (NaN when neither exists); with chance, the base of the learn rule."""
    return max((v for v in (floor_of(floors, task)[0], ANALYTIC_FLOORS.get(task, math.nan)) if v == v),
               default=math.nan)


# Compared slices on which learning the task is itself the question (no held-out factor values).
LEARNING_SUBSETS = ("test", "slice/id")
# The subset of a row that compares how soon its arms learned, not how well: per seed the share of the step cap
# a run left unused when it reached ``train.criterion`` (1 - criterion step / cap; higher = sooner), so a pair
# at the accuracy ceiling still has a question (:func:`measure_speed`).
SPEED = "criterion/speed"
UNREACHED = "did not reach train.criterion"  # a speed row's gate reason: a seed with no time to criterion


def gate(row: dict, m: dict, tol: float) -> str:
    """Why a paired row cannot be decided ("" when it can); stated in docs/design.md §4 (Learnability):

    - compared out of distribution (an unseen factor value, or a slice an arm cannot reach): both arms must have
      learned on the row's ``learned_on`` slice (default in distribution), so generalisation is compared at
      matched learning, never a chance-level arm against a below-chance one;
    - compared in distribution, where learning is the question: a "+" row needs at least one arm that learned
      (the one that learned winning or losing is the finding), an "= 0" row needs both (two arms that did not
      learn are not equivalent, only equally stuck);
    - on the compared slice, never both at the ceiling or both at (or below) chance (accuracy only: an agreement
      row's low agreement with a wrong teacher is a student being right).

    Exact rows are not gated, nor floor rows (a floor prediction is about not learning) except one that names a
    ``learned_on`` slice: "at the floor where the arm cannot reach" says something only if the arm learned where
    it can (a model at chance everywhere sits at the floor across windows too, for another reason). A budget row
    (one arch, two budgets) needs no learned arm (learning under the longer budget is its question)."""
    if row["kind"] == "floor" and row.get("learned_on") and m.get("seeds") and not m["in_a"] >= m["learn_at"]:
        return f"{row['a']} did not learn: {row['learned_on']} {m['in_a']:.3f} (needs >= {m['learn_at']:.3f})"
    if row["kind"] != "paired" or not m.get("seeds"):
        return ""
    reasons = list(m.get("unreached", ()))
    if row["finding"] != "budget":
        where = row.get("learned_on") or "in-distribution"
        missed = [f"{arm} did not learn: {where} {acc:.3f} (needs >= {m['learn_at']:.3f})"
                  for arm, acc in ((row["a"], m["in_a"]), (row["b"], m["in_b"])) if not acc >= m["learn_at"]]
        learning_is_the_question = row["subset"] in LEARNING_SUBSETS and row["expect"] == "+"
        if not learning_is_the_question or len(missed) == 2:
            reasons += missed
    a, b = m["acc_a"], m["acc_b"]
    if row["subset"] == SPEED:  # speeds, not accuracies: no ceiling or chance on this scale
        pass
    elif a >= 1 - tol and b >= 1 - tol:
        reasons.append(f"both at ceiling on {row['subset']}: {a:.3f} and {b:.3f}")
    elif a <= m["chance"] + tol and b <= m["chance"] + tol and not row["subset"].startswith("agree/"):
        # a budget pair at chance under both budgets too. Not an agreement row: agreeing with a teacher where it is
        # wrong less often than a random guess means being right there, which is learning, not its absence
        reasons.append(f"both at chance on {row['subset']}: {a:.3f} and {b:.3f} (chance {m['chance']:.3f})")
    return "; ".join(reasons)


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
    seed-paired t interval, two-sided p, TOST p and non-equivalence p, and each arm's in-distribution accuracy.
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
    return {"seeds": out["seeds"], "items": 0, "estimate": out["estimate"], "ci_lo": out["ci_lo"],
            "ci_hi": out["ci_hi"], "p": stats.one_sided_p(d, 0.0, "two-sided"),
            **_margin_tests(*speed, row["margin"]), "seed_sd": out["sd"],
            "item_se": math.nan, "acc_a": float(np.mean(speed[0])), "acc_b": float(np.mean(speed[1])),
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
    floor, floor_name = floor_of(floors, task, row.get("exclude", ()))
    lo, hi = floor_interval(floors, task, floor_name, rp.confidence)
    analytic = ANALYTIC_FLOORS.get(task, math.nan)
    bound = max((v for v in (hi if hi == hi else floor, analytic) if v == v), default=math.nan)
    chance = chance_of(floors, runs, task)
    fraction = dict(rp.learn_fraction_tasks).get(task, rp.learn_fraction)
    out = {**_empty(row), "floor": floor, "floor_baseline": floor_name, "floor_lo": lo, "floor_hi": hi,
           "analytic_floor": analytic, "floor_bound": bound if row["kind"] == "floor" else math.nan,
           "chance": chance, "learn_at": learnability.learn_threshold(chance, learning_floor(floors, task), fraction)}
    if row["kind"] == "paired":
        b_rows = cells.select(runs, task, row["b"], config)
        scored = items
        if row.get("teacher"):  # scored by agreement with the teacher (the gate still reads accuracy)
            t = runs[(runs.source == "teachers") & (runs.task == task) & (runs.arch == row["teacher"])]
            got = items.runs.get(t["dir"].iloc[0]) if len(t) else None
            if got is None:
                return out
            scored = items.agreeing_with(task, got[0], got[2], [*a_rows["dir"], *b_rows["dir"]])
        m = {**out, **(measure_speed(row, a_rows, b_rows, items, rp) if row["subset"] == SPEED
                       else measure_paired(row, a_rows, b_rows, items, rp, seed, row["margin"], scored))}
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


def family(t: pd.DataFrame) -> pd.DataFrame:
    """Every decision test of the decided rows, one line each (row position, member, p): a "+" row's
    directional two-sided t (held or failed) and its TOST (equivalent); a "0" row's TOST (held) and its
    non-equivalence test (failed); a "<=" row's directional t against the floor's bound (held or failed)."""
    members = {"+": ("p", "p_tost"), "0": ("p_tost", "p_out"), "<=": ("p",)}
    lines = [(i, col, r[col]) for i, r in enumerate(t.to_dict("records")) if r["decided"]
             for col in members.get(r["expect"], ())]
    return pd.DataFrame(lines, columns=["row", "member", "p"])


def _needed(r: dict, level: float, margin: float, rp) -> int | None:
    """Seeds for 80% power (rp.power) in the row's own direction at its Holm level: the directional t is
    two-sided, so one-sided at level / 2 for "+" and "<="; TOST at the level for "0". The sd is the row's
    per-seed sd made median-unbiased (:func:`stats.pilot_sd`), so a 3-seed look does not under-ask."""
    cap, sd = rp.max_seeds, stats.pilot_sd(r["seed_sd"], int(r["seeds"]))
    if r["expect"] == "0":
        return stats.seeds_for_tost(r["estimate"], margin, sd, level, rp.power, cap)
    effect = r["estimate"] if r["expect"] == "+" else r["floor_bound"] - (r["acc_a"])
    return stats.seeds_for_power(effect, sd, level / 2, rp.power, cap)


def _verdict(r: dict, alpha: float) -> str:
    """held / failed / equivalent / underpowered from the row's Holm-adjusted p-values (see :func:`family`)."""
    if r["expect"] == "0":
        return "held" if r["p_tost_holm"] < alpha else "failed" if r["p_out_holm"] < alpha else "underpowered"
    if r["p_holm"] < alpha:
        above = r["estimate"] > 0 if r["expect"] == "+" else r["acc_a"] > r["floor_bound"]
        return ("failed" if above else "held") if r["expect"] == "<=" else ("held" if above else "failed")
    return "equivalent" if r["expect"] == "+" and r["p_tost_holm"] < alpha else "underpowered"


def _needs_text(verdict: str, needed: int | None, seeds: int, cap: int) -> str:
    if verdict != "underpowered":
        return ""
    if seeds < 2:
        return "2+ (one seed: no seed-level variance to size from)"
    return str(needed) if needed is not None else f">{cap}"


def decide(table: pd.DataFrame, rp, alpha: float | None = None) -> pd.DataFrame:
    """One Holm family at ``alpha`` (default ``1 - rp.confidence``) over every decision test of the decided rows
    (those that ran, are not exact and have no gate ``reason``), each row's verdict and, if underpowered, the
    seeds needed for rp.power at its Holm level (``needs_seeds`` as text: capped at ">max_seeds"; a one-seed row
    has no variance to size from)."""
    alpha = 1 - rp.confidence if alpha is None else alpha
    if table.empty:
        return table.assign(p_holm=[], p_tost_holm=[], p_out_holm=[], verdict=[], seeds_needed=[], needs_seeds=[])
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
    verdicts, needed = [], []
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
        needed.append(_needed(r, level, r["margin"], rp) if v == "underpowered" else None)
        verdicts.append(v)
    t["verdict"] = verdicts
    t["seeds_needed"] = pd.array(needed, dtype="Int64")
    t["needs_seeds"] = [_needs_text(v, n, seeds, rp.max_seeds)
                        for v, n, seeds in zip(verdicts, needed, t.seeds, strict=True)]
    return t.drop(columns=["decided"])


COLUMNS = ["id", "finding", "kind", "task", "a", "b", "subset", "expect", "isolates", "margin", "margin_reason",
           "seeds", "items", "estimate", "ci_lo", "ci_hi", "ci_method", "p", "p_tost", "p_out", "seed_sd",
           "item_se", "acc_a", "acc_b", "in_a", "in_b", "learned_a", "learned_b", "learn_at", "chance", "floor",
           "floor_baseline", "floor_lo", "floor_hi", "analytic_floor", "floor_bound", "reason", "exact",
           "max_logit_diff", "context", "claim", "detail"]


def judge(params, runs: pd.DataFrame, items: cells.Items, floors: dict, disagreement: dict,
          seed: int, collisions: pd.DataFrame | None = None, seed_plan: dict | None = None,
          transfer_rates: dict | None = None) -> pd.DataFrame:
    """The ledger: one row per planned prediction with its measurement, gate, Holm p-values and verdict.

    Look 1 judges every row on ``train.seeds``; with a ``seed_plan`` (the ``plan`` stage's, :mod:`.seeds`), look 2
    judges the rows it continued on the seeds it gave them, and replaces their look-1 line. Each look is one
    Holm family at :func:`pipeline.report.seeds.look_alpha` (column ``look``)."""
    from pipeline.report import seeds as sequential

    rp = params.report
    check_margins(CONTRASTS, rp.equivalence_margin)
    alpha = sequential.look_alpha(params)
    first = _rows(params, runs, items, floors, disagreement, transfer_rates or {}, seed, set(params.train.seeds))
    ip = params.interface
    first += [{**r, "reason": "", "margin": math.nan, "margin_reason": ""}
              for r in collision_rows(collisions, ip.exact_tol, ip.atol)]
    table = decide(_frame(first), rp, alpha).assign(look=1)
    more = {r["id"]: set(r["seeds"]) for r in (seed_plan or {}).get("rows", []) if r["continued"]}
    if more and len(table):
        second = _rows(params, runs, items, floors, disagreement, transfer_rates or {}, seed, more)
        again = decide(_frame(second), rp, alpha).assign(look=2)
        order = list(table["id"])  # each continued row's look-2 line in place of its look-1 line
        table = pd.concat([table[~table["id"].isin(again["id"])], again]).set_index("id").loc[order].reset_index()
    return table


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
        rows.append({"id": row["id"], "finding": row["finding"], "kind": row["kind"], "task": row["task"],
                     "a": row["a"], "b": row["b"], "subset": row["subset"], "expect": row["expect"],
                     "isolates": row["isolates"], "margin": row["margin"], "margin_reason": row["margin_reason"],
                     "exact": False, "max_logit_diff": math.nan, **m, "reason": gate(row, m, rp.ceiling_tol),
                     "context": _context(row, reach, config, disagreement, transfer), "claim": row.get("claim", ""),
                     "detail": ""})
    return rows


def _context(row: dict, reach: pd.DataFrame, config: dict, disagreement: dict, transfer: dict) -> str:
    """What stands beside a row's numbers: a budget row's steps to the threshold; a distillation row's teachers'
    disagreement with the labels (on the students' images, or on the transfer set for a transfer row)."""
    if row["finding"] == "budget":
        return budget_context(reach, row, config)
    if not row["id"].startswith("distill."):
        return ""
    on_transfer = row["id"].startswith(("distill.transfer", "distill.inherit"))
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
    lead, and the README says it is undecided (a reader sees which findings this profile could not decide)."""
    if ledger.empty:
        return []
    order = {name: i for i, name in enumerate(FINDINGS)}
    out = []
    for name, g in sorted(ledger.groupby("finding", sort=False), key=lambda kv: order.get(kv[0], len(order))):
        ran = g[g.verdict != "not run"]
        decided = ran[ran.verdict != "uninformative"]
        out.append((name, g, (decided if len(decided) else ran if len(ran) else g).iloc[0]))
    return out
