"""What the report writes: every table (with its note), every figure (with its caption), summary.json, README.

The stage (:mod:`pipeline.stages.report`) only parses paths and calls :func:`write_report`; the list of tables,
figures, captions and notes lives here.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import io, repository
from pipeline.archs import ARCHS
from pipeline.grid import configured_cells
from pipeline.report import aggregate as agg
from pipeline.report import (
    cells,
    collisions,
    contrasts,
    gate,
    inputs,
    learnability,
    ledger,
    markdown,
    measure,
    natural,
    seeds,
    sources,
    stats,
)
from pipeline.report import figures as fig
from pipeline.report.inputs import Inputs
from pipeline.tasks import TASKS
from pipeline.trained import read_model

CELL_NOTE = ("Per cell: the mean over seeds of each seed's accuracy on the shared test items, with a {level:.0%} "
             "Student-t interval over seeds (the seed is the unit of replication; one seed: no interval); "
             "`k_escaped` of `n` seeds reached test accuracy {thr} (Clopper-Pearson `k_ci`). A cell where some "
             "seeds escape and some do not is bimodal; with fewer than {min_seeds} seeds it says 'needs more "
             "seeds'. Level 2 (measurement).")
LEDGER_NOTE = ("Rows and their margins are fixed in pipeline/report/contrasts.csv before any accuracy is read. "
               "`paired`: a - b per seed on the same test items (twin pairs averaged first), a paired t interval "
               "over seeds; `floor`: a against the task's shortcut floor, judged against the floor's upper bound "
               "(Wilson on its test items, or the analytic bound where larger); `exact`: judged exactly. A paired "
               "row is decided only when both arms learned the task in distribution and they are not both at the "
               "ceiling or at chance on the compared slice; otherwise it is `uninformative`, with the reason. "
               "Every decision (directional t, TOST equivalence within the row's margin, the floor test) of a "
               "look is one Holm family ({looks}). Verdicts: held (the predicted direction, significant) / failed "
               "(significant the other way) / not equivalent (a '0' row outside its margin, significant) / "
               "equivalent (TOST) / uninformative / inconclusive (with the smallest effect it could detect at its "
               "seeds, and the seeds 80% power needs at the row's Holm level for its smallest effect of interest, "
               "`sesoi` in contrasts.csv, from the per-seed sd made median-unbiased for the variance); default margin "
               "{margin}. docs/methods.md states the rules.")

LOOKS = ("two looks, 1 - report.confidence spent in the first look's share of plan.max_seeds: look 1 at alpha "
         "{a1:.3g} judges every row on train.seeds; look 2 at alpha {a2:.3g}, over every row again, judges the rows "
         "the plan stage continued on an inverse-normal combination of look 1 and their new seeds alone (the others "
         "at p = 1), their estimate over all their seeds (column `look`)")


def _looks(params) -> str:
    a1, a2 = stats.look_alphas(params)
    return LOOKS.format(a1=a1, a2=a2) if stats.second_look(params) else f"one look at alpha {a1:.3g}"


SEEDS_NOTE = ("The plan stage reads the first look's ledger ({first} seeds per cell) and continues each paired or "
              "floor row that is informative but inconclusive when its power calculation asks for at most "
              "plan.max_seeds ({cap}) seeds, and each row uninformative only because an arm is split (some of its "
              "seeds learned, some not), to report.min_seeds_bimodal seeds; train_more trains its cells at the new "
              "seeds and look 2 judges it on them (docs/methods.md, Sequential seeds). `look1`: the first look's "
              "verdict; `seeds`: the seeds the row is judged on; `price_kvit`: what the extra seeds of a row the rules "
              "continue cost, in thousands of ViT-step equivalents (its cells' first-look steps times each model's "
              "relative step cost; rows are bought cheapest first, a cell shared with a cheaper row counted once; "
              "{budget}); `why`: the rule that applied.")

COLLISION_NOTE = ("Per task and seed (main grid, first test items by pool index): every patch of each image gets a "
                  "random pattern from the trained vit's patch-projection null space (unit RMS per normalised "
                  "pixel). `vit_max_diff_*`: largest logit change of the trained vit (exact algebra predicts 0; "
                  "float64 and float32); `other_*`: the same for the trained resnet, `*_flips`: share of "
                  "predictions changed. `share_discarded`: share of the per-position class-mean patch signal "
                  "that lies in the null space, beside `share_random` = null_dim / D for a random subspace. "
                  "Level 1 on trained weights (pipeline/report/collisions.py).")


def load(params, records: list[dict], tasks_dir: Path | None, slices_dir: Path | None,
         shortcuts_dir: Path | None, teachers_dir: Path | None, interface: dict,
         seed_plan: dict | None = None) -> Inputs:
    """:func:`pipeline.report.inputs.load` and the null-space check on trained weights, which only the report
    prints."""
    inp = inputs.load(params, records, tasks_dir, slices_dir, shortcuts_dir, teachers_dir, interface, seed_plan)
    return replace(inp, collisions=trained_collisions(params, inp.runs, inp.items.pools, tasks_dir))


def trained_collisions(params, runs: pd.DataFrame, pools: dict, tasks_dir: Path | None,
                       arms: tuple[str, str] = ("vit", "resnet")) -> pd.DataFrame:
    """The null-space check on the kept weights of ``arms`` (main grid, every task and seed both ran)."""
    config, n = cells.main_config(runs), params.report.collision_items
    pairs = []
    for task in sorted(pools):
        a, b = (cells.select(runs, task, arm, config).drop_duplicates("seed").set_index("seed") for arm in arms)
        test = pools[task]["subsets"].get("test")
        seeds = sorted(set(a.index) & set(b.index))
        if test is None or not seeds:
            continue
        index = np.sort(test)[:n]
        if (images := sources.read_images(tasks_dir, task, index)) is None:
            continue
        for seed in seeds:
            at = params.for_task(task)  # its canvas: the models were built at it
            models = [read_model(r.dir, r.model, at, int(r.num_classes)) for r in (a.loc[seed], b.loc[seed])]
            if any(m is None for m in models):
                continue
            pairs.append({"task": task, "seed": int(seed), "vit": models[0], "other": models[1],
                          "other_arch": arms[1], "images": images, "labels": pools[task]["labels"][index],
                          "patch": at.geometry.patch_size})
    return collisions.collision_table(pairs, int(params.seed))


def _table(out: Path, name: str, title: str, note: str, df: pd.DataFrame, shown: pd.DataFrame | None = None,
           empty: str = "not run") -> str:
    """``tables/<name>.csv`` (all columns, for tools) and ``tables/<name>.md`` (``shown``, for reading)."""
    io.write_with(out / "tables" / f"{name}.csv", lambda p: df.to_csv(p, index=False, float_format="%.6g"))
    io.write_text(out / "tables" / f"{name}.md",
                  markdown.table_page(title, note, df if shown is None else shown, empty))
    return f"tables/{name}.md"


AGREEMENT_NOTE = (
    "Per task, arm and teacher type: the share of items on which the arm predicts what its own teacher of that type "
    "predicts (a student: the teacher it learned from; any other arm: the teacher its seed pairs with; a teacher: "
    "the other type's teacher of its seed), mean over seeds with its seed-level t interval ({level:.0%}: seeds "
    "span teachers too), on `where`: `test` (every test item), `ood` (unseen factor values), `teacher_wrong` (the "
    "items that teacher gets wrong) and `ood_teacher_wrong` (the unseen items it gets wrong: a transfer student "
    "that agrees there inherited the teacher's bias, since no label says so; the relabel control, the same "
    "teacher's predictions permuted within each factor value and class, shows what errors of that shape alone "
    "give). `items`: how many items the rate is over.")


def tables(inp: Inputs, out: Path, seed: int) -> tuple[dict[str, str], dict[str, pd.DataFrame]]:
    """Write every table; returns (name -> path, the frames the figures and summary reuse)."""
    rp, runs = inp.params.report, inp.runs
    config = cells.main_config(runs)
    cell_tab = cells.cell_table(runs, inp.items, rp, seed)
    main = cell_tab[(cell_tab.train_size == config.get("train_size")) & (cell_tab.steps == config.get("steps"))
                    & (cell_tab.data_seed == 0)] if config else cell_tab
    size_tab = pd.concat([cells.size_cells(cell_tab, config),  # a size grid inside data/runs, and data/curve
                          cells.cell_table(inp.curve_runs.assign(source="runs"), inp.items, rp,
                                           seed).assign(curve="matched steps"),
                          cells.exposure_cells(cell_tab, epoch_points(inp.params))])
    slice_tab = cells.slice_table(runs, inp.items, config, rp, seed)
    led = ledger.judge(inp.params, runs, inp.items, inp.floors, inp.disagreement, seed, inp.collisions,
                       inp.seed_plan, inp.transfer_disagreement)
    learn = learnability_table(inp, config)
    floors = markdown.floors_line(inp.floors)
    flags = markdown.floor_flags(inp.floors)
    if flags:
        floors += f" Does not measure its factor (floor within 0.1 of the ceiling): {', '.join(flags)}."
    note = CELL_NOTE.format(level=rp.confidence, thr=rp.escape_threshold, min_seeds=rp.min_seeds_bimodal)
    if escape := markdown.escape_line(inp.floors, rp.escape_threshold):
        note += f" {escape}"
    distill_paths, distill_frame = distillation_tables(inp, out, config)
    paths = {
        "accuracy (every cell)": _table(out, "accuracy", "Test accuracy per cell", f"{note}\n\n{floors}", cell_tab,
                                        markdown.accuracy_matrix(main)),
        "per-slice accuracy": _table(out, "slices", "Test accuracy per evaluation slice (main grid)",
                                     f"{note}\n\n{floors}", slice_tab),
        "prediction ledger": _table(out, "ledger", "Prediction ledger", LEDGER_NOTE.format(
            looks=_looks(inp.params),
            margin=rp.equivalence_margin) + f"\n\n{floors}", led, markdown.ledger_view(led)),
        "seeds per row (sequential seeds)": _table(
            out, "seeds", "Seeds per ledger row: the first look, and the rows the plan continued",
            SEEDS_NOTE.format(first=len(inp.params.train.seeds), cap=inp.params.plan.max_seeds,
                              budget="no plan.budget" if (b := inp.params.plan.budget) is None else
                              f"within plan.budget {b:g}"),
            seeds.seeds_table(inp.seed_plan), empty="no plan (the plan stage did not run)"),
        "learnability (in distribution, steps to criterion, out of distribution)": _table(
            out, "learnability", "Learnability: who learned each task, how fast, and how it generalised",
            learn_note(inp, config), learn, learnability.learnability_view(learn)),
        "budget (counts and measurements)": _table(
            out, "budget", "Budget per run group", "One row per run configuration (a FLOPs-matched grid and another "
            "data draw are rows of their own). Counts: analytic; steps, images, tokens and FLOPs differ from seed to "
            "seed where runs stop at the criterion: seed mean to a whole count, the steps' range beside. Wall time, "
            "images/s, peak RSS: measured, seed mean. Teacher compute is charged in full to every student.",
            agg.budget_table(runs)),
        **distill_paths,
        "data-size curve": _table(out, "size_curve", "Test accuracy vs training-set size", f"{note}\n\n{floors}",
                                  size_tab, empty="not run (no data-size curve)"),
        "collisions on trained weights": _table(
            out, "collisions", "Patch-projection null space on trained weights", COLLISION_NOTE, inp.collisions,
            empty="not run (no vit and resnet runs with kept weights on the same task and seed)"),
        "interface checks": _table(out, "interface", "Interface checks (level 1, exact)", "From "
                                   "data/interface/summary.json; details in ../interface/interface.md.",
                                   agg.interface_table(inp.interface)),
    }
    paths.update(natural_tables(inp, out, main, size_tab, floors))
    return paths, {"cells": cell_tab, "main": main, "size": size_tab, "slices": slice_tab, "ledger": led,
                   "distillation": distill_frame,
                   "learnability": learn}


DISTILLATION_NOTE = (
    "Main grid (one training configuration) and the teachers: each teacher type is several teachers (one per "
    "seed, each on its own draw of the teacher set), so a teacher row's `seeds` counts teachers and its interval "
    "is over teachers. `teacher_disagrees`: the type's teachers against the true labels on the students' training "
    "images (mean over its teachers, from their provenance), `teacher_disagrees_transfer` on the task's transfer "
    "set (unseen factor values, which a transfer student learns only from its teacher's targets; the relabel "
    "control from that teacher's predictions permuted within each factor value and class; the oracle from the "
    "true labels). `acc_id`, `acc_ood`: accuracy in and out of distribution, seed mean with its seed-level t "
    "interval (`_lo`, `_hi`). `agree_<teacher>`: share of test items predicted like its own teacher of that type "
    "(seed mean); `agree_ood_<teacher>`: the same on the out-of-distribution slice; `agree_wrong_<teacher>`: on "
    "the items that teacher gets wrong, where only an inherited bias makes a student agree (a label-trained model "
    "agrees there by chance or by a shared error), `agree_ood_wrong_<teacher>` on the unseen items it gets wrong. "
    "Seed-level intervals of every agreement: the distillation agreement table; paired contrasts with CIs: the "
    "ledger (the `teachers/ood` rows: the unseen items one teacher type gets right and the other wrong, by "
    "majority over each type's teachers). `constant_seeds`: the arm's seeds that predict one class for every test "
    "item; such a seed agrees with a teacher wherever the teacher says that class, so its agreements show no "
    "inherited bias.")


def distillation_tables(inp: Inputs, out: Path, config: dict) -> tuple[dict[str, str], pd.DataFrame]:
    """The distillation rows' arms (students, deit_labels, vit) in the main grid beside the teachers: accuracy
    in and out of distribution, each teacher's disagreement, and every agreement with a teacher. Returns the
    tables' paths and the attribution frame (the distillation figure draws it)."""
    rp, runs, d = inp.params.report, inp.runs, inp.params.distill
    arms = sorted({c[arm] for c in contrasts.CONTRASTS if c["id"].startswith("distill.") for arm in ("a", "b")})
    taught = sorted({t for teacher in d.teachers for t in d.teacher_tasks(teacher)})
    distilled = pd.concat([runs[runs.source == "teachers"], *(cells.select(runs, t, a, config) for a in arms
                                                              for t in taught)])
    agree = sources.agreements(distilled, arms, taught, inp.items)
    accuracy = cells.slice_accuracy(distilled, inp.items, ("slice/id", "slice/ood"), rp.confidence)
    table = agg.distillation_table(distilled, agree, accuracy, inp.disagreement, inp.transfer_disagreement)
    return {
        "distillation attribution": _table(
            out, "distillation", "Distillation: accuracy and agreement with each teacher", DISTILLATION_NOTE,
            table, empty="not run (distillation disabled)"),
        "distillation agreement (seed-level intervals)": _table(
            out, "distillation_agreement", "Distillation: agreement with the teacher, with seed-level intervals",
            AGREEMENT_NOTE.format(level=rp.confidence), agg.agreement_table(agree, rp.confidence),
            empty="not run (distillation disabled)"),
    }, table


