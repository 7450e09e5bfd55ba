"""Figures from aggregated frames (no file access: the stage saves them with :func:`pipeline.io.save_figure`).

One style per architecture in every panel of every figure (:func:`style`: its family's colour-blind-safe
``PLOT_COLOUR``, and a marker per figure panel (a family; the DeiT
students apart), so two similar colours in different families still differ). One legend per figure, outside
the axes so it never covers data. Error bars are the report's intervals (Student-t over seeds); bimodal cells
carry "k/n". Text is >= 8 pt at the saved size and no tick label is rotated. A figure function returns None
when it has nothing to draw: the report then writes no file and lists the figure as not run (an empty canvas
says nothing).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; no display on the pipeline machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pipeline.archs import ARCHS  # noqa: E402
from pipeline.families import PLOT_COLOUR  # noqa: E402
from pipeline.report.gate import SPEED  # noqa: E402

FALLBACK_ORDER = ("vit", "vit_nopos", "vit_sincos", "vit_sincos_init", "vit_convstem", "vit_overlap",
                  "vit_hybrid", "deit", "deit_labels", "deit_vit", "swin", "swin_noshift", "swin_local", "resnet",
                  "resnet_s1", "resnet_aa", "nomix", "mixer", "convmixer")
CI_LABEL = "test accuracy (mean, 95% CI)"
FONT = 9  # points; the embedded figures are viewed at 100%
# Okabe-Ito and Paul Tol's muted/bright colours (colour-blind safe), ordered so that architectures next to each
# other in ARCHS (a control beside its partner) get clearly different hues; yellow and sand are left out (pale).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#882255", "#999933", "#332288",
           "#44AA99", "#AA4499", "#000000", "#CC6677", "#117733", "#777777", "#DDAA33", "#EE3377", "#6699CC",
           "#661100", "#88CCEE", "#BBBBBB")
PANEL_MARKER = {"vit": "o", "deit": "D", "swin": "s", "resnet": "^", "mixer": "X", "convmixer": "P"}
GRID_ALPHA = 0.3

plt.rcParams.update({"font.size": FONT, "axes.titlesize": FONT, "axes.labelsize": FONT, "xtick.labelsize": 8,
                     "ytick.labelsize": 8, "legend.fontsize": 8, "figure.titlesize": FONT + 1})


def arch_order() -> list[str]:
    """The one architecture list (pipeline.archs), students not in it appended."""
    return list(ARCHS) + [a for a in FALLBACK_ORDER if a not in ARCHS]


def panel(arch: str) -> str:
    """The figure group of ``arch``: its family in pipeline.archs, except that the DeiT students (``deit*``: a
    distillation question, not an architecture one) get their own; a name not listed there by its first part."""
    if arch.startswith("deit"):
        return "deit"
    return ARCHS[arch].family if arch in ARCHS else arch.split("_")[0]


def colour(arch: str) -> str:
    """The architecture's colour in every figure: its family's ``PLOT_COLOUR``; any other name (a DeiT student)
    from PALETTE by :func:`arch_order`, unknown names hashed into it."""
    if arch in PLOT_COLOUR:
        return PLOT_COLOUR[arch]
    order = arch_order()
    i = order.index(arch) if arch in order else len(order) + sum(map(ord, arch))
    return PALETTE[i % len(PALETTE)]


def style(arch: str) -> dict:
    """Matplotlib keywords for one architecture: its colour and its family's marker."""
    return {"color": colour(arch), "marker": PANEL_MARKER.get(panel(arch), "o")}


def _legend(fig, archs, extra: tuple = (), loc: str = "outside right upper") -> None:
    """One legend for the whole figure, outside the panels (covers no data)."""
    handles = [Line2D([], [], lw=1.5, label=a, **style(a)) for a in archs] + list(extra)
    if handles:
        fig.legend(handles=handles, loc=loc, frameon=False)


