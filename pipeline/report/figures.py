"""Figures from aggregated frames (no file access: the stage saves them with :func:`pipeline.io.save_figure`).

One colour per architecture in every panel of every figure (:func:`colour`, fixed by the order of
:data:`pipeline.archs.ARCHS`), one legend per figure covering every panel, placed outside the axes so it never
covers data. Error bars are the report's intervals (hierarchical bootstrap); bimodal cells carry "k/n".
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; no display on the pipeline machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

FALLBACK_ORDER = ("vit", "vit_nopos", "vit_sincos", "vit_sincos_init", "vit_convstem", "vit_overlap", "deit",
                  "deit_labels", "deit_vit", "swin", "swin_noshift", "swin_local", "resnet", "resnet_s1",
                  "resnet_aa", "nomix")
CI_LABEL = "test accuracy (mean, 95% bootstrap CI)"


def arch_order() -> list[str]:
    """The one architecture list (pipeline.archs when present), students not in it appended."""
    try:
        from pipeline.archs import ARCHS
        names = list(ARCHS)
    except ImportError:
        names = []
    return names + [a for a in FALLBACK_ORDER if a not in names]


def colour(arch: str) -> tuple:
    """A fixed colour per architecture (tab20 by the order of :func:`arch_order`; unknown names after it)."""
    order = arch_order()
    i = order.index(arch) if arch in order else len(order) + sum(map(ord, arch))
    i %= 20
    return plt.get_cmap("tab20")(2 * (i % 10) + i // 10)  # the ten dark colours first, then their light pairs


def _legend(fig, archs, extra: tuple = ()) -> None:
    """One legend for the whole figure, right of the panels (covers no data)."""
    handles = [Line2D([], [], color=colour(a), marker="o", lw=1.5, label=a) for a in archs] + list(extra)
    if handles:
        fig.legend(handles=handles, loc="outside right upper", fontsize=7, frameon=False)


def _errorbars(ax, g: pd.DataFrame, arch: str, x: str = "x") -> None:
    g = g.sort_values(x).astype({"mean": float, "ci_lo": float, "ci_hi": float})
    err = np.vstack([g["mean"] - g["ci_lo"], g["ci_hi"] - g["mean"]]).clip(min=0)
    ax.errorbar(g[x], g["mean"], yerr=None if np.isnan(err).all() else err, marker="o", ms=3, capsize=2,
                color=colour(arch), lw=1.2)


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"{what}: not run", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _sorted_archs(frame: pd.DataFrame) -> list[str]:
    order = arch_order()
    return sorted(frame["arch"].unique(), key=lambda a: (order.index(a) if a in order else len(order), a))


def factor_figure(curve: pd.DataFrame, xlabel: str, title: str, floor: float | None = None,
                  shade: tuple[float, float] | None = None, shade_label: str = "training range",
                  vlines: tuple[tuple[float, str], ...] = ()):
    """Test accuracy vs one factor, one line per architecture (measurement); dotted: the shortcut floor."""
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    if curve.empty:
        _empty(ax, title)
        return fig
    extra = []
    if shade is not None:
        ax.axvspan(*shade, color="0.9")
        extra.append(matplotlib.patches.Patch(color="0.9", label=shade_label))
    for xv, label in vlines:
        ax.axvline(xv, color="0.4", ls="--", lw=1)
        extra.append(Line2D([], [], color="0.4", ls="--", label=label))
    if floor is not None and floor == floor:
        ax.axhline(floor, color="0.3", ls=":", lw=1)
        extra.append(Line2D([], [], color="0.3", ls=":", label=f"shortcut floor {floor:.2f}"))
    archs = _sorted_archs(curve)
    for arch in archs:
        _errorbars(ax, curve[curve.arch == arch], arch)
    ax.set(xlabel=xlabel, ylabel=CI_LABEL, title=title, ylim=(-0.02, 1.02))
    _legend(fig, archs, tuple(extra))
    return fig


def cell_figure(cells: pd.DataFrame, floors: dict[str, float]):
    """Per task: every architecture's mean with its CI; "k/n" (seeds reaching the escape threshold) beside the
    bimodal cells; dotted: the task's shortcut floor."""
    tasks = sorted(cells.task.unique()) if not cells.empty else []
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(3.4 * max(1, len(tasks)) + 1.5, 3.6), squeeze=False,
                             layout="constrained", sharey=True)
    if not tasks:
        _empty(axes[0, 0], "accuracy")
        return fig
    archs = _sorted_archs(cells)
    for ax, task in zip(axes[0], tasks, strict=True):
        sub = cells[cells.task == task].set_index("arch")
        shown = [a for a in archs if a in sub.index]
        for i, a in enumerate(shown):
            r = sub.loc[[a]].iloc[0]
            err = None if r.ci_lo != r.ci_lo else [[max(r["mean"] - r.ci_lo, 0)], [max(r.ci_hi - r["mean"], 0)]]
            ax.errorbar([i], [r["mean"]], yerr=err, marker="o", color=colour(a), capsize=2)
            if r.bimodal:
                ax.annotate(f"{r.k_escaped}/{r.n}", (i, r["mean"]), xytext=(4, 0), textcoords="offset points",
                            fontsize=6, va="center")
        if (f := floors.get(task)) is not None and f == f:
            ax.axhline(f, color="0.3", ls=":", lw=1)
        ax.set_xticks(range(len(shown)), shown, rotation=60, fontsize=6)
        ax.set(title=task, ylim=(-0.02, 1.02))
    axes[0, 0].set_ylabel(CI_LABEL)
    _legend(fig, archs, (Line2D([], [], color="0.3", ls=":", label="shortcut floor"),
                         Line2D([], [], ls="", label="k/n: seeds reaching\nthe escape threshold (bimodal)")))
    return fig