def learnability_table(inp: Inputs, config: dict) -> pd.DataFrame:
    """The learnability table at the main configuration, gated by the ledger's floors and learn fractions."""
    rp = inp.params.report
    floor = {t: measure.learning_floor(inp.floors, t) for t in sorted(set(inp.runs.task))}
    return learnability.learnability_table(inp.runs, config, inp.floors, floor,
                                           learnability.criterion_accuracy(inp.params),
                                           lambda task: learnability.learn_fraction(rp, task), rp.confidence)


def learn_note(inp: Inputs, config: dict) -> str:
    rp = inp.params.report
    per_task = dict(getattr(rp, "learn_fraction_tasks", None) or {})
    fractions = f"{getattr(rp, 'learn_fraction', 0.5):g}" + "".join(f"; {t} {f:g}" for t, f in sorted(per_task.items()))
    shown = ", ".join(f"{k} {v}" for k, v in config.items()) or "none"
    return learnability.NOTE.format(config=shown, level=rp.confidence, fractions=fractions,
                                    criterion=learnability.criterion_accuracy(inp.params))


def epoch_points(params) -> dict[str, list[tuple[int, int, str]]]:
    """Per grid with ``epochs``: its curve's name and (train_size, steps, budget_mode) at each size."""

    t = params.train
    return {f"matched epochs ({g.epochs})": [(n, g.steps_at(n, t.recipe)[0], g.budget_mode or t.recipe.budget_mode)
                                             for n in g.sizes or [t.size]]
            for g in t.grids.values() if g.epochs is not None}