def _errorbars(ax, g: pd.DataFrame, arch: str, x: str = "x", **kw) -> None:
    g = g.sort_values(x).astype({"mean": float, "ci_lo": float, "ci_hi": float})
    err = np.vstack([g["mean"] - g["ci_lo"], g["ci_hi"] - g["mean"]]).clip(min=0)
    ax.errorbar(g[x], g["mean"], yerr=None if np.isnan(err).all() else err, ms=4, capsize=2, lw=1.2,
                **{**style(arch), **kw})


def _sorted_archs(frame: pd.DataFrame) -> list[str]:
    order = arch_order()
    return sorted(frame["arch"].unique(), key=lambda a: (order.index(a) if a in order else len(order), a))


def _accuracy_axis(ax, label: str | None = CI_LABEL) -> None:
    ax.set_ylim(-0.02, 1.02)
    ax.grid(axis="y", alpha=GRID_ALPHA)
    if label:
        ax.set_ylabel(label)


# --------------------------------------------------------------------------- the ledger (the study's answer)
# Verdict -> how its row is drawn. Rows that decide nothing are hollow; `uninformative` ones also grey, text too.
VERDICT_STYLE = {
    "held": {"marker": "o", "color": "#009E73", "filled": True},
    "failed": {"marker": "X", "color": "#D55E00", "filled": True},
    "not equivalent": {"marker": "X", "color": "#CC79A7", "filled": True},
    "equivalent": {"marker": "D", "color": "#0072B2", "filled": True},
    "inconclusive": {"marker": "o", "color": "#E69F00", "filled": False},
    "uninformative": {"marker": "o", "color": "#9A9A9A", "filled": False},
    "not run": {"marker": "x", "color": "#9A9A9A", "filled": False},
}
OTHER_VERDICT = {"marker": "s", "color": "#9A9A9A", "filled": False}
GREY_VERDICTS = ("uninformative", "not run")
MARGIN_COLOUR = "#56B4E9"


def ledger_rows(led: pd.DataFrame) -> pd.DataFrame:
    """The rows a forest plot can show (paired and floor: an estimate with an interval), grouped by finding in
    the order findings first appear, ledger order within each."""
    if led.empty or "kind" not in led:
        return led.iloc[0:0]
    rows = led[led.kind.isin(["paired", "floor"])].copy()
    for c in ("estimate", "ci_lo", "ci_hi"):
        rows[c] = pd.to_numeric(rows[c], errors="coerce")
    rank = {f: i for i, f in enumerate(dict.fromkeys(rows.finding))}
    return rows.assign(_rank=rows.finding.map(rank)).sort_values("_rank", kind="stable").drop(columns="_rank")


def ledger_layout(rows: pd.DataFrame) -> tuple[list[float], list[tuple[float, str]]]:
    """y of every row (top to bottom) and (y, finding) of each group's header line above its rows."""
    ys, headers, y = [], [], 0.0
    for finding, group in rows.groupby("finding", sort=False):
        headers.append((y, str(finding)))
        ys += [y + 1 + i for i in range(len(group))]
        y += len(group) + 1.6  # the header line and a small gap between groups
    return ys, headers


def _verdict_note(r) -> str:
    """The text right of a row: its verdict, with the seeds needed or the reason it decides nothing."""
    v = str(r.verdict)
    seeds = getattr(r, "needs_seeds", None)
    reason = getattr(r, "reason", None)
    if isinstance(reason, str) and reason.strip():
        text = reason.strip()
        return f"{v}: {text[:70]}{'...' if len(text) > 70 else ''}"
    if v == "inconclusive" and seeds == seeds and seeds is not None and str(seeds).strip():
        # the ledger's needs_seeds is text: "12", ">200", "2+ (one seed: ...)"
        return f"{v} (needs {str(seeds).split(' (')[0]} seeds)"
    return v


def _row_mark(ax, r, y: float, margin: float, half: float, **style) -> None:
    """One ledger row at height ``y``: its equivalence margin shaded around 0, its estimate with the 95% CI in its
    verdict's marker and colour (nothing where it has no estimate)."""
    st = VERDICT_STYLE.get(str(r.verdict), OTHER_VERDICT)
    ax.fill_betweenx([y - half, y + half], -margin, margin, color=MARGIN_COLOUR, alpha=0.18, lw=0)
    if r.estimate != r.estimate:
        return
    err = None if r.ci_lo != r.ci_lo else [[max(r.estimate - r.ci_lo, 0)], [max(r.ci_hi - r.estimate, 0)]]
    ax.errorbar([r.estimate], [y], xerr=err, marker=st["marker"], color=st["color"],
                mfc=st["color"] if st["filled"] else "white", mec=st["color"], mew=1.4, **style)