def offset_figure(grid: pd.DataFrame, train_range: tuple[int, int]):
    """Alignment accuracy per (dx, dy) offset, one heatmap per architecture: in-distribution offsets (inside
    the box: both dx and dy in the training range) and unseen ones kept apart, never pooled."""
    archs = _sorted_archs(grid) if not grid.empty else []
    cols = max(1, min(4, len(archs)))
    rows = max(1, -(-len(archs) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols + 1.2, 2.5 * rows), squeeze=False,
                             layout="constrained")
    if not archs:
        _empty(axes[0, 0], "alignment offsets")
        return fig
    lo, hi = train_range
    image = None
    for ax, arch in zip(axes.flat, archs, strict=False):
        piv = grid[grid.arch == arch].pivot_table(index="dy", columns="dx", values="acc")
        image = ax.imshow(piv.to_numpy(), vmin=0, vmax=1, cmap="viridis", origin="lower",
                          extent=(piv.columns.min() - 0.5, piv.columns.max() + 0.5, piv.index.min() - 0.5,
                                  piv.index.max() + 0.5))
        ax.add_patch(matplotlib.patches.Rectangle((lo - 0.5, lo - 0.5), hi - lo + 1, hi - lo + 1, fill=False,
                                                  ec="white", lw=1.5))
        ax.set_title(arch, fontsize=8, color=colour(arch))
        ax.set(xlabel="dx (px)", ylabel="dy (px)")
    for ax in list(axes.flat)[len(archs):]:
        ax.set_axis_off()
    fig.colorbar(image, ax=axes, label="test accuracy (mean over seeds)", shrink=0.8)
    fig.suptitle("alignment: accuracy per sub-patch offset (white box: offsets seen in training)", fontsize=9)
    return fig