def natural_tables(inp: Inputs, out: Path, main: pd.DataFrame, size_tab: pd.DataFrame, floors: str) -> dict:
    """Level 3 (natural images): subgroups, resolution + the position contract, literature anchors."""
    level = inp.params.report.confidence
    main_runs = [m for m in inp.records if m.get("source") == "runs"]
    contract = natural.position_contract()
    smoke = natural.evidence_level(main, float((inp.floors.get("natural") or {}).get("floor", math.nan)))
    res_note = ("Seed mean with a Student-t interval over seeds (the seed is the unit of replication). Position "
                "contract (pipeline/resolution.py):\n\n" + markdown.md_table(contract, "not recorded"))
    return {
        "natural images: subgroups": _table(
            out, "natural_subgroups", "CIFAR-10: pre-specified subgroups", "Seed mean with a Student-t interval over "
            "seeds; `consistency`: share of predictions unchanged "
            f"against the untransformed image.\n\n{floors}", natural.subgroup_table(main_runs, level)),
        "natural images: resolution": _table(out, "resolution", "Accuracy at other resolutions", res_note,
                                             natural.resolution_table(main_runs, level)),
        "literature anchors": _table(out, "anchors", "Literature anchors vs our runs", "Every paper number "
                                     "cites its source table; anchors that could not be traced were dropped. "
                                     "Ours: CIFAR-10 cell means (paired CIs: the ledger), far smaller models."
                                     + (f"\n\n{smoke}" if smoke else ""), natural.anchors_table(main, size_tab)),
        "natural images: training views": _table(
            out, "views", "Training views on and off (the augmentation minimal pair)", natural.VIEWS_NOTE.format(
                level=level), natural.views_table(inp.runs, level), empty="not run (no grid with augment: false)"),
        "expected vs measured": _table(
            out, "expected", "Each expected cell beside its measurement", natural.EXPECTED_NOTE,
            natural.expected_table(main, inp.params.report.expected), empty="no expected ranges in report.expected"),
    }