def ledger_figure(led: pd.DataFrame, margin: float):
    """Forest plot of the ledger: per row its estimate (a - b, or a - shortcut floor) with the CI, 0 marked, the
    equivalence margin (the row's ``margin`` column, else ``margin``) shaded; marker and colour say the verdict."""
    rows = ledger_rows(led)
    if rows.empty:
        return None
    ys, headers = ledger_layout(rows)
    height = 0.19 * (ys[-1] + 2) + 1.3
    fig, ax = plt.subplots(figsize=(13, height), layout="constrained")
    margins = pd.to_numeric(rows["margin"], errors="coerce").fillna(margin) if "margin" in rows else \
        pd.Series(margin, index=rows.index)
    for y, r, m in zip(ys, rows.itertuples(), margins, strict=True):
        _row_mark(ax, r, y, m, half=0.42, ms=6, capsize=2, lw=1.3)
        grey = str(r.verdict) in GREY_VERDICTS
        ax.annotate(_verdict_note(r), (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=8,
                    color="0.55" if grey else "0.15", annotation_clip=False)
    ax.axvline(0, color="0.2", lw=1)
    labels = rows["label"].where(rows["label"].notna() & (rows["label"] != ""), rows["id"]) if "label" in rows \
        else rows["id"]
    tasks = rows["task"] if "task" in rows else pd.Series("", index=rows.index)
    ax.set_yticks(ys, [f"{lab} ({task})" if task and str(task) not in str(lab) else str(lab)
                       for lab, task in zip(labels, tasks, strict=True)])
    for label, r in zip(ax.get_yticklabels(), rows.itertuples(), strict=True):
        label.set_color("0.55" if str(r.verdict) in GREY_VERDICTS else "0.1")
    for y, finding in headers:
        ax.annotate(finding, (0, y), xycoords=("axes fraction", "data"), xytext=(-6, 0), textcoords="offset points",
                    ha="right", va="center", fontweight="bold", fontsize=FONT, annotation_clip=False)
        ax.axhline(y + 0.3, color="0.85", lw=0.8)
    ax.set_ylim(ys[-1] + 1, -1)  # top to bottom, as in the table
    ax.tick_params(axis="x", labeltop=True, top=True)
    ax.grid(axis="x", alpha=GRID_ALPHA)
    subsets = rows["subset"].astype(str) if "subset" in rows else pd.Series([], dtype=str)
    others = [text for seen, text in ((subsets.str.startswith("agree/").any(), "agreement points on agree/ rows"),
                                      ((subsets == SPEED).any(), f"share of the step cap on {SPEED}"))
              if seen]
    unit = "accuracy points" + (f" ({'; '.join(others)})" if others else "")
    ax.set_xlabel(f"estimate, {unit}: a - b (paired rows) or a - shortcut floor (floor rows); 95% CI")
    seen = list(dict.fromkeys(str(v) for v in rows.verdict))
    handles = [Line2D([], [], ls="", marker=s["marker"], ms=6, color=s["color"], mec=s["color"],
                      mfc=s["color"] if s["filled"] else "white", label=v)
               for v in seen for s in [VERDICT_STYLE.get(v, OTHER_VERDICT)]]
    handles.append(Patch(color=MARGIN_COLOUR, alpha=0.35, label="equivalence margin"))
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), frameon=False)
    return fig


