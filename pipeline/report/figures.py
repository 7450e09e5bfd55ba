"""Figures from aggregated frames (no file access: the stage saves them with :func:`pipeline.io.save_figure`).

Every curve frame has columns arch, x, mean, ci_lo, ci_hi (Student-t over seeds; NaN with one seed, then the
mean is drawn without an interval). Titles name what is shown and whether it is measured or counted.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; no display on the pipeline machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def _lines(ax, curve: pd.DataFrame, x: str = "x") -> None:
    for arch, g in curve.groupby("arch", sort=True):
        g = g.sort_values(x)
        err = np.vstack([g["mean"] - g["ci_lo"], g["ci_hi"] - g["mean"]])
        ax.errorbar(g[x], g["mean"], yerr=None if np.isnan(err).all() else err, marker="o", ms=3,
                    capsize=2, label=arch)


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"{what}: not run", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def factor_figure(curve: pd.DataFrame, xlabel: str, title: str, chance: float | None = None,
                  shade: tuple[float, float] | None = None, shade_label: str = "training range",
                  vlines: tuple[tuple[float, str], ...] = ()):
    """Test accuracy vs one factor, one line per architecture (measurement)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if curve.empty:
        _empty(ax, title)
        return fig
    if shade is not None:
        ax.axvspan(*shade, color="0.9", label=shade_label)
    for xv, label in vlines:
        ax.axvline(xv, color="0.4", ls="--", lw=1, label=label)
    if chance is not None:
        ax.axhline(chance, color="0.6", ls=":", lw=1, label=f"chance {chance:.2f}")
    _lines(ax, curve)
    ax.set(xlabel=xlabel, ylabel="test accuracy (mean over seeds, 95% t-CI)", title=title, ylim=(-0.02, 1.02))
    ax.legend(fontsize=7, loc="best")
    return fig


def window_bars(table: pd.DataFrame, title: str, chance: float | None = None):
    """Accuracy on relation pairs that share a Swin window vs cross one (measurement); table rows of the
    slice table with factor in (window, shifted_window)."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4), sharey=True)
    for ax, factor in zip(axes, ("window", "shifted_window"), strict=True):
        sub = table[table.factor == factor]
        if sub.empty:
            _empty(ax, factor)
            continue
        archs = sorted(sub.arch.unique())
        for j, value in enumerate(("same", "cross")):
            rows = sub[sub.value == value].set_index("arch").reindex(archs)
            err = np.vstack([rows["mean"] - rows["ci_lo"], rows["ci_hi"] - rows["mean"]])
            ax.bar(np.arange(len(archs)) + (j - 0.5) * 0.4, rows["mean"], width=0.4, label=value,
                   yerr=None if np.isnan(err).all() else err, capsize=2)
        if chance is not None:
            ax.axhline(chance, color="0.6", ls=":", lw=1)
        ax.set_xticks(range(len(archs)), archs, rotation=30, fontsize=7)
        ax.set(title=f"{factor}: marks in the same / different window", ylim=(0, 1.02))
        ax.legend(fontsize=7)
    axes[0].set_ylabel("test accuracy (mean, 95% t-CI)")
    fig.suptitle(title, fontsize=9)
    return fig


def size_figure(curve: pd.DataFrame):
    """Test accuracy vs training-set size (log x), one panel per task (measurement)."""
    tasks = sorted(curve.task.unique()) if not curve.empty else []
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(4.5 * max(1, len(tasks)), 3.4), squeeze=False)
    if not tasks:
        _empty(axes[0, 0], "data-size curve")
        return fig
    for ax, task in zip(axes[0], tasks, strict=True):
        _lines(ax, curve[curve.task == task].rename(columns={"train_size": "x"}))
        ax.set_xscale("log")
        ax.set(title=f"{task}: accuracy vs training-set size", xlabel="training images (log scale)",
               ylabel="test accuracy (mean, 95% t-CI)", ylim=(-0.02, 1.02))
        ax.legend(fontsize=7)
    return fig


def learning_figure(hist: pd.DataFrame):
    """Per task: train/loss and val/acc vs optimizer step, seed mean per architecture (measurement)."""
    tasks = sorted(hist.task.unique()) if not hist.empty else []
    fig, axes = plt.subplots(2, max(1, len(tasks)), figsize=(3.6 * max(1, len(tasks)), 5.6), squeeze=False,
                             layout="constrained")
    if not tasks:
        _empty(axes[0, 0], "learning curves")
        axes[1, 0].set_axis_off()
        return fig
    for j, task in enumerate(tasks):
        for i, (metric, label) in enumerate((("train/loss", "training loss (per step)"),
                                             ("val/acc", "validation accuracy"))):
            ax = axes[i, j]
            sub = hist[(hist.task == task) & (hist.metric == metric)]
            for arch, g in sub.groupby("arch", sort=True):
                m = g.groupby("step")["value"].mean()
                if metric == "train/loss" and len(m) > 20:  # per-step loss is noisy: a rolling mean of 10 logs
                    m = m.rolling(10, min_periods=1).mean()
                ax.plot(m.index, m.values, lw=1, label=arch)
            ax.set(title=f"{task}", xlabel="optimizer step", ylabel=label)
            if i == 1:
                ax.set_ylim(-0.02, 1.02)
    axes[0, 0].legend(fontsize=6)
    return fig