def lead_rows(led: pd.DataFrame) -> pd.DataFrame:
    """Each finding's lead row (ledger.leads) with its status in short words: what the leads figure draws."""
    rows = []
    for name, group, lead in ledger.leads(led)[:markdown.MAX_FINDINGS]:
        status = markdown.finding_status(name, group, lead)["label"]
        short = status.split(" (")[0]
        if short == "undecided":
            reason = str(lead.get("reason"))
            short += ": " + (lead.verdict if lead.verdict == "inconclusive" else gate.why_short(reason))
        label = lead.get("label") if isinstance(lead.get("label"), str) and lead.get("label") else lead["id"]
        rows.append({**lead.to_dict(), "finding": name, "label": label, "status": short})
    return pd.DataFrame(rows)


def figure_list(inp: Inputs, out: Path, frames: dict) -> dict[str, tuple[str, str]]:
    """Save every figure; returns path -> (title, caption), in the order the README embeds them."""
    made: dict[str, tuple[str, str]] = {}
    not_run: list[str] = []

    def save(name: str, figure, title: str, caption: str) -> None:
        path = out / "figures" / f"{name}.png"
        if figure is None:  # nothing to draw in this profile: no file (a stale one would mislead), not embedded
            path.unlink(missing_ok=True)
            not_run.append(title)
            return
        io.save_figure(figure, path)
        made[f"figures/{name}.png"] = (title, caption)

    floor = {k: v.get("floor") for k, v in inp.floors.items()}
    _ledger_figures(inp, frames, save, floor)
    curves = _factor_figures(inp, frames, save, floor)
    _distillation_and_size_figures(inp, frames, save)
    plot_tables(inp, out, curves, frames["size"], frames["main"])
    save("learning_curves", fig.learning_figure(fig.history_points(inp.records)), "Learning curves",
         "Measurement: validation accuracy at every validation per optimizer step, seed mean; one row per task, "
         "one column per family (its architectures in colour, the others grey). Each run's training loss: MLflow.")
    return with_not_run(made, not_run)


