"""DVC stage ``report``: tables, figures, the prediction ledger and ``reports/README.md``.

Thin: read the tracked per-run metrics (:mod:`pipeline.report.sources`), aggregate over seeds
(:mod:`pipeline.report.aggregate`), judge the ledger (:mod:`pipeline.report.ledger`), write Markdown + CSV
tables, PNG figures, ``summary.json`` (``dvc metrics``) and the README. Absent inputs (no distillation, no
data-size curve) give tables that say "not run". Learning curves come from each run's metrics.json too.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import pandas as pd

from pipeline import io, tracking
from pipeline.config import load_params
from pipeline.errors import StageError
from pipeline.report import aggregate as agg
from pipeline.report import figures as fig
from pipeline.report import ledger, markdown, sources
from pipeline.stages.common import stage_main

CI_NOTE = f"Mean over seeds with a {{level:.0%}} interval: {agg.CI_METHOD}. Level 2 (measurement)."
LEDGER_NOTE = (
    "Predictions are functions of params and interface outputs only (pipeline/report/ledger.py), fixed before "
    "any accuracy is read. Interval: Student-t over seeds widened in quadrature by the test split's binomial "
    "error (all seeds share one test split); with one seed the binomial part alone. `equals`: held if the "
    "interval contains the value and is at most {width} wide, inconclusive if wider, failed if it excludes it. "
    "`greater`: the difference's interval above 0 held, below 0 failed, else inconclusive. Level `exact` = "
    "algebra (a failure means a bug); `qualitative` = a structural or literature expectation.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    for name in ("runs", "curve", "teachers", "interface", "budget"):
        ap.add_argument(f"--{name}", type=Path, default=None)
    ap.add_argument("--out", type=Path, required=True, help="reports directory (README.md, tables/, figures/)")
    return ap.parse_args(argv)


def _write_table(out: Path, name: str, title: str, note: str, df: pd.DataFrame, shown: pd.DataFrame | None = None,
                 empty: str = "not run") -> str:
    """``tables/<name>.csv`` (all columns, for tools) and ``tables/<name>.md`` (``shown``, for reading)."""
    io.write_with(out / "tables" / f"{name}.csv", lambda p: df.to_csv(p, index=False, float_format="%.6g"))
    io.write_text(out / "tables" / f"{name}.md",
                  markdown.table_page(title, note, df if shown is None else shown, empty))
    return f"tables/{name}.md"


def configured(m: dict, params) -> bool:
    """Is this run part of the grid params.yaml configures now? (Run folders persist across DVC reruns, so a
    task or architecture removed from the params would otherwise linger in the report.)"""
    t, d = params.train, params.distill
    grid = {"runs": ({*t.archs, *d.students}, t.tasks if m["arch"] in t.archs else d.tasks),
            "curve": (set(t.curve.archs), t.curve.tasks),
            "teachers": (set(d.teachers), d.tasks)}[m["source"]]
    return m["arch"] in grid[0] and m["task"] in grid[1]


@stage_main
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    params = load_params(args.params)
    rp, level, out = params.report, params.report.confidence, args.out
    records = [m for m in (sources.read_metrics(args.runs, "runs") + sources.read_metrics(args.curve, "curve")
                           + sources.read_metrics(args.teachers, "teachers")) if configured(m, params)]
    if not records:
        raise StageError(f"no metrics.json under {args.runs}, {args.curve} or {args.teachers}: nothing to report")
    runs, slices = agg.runs_frame(records), agg.slices_frame(records)
    chance = {t: 1 / k for t, k in runs.dropna(subset=["num_classes"]).groupby("task")["num_classes"].first().items()}
    iface = sources.read_json(args.interface / "summary.json" if args.interface else None) or {}
    reach = sources.read_json(args.interface / "reachability.json" if args.interface else None)

    acc = agg.accuracy_table(runs, level)
    slice_tab = agg.slice_table(slices, level)
    size_tab = agg.size_curve(runs, level)
    agree = sources.agreements(runs, dict(params.distill.students), list(params.distill.tasks))
    distill_tab = agg.distillation_table(runs, agree, level)
    iface_tab = agg.interface_table(iface)
    preds = ledger.predictions(params, reach, sources.read_widths(args.budget))
    ledger_tab = ledger.judge(preds, runs, slices, level, rp.decisive_width)
    counts = ledger.agreement_rate(ledger_tab)
    anchors = ledger.anchors_table(acc, list(params.distill.tasks), iface.get("key_numbers", {}))

    note = CI_NOTE.format(level=level)
    convention = next((r["budget"]["flops_convention"] for r in records if "flops_convention" in r.get("budget", {})),
                      "not recorded")
    tables = {
        "accuracy (task x architecture)": _write_table(
            out, "accuracy", "Test accuracy per task x architecture", note + " `shift_consistency`: share of "
            "test predictions unchanged under a 1-px cyclic x shift (seed mean).", acc,
            markdown.accuracy_matrix(acc)),
        "budget (counts and measurements)": _write_table(
            out, "budget", "Budget per run group (counts: level 3 analytic; wall time, images/s, peak RSS: "
            "measured, seed mean)", f"FLOPs convention: {convention}. Teacher compute (its forward on every "
            "student image, and its own training) is charged in full to every student (`total_flops_with_teacher`)"
            ".", agg.budget_table(runs)),
        "per-slice accuracy": _write_table(out, "slices", "Test accuracy per evaluation slice", note, slice_tab),
        "distillation attribution": _write_table(
            out, "distillation", "Distillation attribution: accuracy and agreement with each teacher",
            note + " `agree_<teacher>`: share of test samples on which the model predicts the same class as that "
            "teacher (seed mean, from predictions.npz).", distill_tab, empty="not run (distillation disabled)"),
        "data-size curve": _write_table(out, "size_curve", "Test accuracy vs training-set size", note, size_tab,
                                        empty="not run (no data-size curve)"),
        "interface checks": _write_table(out, "interface", "Interface checks (level 1, exact)", "From "
                                         "data/interface/summary.json; details in ../interface/interface.md.",
                                         iface_tab),
        "prediction ledger": _write_table(out, "ledger", "Prediction ledger",
                                          LEDGER_NOTE.format(width=rp.decisive_width), ledger_tab,
                                          markdown.ledger_view(ledger_tab)),
        "literature anchors": _write_table(out, "anchors", "Literature anchors vs our runs",
                                           "Paper numbers from docs/design.md §9; ours are 16 px images, ~100k "
                                           "parameters, minutes of CPU: far smaller, compared in direction only.",
                                           anchors),
    }

    figures = _figures(params, out, slice_tab, size_tab, runs, chance)
    summary = {"test_acc": {t: {r.arch: r["mean"] for _, r in g.iterrows()} for t, g in acc.groupby("task")},
               "ledger": counts, "interface": {"held": int(iface_tab.iloc[-1].held),
                                               "checked": int(iface_tab.iloc[-1].checked)}}
    io.write_json(out / "summary.json", markdown.nan_to_none(summary))
    links = {"interface checks (level 1)": "interface/interface.md", "architectures and budget": "budget/README.md",
             **{f"samples: {t}": f"samples/{t}.png" for t in params.tasks.names}}
    io.write_text(out / "README.md", markdown.readme(
        commit=tracking.git_commit(), date=dt.date.today().isoformat(), seeds=list(params.train.seeds),
        level=level, scale=f"{params.geometry.image_size} px images, ~{params.models.param_target:,} parameters, "
                           f"{params.train.recipe.steps} optimizer steps",
        sentences=markdown.findings(acc, chance, counts, iface_tab, distill_tab), tables=tables,
        figures=figures, links=links))


def _figures(params, out: Path, slice_tab, size_tab, runs, chance) -> dict[str, tuple[str, str]]:
    """Save every figure (and the wide CSVs DVC plots read); returns path -> (title, caption)."""
    g, t = params.geometry, params.tasks
    p = g.patch_size
    made: dict[str, tuple[str, str]] = {}

    # The wide CSVs behind dvc.yaml's `plots:` (one column per configured architecture, empty if not run).
    archs = [*params.train.archs, *(s for s in params.distill.students if s not in params.train.archs)]

    def save(name: str, figure, title: str, caption: str, curve: pd.DataFrame | None = None,
             columns: list[str] = archs):
        io.save_figure(figure, out / "figures" / f"{name}.png")
        if curve is not None:
            io.write_with(out / "tables" / f"plot_{name}.csv",
                          lambda f: agg.wide(curve, "x", columns).to_csv(f, index=False, float_format="%.6g"))
        made[f"figures/{name}.png"] = (title, caption)

    off = agg.factor_curve(slice_tab, "alignment", "dx")
    lo, hi = t.alignment.train_offsets
    save("alignment_offset", fig.factor_figure(off, "sub-patch offset dx (px)", "alignment: accuracy vs offset",
                                               chance.get("alignment"), (lo - 0.3, hi + 0.3), "training offsets"),
         "Accuracy vs sub-patch offset",
         f"Measurement: test accuracy per horizontal offset of the glyph to the {p} px patch grid (slices dx, "
         f"pooled over dy); grey band: offsets seen in training ({lo}..{hi} px).", off)
    size = agg.factor_curve(slice_tab, "scale", "size").assign(x=lambda d: d.x / p)
    slo, shi = t.scale.train_sizes
    save("scale_size", fig.factor_figure(size, f"object size / patch size P={p}", "scale: accuracy vs size",
                                         chance.get("scale"), (slo / p, shi / p), "training sizes",
                                         ((1.0, "one patch"),)),
         "Accuracy vs object size relative to the patch",
         f"Measurement: test accuracy per object size in units of the {p} px patch; grey band: sizes seen in "
         "training; dashed: one patch.", size)
    dist = agg.factor_curve(slice_tab, "relation", "distance_tokens")
    window_cells = params.models.swin.patch_size * params.models.swin.window_size / p
    save("relation_distance", fig.factor_figure(dist, f"Chebyshev distance between the marks ({p} px cells)",
                                                "relation: accuracy vs distance", chance.get("relation"),
                                                vlines=((window_cells, "Swin window (first stage)"),)),
         "Accuracy vs distance between the related marks",
         f"Measurement: test accuracy per mark distance in patch cells; dashed: the Swin window width "
         f"({window_cells:g} cells): marks farther apart never share a first-stage window.", dist)
    win = slice_tab[(slice_tab.task == "relation") & slice_tab.factor.isin(["window", "shifted_window"])]
    save("relation_window", fig.window_bars(win, "relation: same vs cross window", chance.get("relation")),
         "Relation accuracy by window membership",
         "Measurement: test accuracy on mark pairs inside one Swin window vs across windows, for the plain and "
         "the shifted (by half a window) partition.")
    save("data_size", fig.size_figure(size_tab), "Accuracy vs training-set size",
         "Measurement: test accuracy of the data-size curve runs (train.curve) per training-set size.",
         size_tab.rename(columns={"train_size": "x"}).assign(arch=lambda d: d.task + "/" + d.arch),
         [f"{task}/{arch}" for task in params.train.curve.tasks for arch in params.train.curve.archs])
    hist = sources.learning_histories(runs[runs.source == "runs"])
    save("learning_curves", fig.learning_figure(hist), "Learning curves",
         "Measurement: training loss and validation accuracy at every validation (optimizer steps), mean over "
         "seeds, main grid; from the curve in each run's metrics.json.")
    return made


if __name__ == "__main__":
    raise SystemExit(main())
