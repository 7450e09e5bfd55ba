"""Figures and their presentation, on hand-built frames (real matplotlib on Agg, real pandas; no pipeline run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from pipeline import io, tracking
from pipeline.archs import ARCHS
from pipeline.report import dvc_plots
from pipeline.report import figures as fig
from pipeline.report.pages import size_points

ROOT = Path(__file__).resolve().parents[1]


def _ledger(**extra) -> pd.DataFrame:
    rows = [("alignment.stride.alignment", "alignment", "paired", 0.70, 0.61, 0.79, "held"),
            ("alignment.convstem.alignment", "alignment", "paired", 0.02, -0.002, 0.05, "inconclusive"),
            ("relation.shift.relation", "relation", "paired", 0.0, 0.0, 0.0, "uninformative"),
            ("floor.nomix.scale", "floors", "floor", -0.08, -0.10, -0.06, "held"),
            ("exact.vit_nopos.twins", "arrangement", "exact", np.nan, np.nan, np.nan, "held")]
    led = pd.DataFrame(rows, columns=["id", "finding", "kind", "estimate", "ci_lo", "ci_hi", "verdict"])
    return led.assign(needs_seeds=[np.nan, ">200", np.nan, np.nan, np.nan], **extra)


def _band_widths(ax) -> list[float]:
    """Widths of the shaded margin bands (fill_betweenx polygons; the error bars are line collections)."""
    polys = [c for c in ax.collections if isinstance(c, PolyCollection)]
    return sorted({round(float(c.get_paths()[0].get_extents().width), 3) for c in polys})


def _texts(figure) -> list:
    return [t for t in figure.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_fontsize"))
            if t.get_text().strip()]


def test_ledger_figure_groups_rows_and_greys_the_uninformative(tmp_path):
    led = _ledger(margin=[0.03, 0.03, 0.05, 0.02, np.nan],
                  reason=[None, None, "both arms at ceiling", None, None])
    figure = fig.ledger_figure(led, margin=0.03)
    ax = figure.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == list(led.id[:4])  # paired and floor rows, ledger order; the exact row has no interval
    grey = dict(zip(labels, (t.get_color() for t in ax.get_yticklabels()), strict=True))
    assert grey["relation.shift.relation"] == "0.55" and grey["alignment.stride.alignment"] == "0.1"
    lines = {ln.get_xydata()[0][1]: ln for ln in ax.get_lines() if ln.get_marker() in ("o", "X", "D")}  # not caps
    assert len(lines) == 4
    hollow = [ln for ln in lines.values() if mcolors.to_hex(ln.get_markerfacecolor()) == "#ffffff"]
    assert len(hollow) == 2  # inconclusive and uninformative decide nothing: hollow
    assert any(mcolors.to_hex(ln.get_color()).upper() == fig.VERDICT_STYLE["uninformative"]["color"] for ln in hollow)
    text = " ".join(t.get_text() for t in _texts(figure))
    assert "uninformative: both arms at ceiling" in text and "needs >200 seeds" in text
    assert all(h in text for h in ("alignment", "relation", "floors"))
    assert _band_widths(ax) == [0.04, 0.06, 0.1]  # the rows' own margins (+-0.02, 0.03, 0.05) shaded
    assert min(t.get_fontsize() for t in _texts(figure)) >= 8
    assert all(t.get_rotation() == 0 for t in ax.get_xticklabels() + ax.get_yticklabels())
    io.save_figure(figure, tmp_path / "ledger.png")
    assert (tmp_path / "ledger.png").stat().st_size > 0


def test_ledger_margin_falls_back_to_params():
    ax = fig.ledger_figure(_ledger(), margin=0.03).axes[0]
    assert _band_widths(ax) == [0.06]


@pytest.mark.parametrize("draw", [
    lambda: fig.ledger_figure(_ledger().iloc[0:0], 0.03),
    lambda: fig.cell_figure(pd.DataFrame(columns=["task", "arch", "mean"]), {}),
    lambda: fig.factor_figure(pd.DataFrame(columns=["arch", "x", "mean", "ci_lo", "ci_hi"]), "x", "t", panels=True),
    lambda: fig.size_figure(pd.DataFrame(columns=["task", "arch", "train_size", "mean"])),
    lambda: fig.learning_figure(pd.DataFrame(columns=fig.HISTORY_COLUMNS)),
    lambda: fig.window_bars(pd.DataFrame(columns=["factor", "arch", "value"]), "t"),
    lambda: fig.offset_figure(pd.DataFrame(columns=["arch", "dx", "dy", "acc"]), (0, 1)),
])
def test_a_figure_without_data_is_skipped(draw):
    assert draw() is None


def test_every_arch_has_its_own_colour_and_the_dvc_template_uses_them():
    names = list(ARCHS) + ["deit_vit"]
    rgb = np.array([mcolors.to_rgb(fig.colour(a)) for a in names])
    assert len({fig.colour(a) for a in names}) == len(names)
    dist = np.linalg.norm(rgb[:, None] - rgb[None], axis=-1) + np.eye(len(names))
    assert dist.min() > 0.12  # no two near-identical colours (tab20's pairs were ~0.1 apart in places)
    same = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if fig.style(a) == fig.style(b)]
    assert not same
    template = json.loads((ROOT / ".dvc/plots/arch_lines.json").read_text())
    scale = fig.vega_colour_scale()  # each arch's colour carried as data, so a legend lists only archs with points
    assert template["encoding"]["color"]["scale"] == {"range": {"field": "colour_"}}
    assert template["encoding"]["color"]["sort"] == scale["domain"]
    assert json.dumps(dict(zip(scale["domain"], scale["range"], strict=True))) in template["transform"][-1]["calculate"]
    assert template["encoding"]["y"]["scale"] == {"domain": [0, 1]}


def test_the_dvc_plot_template_is_generated_from_the_families():
    # A new family's PLOT_COLOUR reaches DVC's plots only through `python -m pipeline.report.dvc_plots`.
    assert (ROOT / dvc_plots.PATH).read_text() == dvc_plots.arch_lines_text(), \
        "regenerate it: python -m pipeline.report.dvc_plots"


def test_cell_heat_map_writes_numbers_and_k_of_n():
    cells = pd.DataFrame([("alignment", "vit", 0.34, 0.31, 0.37, False, 0, 5),
                          ("alignment", "resnet_s1", 0.84, 0.75, 0.93, True, 2, 5),
                          ("scale", "vit", 0.50, 0.48, 0.52, False, 0, 5)],
                         columns=["task", "arch", "mean", "ci_lo", "ci_hi", "bimodal", "k_escaped", "n"])
    figure = fig.cell_figure(cells, {"alignment": 0.385})
    text = [t.get_text() for t in _texts(figure)]
    assert {"0.34 ±0.03", "0.84 2/5", "0.50 ±0.02", "not run"} <= set(text)
    assert "alignment\nfloor 0.39" in text


def test_learning_curves_are_small_multiples_per_family():
    """Every logged point is read (loss at each step, validation at each check); the figure is one panel per
    (task, family): a family's own lines in colour, the other families' in grey behind."""
    records = [{"source": "runs", "task": "alignment", "arch": arch, "seed": s,
                "series": [{"step": k, "train/loss": 1.0 / (k + 1)} for k in range(0, 100, 2)],
                "curve": [{"step": 50, "train_loss": 0.1, "val_acc": 0.4}, {"step": 100, "val_acc": 0.6}]}
               for s in (0, 1) for arch in ("vit", "resnet")] + [
        {"source": "teachers", "task": "alignment", "arch": "resnet", "seed": 0,
         "curve": [{"step": 50, "val_acc": 0.9}]}]
    hist = fig.history_points(records)
    assert len(hist[hist.metric == "train/loss"]) == 200 and len(hist[hist.metric == "val/acc"]) == 8
    figure = fig.learning_figure(hist)
    vit_ax, resnet_ax = figure.axes[:2]
    assert (vit_ax.get_title(), resnet_ax.get_title()) == ("vit", "resnet")
    coloured = [line for line in vit_ax.get_lines() if line.get_color() != "0.85"]
    assert len(coloured) == 1 and list(coloured[0].get_xdata()) == [50, 100]  # seed mean at every validation
    assert len(vit_ax.get_lines()) == 2 and vit_ax.get_ylabel() == "alignment\nval accuracy"


def test_size_points_fall_back_to_the_main_size_cells():
    main = pd.DataFrame([("natural", "vit", 4000, 0.39, 0.37, 0.41)],
                        columns=["task", "arch", "train_size", "mean", "ci_lo", "ci_hi"])
    points = size_points(main.iloc[0:0], main)
    assert points.to_dict("records") == [{"x": 4000, "series": "natural/vit", "task": "natural", "arch": "vit",
                                          "mean": 0.39, "ci_lo": 0.37, "ci_hi": 0.41}]
    assert size_points(main.iloc[0:0], main.iloc[0:0]).empty


def test_run_names_show_the_seed_first_and_links_open_the_runs_table():
    assert tracking.run_label("train/vit_sincos_init/arrangement/n4000-t1000-s3-d0") == \
        "train/vit_sincos_init/arrangement/s3 n4000-t1000-d0"
    assert tracking.run_label("teacher/resnet/scale") == "teacher/resnet/scale"
    url = tracking.runs_url("http://127.0.0.1:5000/", "7")
    assert re.fullmatch(r"http://127\.0\.0\.1:5000/#/experiments/7/runs\?workflowType=machine_learning"
                        r"&viewStateShareKey=headline", url)
    tags = {"arch": "deit", "task": "scale", "seed": "1", "train_size": "4000", "steps": "1000", "data_seed": "0",
            "budget_mode": "steps", "teacher.arch": "resnet"}
    assert tracking.run_description(tags) == "deit on scale, seed 1, 4000 images, 1000 steps, teacher resnet"