def _ledger_figures(inp: Inputs, frames: dict, save, floor: dict) -> None:
    """The lead rows, the whole ledger, and accuracy per cell."""
    save("leads", fig.leads_figure(lead_rows(frames["ledger"]), inp.params.report.equivalence_margin),
         "The findings' lead rows", "Each finding's pre-registered lead row: its estimate with the 95% CI (none "
         "where the row decides nothing: the status says why), the equivalence margin shaded; the marker gives the "
         "row's verdict as in the ledger figure below.")
    save("ledger", fig.ledger_figure(frames["ledger"], inp.params.report.equivalence_margin),
         "The prediction ledger at a glance", "Every paired and floor row of the [ledger](tables/ledger.md), grouped "
         "by finding: estimate with its 95% CI, 0 marked, the equivalence margin shaded; marker and colour give the "
         "verdict, hollow rows decide nothing yet (inconclusive) or at all (grey: uninformative).")
    save("accuracy", fig.cell_figure(frames["main"], floor), "Accuracy per architecture and task",
         "Measurement: main grid, mean over seeds x test items and half its seed-level t interval; bold k/n: "
         "seeds reaching the escape threshold where the cell is bimodal; each task's shortcut floor in its header.")


def _factor_figures(inp: Inputs, frames: dict, save, floor: dict) -> dict[str, pd.DataFrame]:
    """Accuracy against each task's factor (offset, size, distance, window); returns the curves DVC plots too."""
    t, patch = inp.params.tasks, {task: inp.params.for_task(task).geometry.patch_size for task in TASKS}
    p = patch["alignment"]
    grid = cells.offset_grid(inp.runs, inp.items, cells.main_config(inp.runs))  # once: the figure and its CSV
    lo, hi = t.alignment.train_offsets
    save("alignment_offset", fig.offset_figure(grid, (lo, hi)),
         "Alignment accuracy per (dx, dy) offset",
         f"Measurement: accuracy per sub-patch offset of the glyph to the {p} px grid, dx and dy kept apart; the "
         f"white box holds the offsets seen in training ({lo}..{hi} px in both), everything outside is unseen.")
    p = patch["scale"]
    size = agg.factor_curve(frames["slices"], "scale", "size").assign(x=lambda d: d.x / p)
    slo, shi = t.scale.train_sizes
    save("scale_size", fig.factor_figure(size, f"object size / patch size P={p}", "scale: accuracy vs size",
                                         floor.get("scale"), (slo / p, shi / p), "training sizes",
                                         ((1.0, "one patch"),), panels=True),
         "Accuracy vs object size relative to the patch", "Measurement: accuracy per object size in patches, one "
         "panel per family (the others in light grey); grey band: sizes seen in training; dashed: one patch; "
         "dotted: shortcut floor.")
    dist = agg.factor_curve(frames["slices"], "relation", "distance_tokens")
    p, swin = patch["relation"], inp.params.for_task("relation").models.swin
    window_cells = swin.patch_size * swin.window_size / p
    save("relation_distance", fig.factor_figure(dist, f"Chebyshev distance between the marks ({p} px cells)",
                                                "relation: accuracy vs distance", floor.get("relation"),
                                                vlines=((window_cells, "Swin window (first stage)"),),
                                                integer=True),
         "Accuracy vs distance between the related marks", "Measurement: accuracy per mark distance in patch "
         f"cells; dashed: the Swin window width ({window_cells:g} cells); dotted: shortcut floor.")
    s = frames["slices"]
    win = s[(s.task == "relation") & s.factor.isin(["window", "shifted_window"])]
    save("relation_window", fig.window_bars(win, "relation: marks in the same vs different windows",
                                            floor.get("relation")),
         "Relation accuracy by window membership", "Measurement: mark pairs inside one Swin window (solid) vs "
         "across windows (hatched), plain and shifted partition; dotted: shortcut floor.")
    return {"alignment_offset": dx_curve(grid, (lo, hi)), "scale_size": size, "relation_distance": dist}