def leads_figure(leads: pd.DataFrame, margin: float):
    """One row per finding: its lead row's estimate with the 95% CI, labelled in words ("finding: what it
    compares"), the equivalence margin shaded, the finding's status on the right; the full ledger figure follows."""
    if leads.empty:
        return None
    rows = leads.copy()
    for c in ("estimate", "ci_lo", "ci_hi", "margin"):
        rows[c] = pd.to_numeric(rows[c], errors="coerce")
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(rows) + 1.2), layout="constrained")
    for y, r in enumerate(rows.itertuples()):
        _row_mark(ax, r, y, r.margin if r.margin == r.margin else margin, half=0.35, ms=7, capsize=3, lw=1.6)
        ax.annotate(r.status, (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=FONT,
                    color="0.15", annotation_clip=False)
    ax.axvline(0, color="0.2", lw=1)
    ax.set_yticks(range(len(rows)), [f"{r.finding}: {r.label}" for r in rows.itertuples()], fontsize=FONT)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.grid(axis="x", alpha=GRID_ALPHA)
    ax.set_xlabel("lead row's estimate, accuracy points (a - b, or a - shortcut floor); 95% CI; shaded: margin")
    return fig


# --------------------------------------------------------------------------- accuracy per cell
def _text_colour(value: float) -> str:
    return "white" if value < 0.55 else "black"  # viridis is dark below about the middle


def cell_figure(cells: pd.DataFrame, floors: dict[str, float]):
    """Heat map architecture x task of the main-grid mean, the number in each cell with its CI half-width, or
    "k/n" (seeds reaching the escape threshold) where the cell is bimodal; each task's floor in its header."""
    if cells.empty:
        return None
    tasks, archs = sorted(cells.task.unique()), _sorted_archs(cells)
    cell = {(r.arch, r.task): r for r in cells.itertuples()}
    grid = np.array([[float(cell[(a, t)].mean) if (a, t) in cell else np.nan for t in tasks] for a in archs])
    fig, ax = plt.subplots(figsize=(1.15 * len(tasks) + 2.8, 0.34 * len(archs) + 1.3), layout="constrained")
    ax.set_facecolor("0.93")  # cells not run
    image = ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=1, cmap="viridis", aspect="auto")
    for i, a in enumerate(archs):
        for j, t in enumerate(tasks):
            if (r := cell.get((a, t))) is None:
                ax.text(j, i, "not run", ha="center", va="center", fontsize=8, color="0.45")
                continue
            half = (r.ci_hi - r.ci_lo) / 2 if r.ci_lo == r.ci_lo else np.nan
            detail = f"{r.k_escaped}/{r.n}" if bool(r.bimodal) else ("" if half != half else f"±{half:.2f}")
            ax.text(j, i, f"{r.mean:.2f} {detail}".strip(), ha="center", va="center", fontsize=8,
                    color=_text_colour(r.mean), fontweight="bold" if bool(r.bimodal) else "normal")
        ax.plot([-0.018], [i], ms=6, ls="", clip_on=False, transform=ax.get_yaxis_transform(),
                **style(a))  # the arch's colour and marker: ties the row to the other figures
    heads = [t if (f := floors.get(t)) is None or f != f else f"{t}\nfloor {f:.2f}" for t in tasks]
    ax.set_xticks(range(len(tasks)), heads)
    ax.set_yticks(range(len(archs)), archs)
    ax.tick_params(axis="y", pad=16, length=0)
    ax.tick_params(axis="x", top=True, labeltop=True, bottom=False, labelbottom=False, length=0)
    ax.set_xlabel("mean ± half the 95% CI; bold k/n: a bimodal cell, k of n seeds reaching the escape threshold")
    fig.colorbar(image, ax=ax, label="test accuracy (mean over seeds x items)", shrink=0.7)
    return fig


# --------------------------------------------------------------------------- accuracy vs one factor
def _panel_groups(archs: list[str]) -> list[tuple[str, list[str]]]:
    groups: dict[str, list[str]] = {}
    for a in archs:
        groups.setdefault(panel(a), []).append(a)
    return list(groups.items())


def _factor_marks(ax, floor, shade, vlines) -> None:
    if shade is not None:
        ax.axvspan(*shade, color="0.9")
    for xv, _ in vlines:
        ax.axvline(xv, color="0.4", ls="--", lw=1)
    if floor is not None and floor == floor:
        ax.axhline(floor, color="0.3", ls=":", lw=1)