def window_bars(table: pd.DataFrame, title: str, floor: float | None = None):
    """Relation accuracy on mark pairs in one window (solid) vs across windows (hatched), per partition;
    one colour per architecture."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True, layout="constrained")
    archs = _sorted_archs(table) if not table.empty else []
    for ax, factor in zip(axes, ("window", "shifted_window"), strict=True):
        sub = table[table.factor == factor] if not table.empty else table
        if sub.empty:
            _empty(ax, factor)
            continue
        shown = [a for a in archs if a in set(sub.arch)]
        for j, (value, hatch) in enumerate((("same", ""), ("cross", "///"))):
            rows = sub[sub.value == value].set_index("arch").reindex(shown)
            err = np.vstack([rows["mean"] - rows["ci_lo"], rows["ci_hi"] - rows["mean"]]).clip(min=0)
            ax.bar(np.arange(len(shown)) + (j - 0.5) * 0.4, rows["mean"], width=0.4, hatch=hatch,
                   color=[colour(a) for a in shown], edgecolor="0.2", yerr=None if np.isnan(err).all() else err,
                   capsize=2)
        if floor is not None and floor == floor:
            ax.axhline(floor, color="0.3", ls=":", lw=1)
        ax.set_xticks(range(len(shown)), shown, rotation=30, fontsize=7)
        ax.set_title(f"{factor} partition", fontsize=8)
        ax.set_ylim(0, 1.02)
    axes[0].set_ylabel(CI_LABEL)
    fig.suptitle(title, fontsize=9)
    from matplotlib.patches import Patch
    _legend(fig, archs, (Patch(facecolor="white", edgecolor="0.2", label="same window"),
                         Patch(facecolor="white", edgecolor="0.2", hatch="///", label="cross windows"),
                         Line2D([], [], color="0.3", ls=":", label="shortcut floor")))
    return fig


def size_figure(curve: pd.DataFrame):
    """Test accuracy vs training-set size (log x), one panel per task (measurement)."""
    tasks = sorted(curve.task.unique()) if not curve.empty else []
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(4.5 * max(1, len(tasks)) + 1.5, 3.4), squeeze=False,
                             layout="constrained")
    if not tasks:
        _empty(axes[0, 0], "data-size curve")
        return fig
    for ax, task in zip(axes[0], tasks, strict=True):
        sub = curve[curve.task == task].rename(columns={"train_size": "x"})
        for arch in _sorted_archs(sub):
            _errorbars(ax, sub[sub.arch == arch], arch)
        ax.set_xscale("log")
        ax.set(title=f"{task}: accuracy vs training-set size", xlabel="training images (log scale)",
               ylabel=CI_LABEL, ylim=(-0.02, 1.02))
    _legend(fig, _sorted_archs(curve))
    return fig


def learning_figure(hist: pd.DataFrame):
    """One row per task: train/loss and val/acc vs optimizer step, seed mean per architecture (measurement).
    Tall rather than wide, so a plot viewer that fits the width (DVC's) shows it whole."""
    tasks = sorted(hist.task.unique()) if not hist.empty else []
    fig, axes = plt.subplots(max(1, len(tasks)), 2, figsize=(9, 2.4 * max(1, len(tasks)) + 0.6), squeeze=False,
                             layout="constrained")
    if not tasks:
        _empty(axes[0, 0], "learning curves")
        axes[0, 1].set_axis_off()
        return fig
    for i, task in enumerate(tasks):
        for j, (metric, label) in enumerate((("train/loss", "training loss"), ("val/acc", "validation accuracy"))):
            ax = axes[i, j]
            sub = hist[(hist.task == task) & (hist.metric == metric)]
            for arch in _sorted_archs(sub) if len(sub) else []:
                m = sub[sub.arch == arch].groupby("step")["value"].mean()
                if metric == "train/loss" and len(m) > 20:  # per-step loss is noisy: a rolling mean of 10 logs
                    m = m.rolling(10, min_periods=1).mean()
                ax.plot(m.index, m.values, lw=1, color=colour(arch))
            ax.set_title(f"{task}: {label}", fontsize=8)
            ax.set(xlabel="optimizer step" if i == len(tasks) - 1 else None)
            if j == 1:
                ax.set_ylim(-0.02, 1.02)
    _legend(fig, _sorted_archs(hist))
    return fig