def _distillation_and_size_figures(inp: Inputs, frames: dict, save) -> None:
    """Distillation's arms and teachers at unseen factor values, and accuracy vs training-set size."""
    ood_floor = {task: measure.floor_of(inp.floors, task, subset="slice/ood")[0] for task in inp.floors}
    save("distillation", fig.distillation_figure(frames["distillation"], ood_floor),
         "Distillation: teachers and students at unseen factor values",
         "Measurement: out-of-distribution accuracy of every distillation arm (seed mean, seed-level 95% CI over "
         "(teacher, seed) pairs) and of the teachers (mean over each type's teachers, interval over teachers); a "
         "student's colour is its teacher type's; dotted: the slice's shortcut floor. The rows that separate the "
         "teachers' bias from label availability are in the ledger (`distill.*`).")
    save("data_size", fig.size_figure(frames["size"]), "Accuracy vs training-set size",
         "Measurement: the data-size curve runs, mean with a seed-level t interval per training-set size.")


def with_not_run(made: dict[str, tuple[str, str]], not_run: list[str]) -> dict[str, tuple[str, str]]:
    """The figures not drawn in this profile, named under the last figure's caption (markdown.readme embeds
    every entry it gets, so they cannot be entries of their own)."""
    if not_run and made:
        last = list(made)[-1]
        title, caption = made[last]
        made[last] = (title, f"{caption}\n\nNot run in this profile (no figure): {'; '.join(not_run)}.")
    return made