def _factor_extra(floor, shade, shade_label, vlines) -> list:
    extra = [Patch(color="0.9", label=shade_label)] if shade is not None else []
    extra += [Line2D([], [], color="0.4", ls="--", label=label) for _, label in vlines]
    if floor is not None and floor == floor:
        extra.append(Line2D([], [], color="0.3", ls=":", label=f"shortcut floor {floor:.2f}"))
    return extra


def factor_figure(curve: pd.DataFrame, xlabel: str, title: str, floor: float | None = None,
                  shade: tuple[float, float] | None = None, shade_label: str = "training range",
                  vlines: tuple[tuple[float, str], ...] = (), panels: bool = False, integer: bool = False):
    """Test accuracy vs one factor, one line per architecture (measurement); dotted: the shortcut floor.
    ``panels``: one panel per family, the DeiT students apart (:func:`panel`; the others in light grey behind),
    so many lines stay apart. ``integer``: a factor that takes whole values only gets whole ticks."""
    if curve.empty:
        return None
    archs = _sorted_archs(curve)
    groups = _panel_groups(archs) if panels else [("", archs)]
    cols = min(3, len(groups))
    rows = -(-len(groups) // cols)
    w, h = (3.4, 2.7) if panels else (5.6, 3.4)
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols + 1.6, h * rows + 0.6), squeeze=False,
                             sharex=True, sharey=True, layout="constrained")
    for ax, (fam, members) in zip(axes.flat, groups, strict=False):
        _factor_marks(ax, floor, shade, vlines)
        for other in (a for a in archs if a not in members):  # context: where the other families lie
            g = curve[curve.arch == other].sort_values("x")
            ax.plot(g.x, g["mean"], color="0.82", lw=0.9, zorder=1)
        for arch in members:
            _errorbars(ax, curve[curve.arch == arch], arch)
        _accuracy_axis(ax, None)
        if fam:
            ax.set_title(f"{fam} family", fontsize=FONT)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_axis_off()
    if integer:
        axes[0, 0].xaxis.set_major_locator(MaxNLocator(integer=True))  # shared x: every panel's ticks
    fig.supxlabel(xlabel, fontsize=FONT)
    fig.supylabel(CI_LABEL, fontsize=FONT)
    if panels:
        fig.suptitle(f"{title}  (grey: the other families)")
    else:
        axes[0, 0].set_title(title)  # a suptitle would run into the legend
    _legend(fig, archs, tuple(_factor_extra(floor, shade, shade_label, vlines)))
    return fig


def offset_figure(grid: pd.DataFrame, train_range: tuple[int, int]):
    """Alignment accuracy per (dx, dy) offset, one heatmap per architecture: in-distribution offsets (inside
    the box: both dx and dy in the training range) and unseen ones kept apart, never pooled."""
    if grid.empty:
        return None
    archs = _sorted_archs(grid)
    cols = min(4, len(archs))
    rows = -(-len(archs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols + 1.2, 2.5 * rows), squeeze=False,
                             layout="constrained")
    lo, hi = train_range
    image = None
    for ax, arch in zip(axes.flat, archs, strict=False):
        piv = grid[grid.arch == arch].pivot_table(index="dy", columns="dx", values="acc")
        image = ax.imshow(piv.to_numpy(), vmin=0, vmax=1, cmap="viridis", origin="lower",
                          extent=(piv.columns.min() - 0.5, piv.columns.max() + 0.5, piv.index.min() - 0.5,
                                  piv.index.max() + 0.5))
        ax.add_patch(matplotlib.patches.Rectangle((lo - 0.5, lo - 0.5), hi - lo + 1, hi - lo + 1, fill=False,
                                                  ec="white", lw=1.5))
        ax.set_title(arch, fontsize=FONT, color="0.1")  # dark text: pale arch colours are unreadable on white
        ax.set(xlabel="dx (px)", ylabel="dy (px)")
    for ax in list(axes.flat)[len(archs):]:
        ax.set_axis_off()
    fig.colorbar(image, ax=axes, label="test accuracy (mean over seeds)", shrink=0.8)
    fig.suptitle("alignment: accuracy per sub-patch offset (white box: offsets seen in training)")
    return fig