def dx_curve(grid: pd.DataFrame, train_range: tuple[int, int]) -> pd.DataFrame:
    """Accuracy per dx over the rows whose dy lies in the training range (dy unseen offsets are not pooled in)."""
    lo, hi = train_range
    sub = grid[(grid.dy >= lo) & (grid.dy <= hi)]
    return sub.groupby(["arch", "dx"], as_index=False)["acc"].mean().rename(columns={"dx": "x", "acc": "mean"})


def plot_tables(inp: Inputs, out: Path, curves: dict[str, pd.DataFrame], size_tab: pd.DataFrame,
                main: pd.DataFrame | None = None) -> None:
    """The CSVs behind dvc.yaml's `plots:`: one column per architecture of the table and per configured one
    (empty where not run: DVC draws a plot with an empty column, but none at all when a listed column is missing,
    and every profile shares dvc.yaml's lists), and the data-size points in long form (see :func:`size_points`)."""
    archs = list(dict.fromkeys([*ARCHS, *configured_cells(inp.params)]))
    for name, curve in curves.items():
        io.write_with(out / "tables" / f"plot_{name}.csv",
                      lambda f, c=curve: agg.wide(c, "x", archs).to_csv(f, index=False, float_format="%.6g"))
    points = size_points(size_tab, main if main is not None else size_tab.iloc[0:0])
    io.write_with(out / "tables" / "plot_data_size.csv",
                  lambda f: points.to_csv(f, index=False, float_format="%.6g"))


SIZE_POINT_COLUMNS = ["x", "series", "task", "arch", "mean", "ci_lo", "ci_hi"]


def size_points(size_tab: pd.DataFrame, main: pd.DataFrame) -> pd.DataFrame:
    """Long rows (x, series, task, arch, mean, CI) for the data-size plot: DVC's y is ``mean`` and the template
    colours by ``arch``, so a profile draws whatever it ran, with no column list to keep in step. A profile without
    the data-size grid gets the main-size points (one x per cell) rather than an empty plot."""
    src = size_tab if len(size_tab) else main
    if src is None or src.empty:
        return pd.DataFrame(columns=SIZE_POINT_COLUMNS)
    rows = src.assign(x=src.train_size, series=src.task + "/" + src.arch)
    return rows[SIZE_POINT_COLUMNS].sort_values(["series", "x"]).reset_index(drop=True)


def summary(frames: dict, floors: dict) -> dict:
    """reports/summary.json (dvc metrics): a few headline numbers, so `dvc exp show` stays narrow."""
    led, main = frames["ledger"], frames["main"]
    # keyed by the lead row too: profiles can lead a finding with different rows, and `dvc metrics diff` must
    # never subtract two different contrasts
    lead = {f"{name}/{row.id}": float(row.estimate) for name, _, row in ledger.leads(led)[:markdown.MAX_FINDINGS]}
    return markdown.nan_to_none({
        "ledger": {k.replace(" ", "_"): v for k, v in markdown.verdict_counts(led).items()},
        **informative_counts(led),
        "finding": lead,
        "floor": {t: float(r.get("floor", float("nan"))) for t, r in sorted(floors.items())},
        "bimodal_cells": int(main["bimodal"].sum()) if len(main) else 0,
    })


def informative_counts(led: pd.DataFrame) -> dict:
    """summary.json's informative / uninformative rows per row type (paired, floor, exact, budget)."""
    rows = markdown.row_counts(led)
    return {key: {t: c[key] for t, c in rows.items()} for key in ("informative", "uninformative")}


def write_report(inp: Inputs, out: Path) -> None:
    """Every table, figure, summary.json and README.md under ``out``."""
    params = inp.params
    seed = int(params.seed)
    paths, frames = tables(inp, out, seed)
    made = figure_list(inp, out, frames)
    io.write_json(out / "summary.json", summary(frames, inp.floors))
    links = {"interface checks (level 1)": "interface/interface.md", "architectures and budget": "budget/README.md",
             "matched tuning (each cell's learning-rate trials and choice)": "tune/tuning.md",
             **{f"samples: {t}": f"samples/{t}.png" for t in params.tasks.names}}
    zoomed = ", ".join(f"{t} at {params.for_task(t).geometry.image_size} px" for t in params.tasks.names
                       if getattr(params.tasks, t).zoom > 1)
    scale = (f"{params.geometry.image_size} px images" + (f" ({zoomed})" if zoomed else "")
             + f", ~{params.models.param_target:,} parameters, minutes of CPU")
    io.write_text(out / "README.md", markdown.readme(
        commit=repository.git_commit(), date=dt.date.today().isoformat(), level=params.report.confidence,
        scale=scale, sentences=markdown.findings(frames["ledger"], 1 - params.report.confidence),
        exploratory=markdown.exploratory_line(frames["ledger"]), floors_text=markdown.floors_line(inp.floors),
        counts=markdown.verdict_counts(frames["ledger"]), tables=paths, figures=made, links=links,
        rows=markdown.row_counts(frames["ledger"])))