def window_bars(table: pd.DataFrame, title: str, floor: float | None = None):
    """Relation accuracy on mark pairs in one window (solid) vs across windows (hatched), per partition;
    one colour per architecture. Horizontal bars, so the names read without rotation."""
    parts = [(f, table[table.factor == f]) for f in ("window", "shifted_window")] if not table.empty else []
    parts = [(f, s) for f, s in parts if not s.empty]
    if not parts:
        return None
    archs = _sorted_archs(table)
    fig, axes = plt.subplots(1, len(parts), figsize=(3.6 * len(parts) + 2.2, 0.42 * len(archs) + 1.4),
                             sharey=True, squeeze=False, layout="constrained")
    for ax, (factor, sub) in zip(axes[0], parts, strict=True):
        for j, (value, hatch) in enumerate((("same", ""), ("cross", "///"))):
            rows = sub[sub.value == value].set_index("arch").reindex(archs)
            err = np.vstack([rows["mean"] - rows["ci_lo"], rows["ci_hi"] - rows["mean"]]).clip(min=0)
            ax.barh(np.arange(len(archs)) + (j - 0.5) * 0.4, rows["mean"], height=0.4, hatch=hatch,
                    color=[colour(a) for a in archs], edgecolor="0.6", capsize=2, ecolor="0.4",  # 0.6: seen on black
                    xerr=None if np.isnan(err).all() else err)
        if floor is not None and floor == floor:
            ax.axvline(floor, color="0.3", ls=":", lw=1)
        ax.set_yticks(range(len(archs)), archs)
        ax.set_ylim(len(archs) - 0.5, -0.5)
        ax.set(xlim=(0, 1.02), xlabel=CI_LABEL, title=f"{factor} partition")
        ax.grid(axis="x", alpha=GRID_ALPHA)
    fig.suptitle(title)
    fig.legend(handles=[Patch(facecolor="white", edgecolor="0.2", label="same window"),
                        Patch(facecolor="white", edgecolor="0.2", hatch="///", label="cross windows"),
                        Line2D([], [], color="0.3", ls=":", label="shortcut floor")],
               loc="outside right upper", frameon=False)
    return fig


def size_figure(curve: pd.DataFrame):
    """Test accuracy vs training-set size (log x), one panel per task (measurement)."""
    if curve.empty:
        return None
    tasks = sorted(curve.task.unique())
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks) + 1.6, 3.4), squeeze=False,
                             layout="constrained")
    for ax, task in zip(axes[0], tasks, strict=True):
        sub = curve[curve.task == task].rename(columns={"train_size": "x"})
        for arch in _sorted_archs(sub):
            _errorbars(ax, sub[sub.arch == arch], arch)
        ax.set_xscale("log")
        ax.set(title=f"{task}: accuracy vs training-set size", xlabel="training images (log scale)")
        _accuracy_axis(ax)
    _legend(fig, _sorted_archs(curve))
    return fig


def distillation_figure(table: pd.DataFrame, floors: dict[str, float]):
    """Out-of-distribution accuracy with its interval per distillation arm and per teacher type, one panel per
    task that has an OOD slice; teachers first, then students coloured by their teacher type."""
    if table is None or table.empty or "acc_ood" not in table or table["acc_ood"].isna().all():
        return None
    tasks = sorted(table.loc[table["acc_ood"].notna(), "task"].unique())
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 0.32 * table.arch.nunique() + 1.6),
                             squeeze=False, layout="constrained")
    for ax, task in zip(axes[0], tasks, strict=True):
        sub = table[(table.task == task) & table["acc_ood"].notna()]
        sub = pd.concat([sub[sub.source == "teachers"], sub[sub.source != "teachers"].sort_values("arch")])
        for y, r in enumerate(sub.itertuples()):
            teacher = r.source == "teachers"
            c = colour(r.arch if teacher else r.teacher_arch) if (teacher or isinstance(r.teacher_arch, str)) \
                else "0.35"
            lo, hi = r.acc_ood_lo, r.acc_ood_hi
            err = None if lo != lo else [[max(r.acc_ood - lo, 0)], [max(hi - r.acc_ood, 0)]]
            ax.errorbar([r.acc_ood], [y], xerr=err, marker="s" if teacher else "o", ms=6, capsize=2, color=c,
                        mfc=c if teacher else "white", mec=c, mew=1.4)
        ax.set_yticks(range(len(sub)), [f"{r.arch} teachers ({int(r.seeds)})" if r.source == "teachers"
                                        else r.arch for r in sub.itertuples()])
        ax.set_ylim(len(sub) - 0.5, -0.5)
        if (f := floors.get(task)) is not None and f == f:
            ax.axvline(f, color="0.3", ls=":", lw=1.2)
        ax.set(title=f"{task}: unseen factor values", xlabel="OOD accuracy (95% CI)")
        ax.grid(axis="x", alpha=GRID_ALPHA)
    return fig


# --------------------------------------------------------------------------- learning curves
HISTORY_COLUMNS = ["task", "arch", "seed", "metric", "step", "value"]


def history_points(records: list[dict], source: str = "runs") -> pd.DataFrame:
    """Long frame (task, arch, seed, metric, step, value) of every logged point: the training loss from a run's
    ``series`` (every ``log_every_steps``), falling back to its validation ``curve``; validation accuracy from
    the ``curve``."""
    rows = []
    for m in records:
        if m.get("source") != source:
            continue
        head = {"task": m.get("task"), "arch": m.get("arch"), "seed": m.get("seed")}
        series = [(p["step"], p.get("train/loss")) for p in m.get("series") or []]
        curve = m.get("curve") or []
        loss = series if any(v is not None for _, v in series) else [(p["step"], p.get("train_loss")) for p in curve]
        points = [("train/loss", s, v) for s, v in loss] + [("val/acc", p["step"], p.get("val_acc")) for p in curve]
        rows += [{**head, "metric": k, "step": s, "value": float(v)} for k, s, v in points
                 if v is not None and v == v]
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def learning_figure(hist: pd.DataFrame):
    """Validation accuracy vs optimizer step as small multiples: one row per task, one column per family (the
    DeiT students apart, :func:`panel`), the family's architectures in colour over the others in light grey; seed
    mean, every validation (measurement). Training loss per run: MLflow."""
    val = hist[hist.metric == "val/acc"] if len(hist) else hist
    if val.empty:
        return None
    tasks, groups = sorted(val.task.unique()), _panel_groups(_sorted_archs(val))
    fig, axes = plt.subplots(len(tasks), len(groups), figsize=(2.3 * len(groups) + 1.6, 1.9 * len(tasks) + 0.8),
                             squeeze=False, sharex=True, sharey=True, layout="constrained")
    means = {(t, a): g.groupby("step")["value"].mean() for (t, a), g in val.groupby(["task", "arch"])}
    for i, task in enumerate(tasks):
        for j, (family, archs) in enumerate(groups):
            ax = axes[i, j]
            for (t, arch), m in means.items():
                if t == task and arch not in archs:
                    ax.plot(m.index, m.values, lw=0.7, color="0.85", zorder=1)
            for arch in archs:
                if (task, arch) in means:
                    m = means[task, arch]
                    ax.plot(m.index, m.values, lw=1.2, color=colour(arch), zorder=2)
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=GRID_ALPHA)
            if i == 0:
                ax.set_title(family)
            if j == 0:
                ax.set_ylabel(f"{task}\nval accuracy")
            if i == len(tasks) - 1:
                ax.set_xlabel("optimizer step")
    _legend(fig, _sorted_archs(val))
    fig.suptitle("validation accuracy per family (grey: the other families)")
    return fig


def vega_colour_scale() -> dict:
    """The arch -> colour mapping as a vega-lite scale, so .dvc/plots/arch_lines.json colours DVC's plots like
    the PNGs (generated by :mod:`pipeline.report.dvc_plots`)."""
    order = arch_order()
    return {"domain": order, "range": [colour(a) for a in order]}
