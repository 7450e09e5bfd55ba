"""Level 3, natural images: subgroup slices, the resolution table with its position contract, literature anchors,
training views on vs off, and each expected range beside its measurement.

Inputs are the metrics.json records (``subgroups``: {subgroup: {condition: {acc, consistency, n}}};
``resolution``: {size_px: {acc, n}}) and the cell table. Intervals: the seed mean of a subgroup's accuracy
with a Student-t interval over seeds (the seed is the unit of replication; the seeds share one test set, so
pooling their counts would treat seeds x items as independent items, about sqrt(seeds) too narrow); one seed:
no interval.
"""

from __future__ import annotations

import importlib
import math

import pandas as pd

from pipeline.report import stats
from pipeline.report.figures import panel


def _pooled(values: list[tuple[float, int]], level: float) -> dict:
    """Seed mean of a proportion with its seed-level t interval, and the items per seed summed (``n``)."""
    b = stats.seed_interval([a for a, _ in values], level, bounds=(0.0, 1.0))
    return {"seeds": len(values), "mean": b["estimate"], "ci_lo": b["ci_lo"], "ci_hi": b["ci_hi"],
            "n": sum(k for _, k in values)}


def subgroup_table(records: list[dict], level: float, task: str = "natural") -> pd.DataFrame:
    """Per arch x subgroup x condition: accuracy (seed mean, seed-level t interval), prediction consistency."""
    acc: dict[tuple, list] = {}
    cons: dict[tuple, list] = {}
    for m in records:
        if m.get("task") != task or m.get("source") != "runs":
            continue
        for group, conds in (m.get("subgroups") or {}).items():
            for cond, v in (conds or {}).items():
                if not isinstance(v, dict) or "acc" not in v:
                    continue
                key = (m["arch"], str(group), str(cond))
                acc.setdefault(key, []).append((float(v["acc"]), int(v.get("n", 0))))
                if v.get("consistency") is not None:
                    cons.setdefault(key, []).append(float(v["consistency"]))
    rows = [{"arch": a, "subgroup": g, "condition": c, **_pooled(vals, level),
             "consistency": sum(cons[(a, g, c)]) / len(cons[(a, g, c)]) if (a, g, c) in cons else math.nan}
            for (a, g, c), vals in sorted(acc.items())]
    return pd.DataFrame(rows, columns=["arch", "subgroup", "condition", "seeds", "mean", "ci_lo", "ci_hi", "n",
                                       "consistency"])


def resolution_table(records: list[dict], level: float) -> pd.DataFrame:
    """Per task x arch x evaluation size (px): accuracy (seed mean, seed-level t interval)."""
    acc: dict[tuple, list] = {}
    for m in records:
        for size, v in (m.get("resolution") or {}).items():
            if isinstance(v, dict) and "acc" in v and m.get("source") == "runs":
                acc.setdefault((m["task"], m["arch"], int(size)), []).append((float(v["acc"]), int(v.get("n", 0))))
    rows = [{"task": t, "arch": a, "size_px": s, **_pooled(vals, level)} for (t, a, s), vals in sorted(acc.items())]
    return pd.DataFrame(rows, columns=["task", "arch", "size_px", "seeds", "mean", "ci_lo", "ci_hi", "n"])


def position_contract() -> pd.DataFrame:
    """The position contract from :mod:`pipeline.resolution` (its one home in code), when that module exists."""
    try:
        mod = importlib.import_module("pipeline.resolution")
    except ImportError:
        return pd.DataFrame()
    for name in ("contract_table", "position_contract", "CONTRACT", "POSITION_CONTRACT"):
        obj = getattr(mod, name, None)
        if obj is None:
            continue
        obj = obj() if callable(obj) else obj
        if isinstance(obj, pd.DataFrame):
            return obj
        if isinstance(obj, dict):
            return pd.DataFrame([{"kind": k, **(v if isinstance(v, dict) else {"mapping": v})}
                                 for k, v in obj.items()])
        return pd.DataFrame(list(obj))
    return pd.DataFrame()


# Literature anchors these results speak to. Every number cites its paper and table; an anchor whose number
# could not be traced to a table was dropped (the design notes' small-data CIFAR-10 ViT numbers, for one).
ANCHORS = (
    {"anchor": "No position vs 1D position", "source": "Dosovitskiy et al. 2021 (ViT), Appendix D.4, Table 8",
     "paper": "ViT-B/16, ImageNet 5-shot linear: none 0.614, 1D 0.642, 2D 0.640", "a": "vit", "b": "vit_nopos"},
    {"anchor": "DeiT distillation", "source": "Touvron et al. 2021 (DeiT), Table 5",
     "paper": "DeiT-Ti ImageNet top-1: no distillation 72.2, hard 74.3, distillation token 74.5",
     "a": "deit", "b": "deit_labels"},
    {"anchor": "DeiT teacher type", "source": "Touvron et al. 2021 (DeiT), Table 2",
     "paper": "a convnet (RegNetY) teacher gives a better DeiT-B student than a transformer (DeiT-B) teacher",
     "a": "deit", "b": "deit_vit"},
    {"anchor": "Shifted windows", "source": "Liu et al. 2021 (Swin), Table 4",
     "paper": "Swin-T ImageNet top-1: no shift 80.2, shifted 81.3", "a": "swin", "b": "swin_noshift"},
    {"anchor": "ViT data-size reversal", "source": "Dosovitskiy et al. 2021 (ViT), Section 4.3, Figure 3",
     "paper": "direction only (read from a figure, no table): ResNets (BiT) beat ViT when pre-trained on "
              "ImageNet-1k; ViT overtakes them on the larger JFT-300M", "a": "vit", "b": "resnet"},
)


def anchors_table(cell_tab: pd.DataFrame, size_tab: pd.DataFrame, task: str = "natural") -> pd.DataFrame:
    """Each anchor beside our a - b on natural images (cell means; paired CIs are in the ledger), and for the
    data-size reversal, vit - resnet at every training size of the data-size curve."""
    rows = []
    for an in ANCHORS:
        if an["anchor"] == "ViT data-size reversal":  # per curve: at matched steps, at matched epochs
            sub = size_tab[size_tab.arch.isin([an["a"], an["b"]]) & (size_tab.task == task)] if len(size_tab) \
                else size_tab
            ours = "; ".join(f"{curve}: " + ", ".join(
                f"n={int(s)} {r[an['a']] - r[an['b']]:+.3f}"
                for s, r in g.pivot_table(index="train_size", columns="arch", values="mean").iterrows()
                if {an["a"], an["b"]} <= set(r.index)) for curve, g in sub.groupby("curve", sort=True))
        else:
            sub = cell_tab[(cell_tab.task == task) & (cell_tab.data_seed == 0)] if len(cell_tab) else cell_tab
            means = sub.groupby("arch")["mean"].first() if len(sub) else pd.Series(dtype=float)
            ours = (f"{an['a']} - {an['b']} = {means[an['a']] - means[an['b']]:+.3f}"
                    if {an["a"], an["b"]} <= set(means.index) else "")
        rows.append({"anchor": an["anchor"], "source": an["source"], "paper": an["paper"],
                     "ours (CIFAR-10)": ours or "not run"})
    return pd.DataFrame(rows)


SMOKE_CLEARANCE = 0.05  # issue 55's bar: an arm a natural row compares clears the position-free floors by this


def evidence_level(cell_tab: pd.DataFrame, floor: float, clearance: float = SMOKE_CLEARANCE,
                   task: str = "natural") -> str:
    """A line for the natural-image tables when the reference ViT (``vit``, an arm of every natural row) sits
    below the task's floor + ``clearance``: there the natural level is a smoke test of the pipeline, not evidence
    about the architectures; every ViT-family cell below that bar is listed (empty when ``vit`` clears it, or
    nothing ran)."""
    if cell_tab.empty or floor != floor:
        return ""
    sub = cell_tab[(cell_tab.task == task) & (cell_tab.data_seed == 0)]
    means = sub.groupby("arch")["mean"].first()
    if "vit" not in means.index or means["vit"] >= floor + clearance:
        return ""
    vits = means[[panel(a) in ("vit", "deit") for a in means.index]]
    low = vits[vits < floor + clearance]
    listed = ", ".join(f"{a} {m:.3f}" for a, m in low.sort_values().items())
    return (f"**A smoke test, not evidence:** the reference ViT sits below the shortcut floor + {clearance:.2f} "
            f"({floor:.3f} + {clearance:.2f}), with {len(low)} of {len(vits)} ViT-family cells on CIFAR-10: "
            f"{listed}. At this model and data size the natural-image contrasts say the pipeline runs, not which "
            "bias helps; the natural profiles (profiles/natural-cpu.yaml on 2 cores, profiles/natural.yaml on a "
            "GPU) are where they are meant to be decided.")


VIEWS_NOTE = (
    "Runs with the task's training views (tasks.natural.augment: black-padded random crop, left-right mirror) "
    "against the same runs with them off (a grid with `augment: false`), paired by seed: `on - off` is the seed "
    "mean of the per-seed difference in test accuracy with its seed-level t interval ({level:.0%}). Views drawn "
    "per (seed, step) in pipeline/learner.py.")

EXPECTED_NOTE = (
    "Each range the profile states in `report.expected` (from the literature or a pilot run before it, its source "
    "beside it in the params file), beside the measured main-grid cell: seed mean with its seed-level t interval. "
    "`where`: the mean inside, below or above the stated range. A range is what was expected before the run, not a "
    "pass mark.")


def views_table(runs: pd.DataFrame, level: float) -> pd.DataFrame:
    """Per cell trained both with and without its training views: each arm's mean and the seed-paired on - off."""
    key = ["task", "arch", "train_size", "steps", "budget_mode", "data_seed", "seed"]
    on, off = runs[runs.source == "runs"], runs[runs.source == "noaug"]
    pairs = on[key + ["test_acc"]].merge(off[key + ["test_acc"]], on=key, suffixes=("_on", "_off"))
    rows = []
    for cell, g in pairs.groupby(key[:-1], sort=True):
        d = stats.seed_interval(g.test_acc_on - g.test_acc_off, level)
        rows.append({**dict(zip(key[:-1], cell, strict=True)), "seeds": len(g), "on": g.test_acc_on.mean(),
                     "off": g.test_acc_off.mean(), "on - off": d["estimate"], "ci_lo": d["ci_lo"],
                     "ci_hi": d["ci_hi"]})
    return pd.DataFrame(rows, columns=[*key[:-1], "seeds", "on", "off", "on - off", "ci_lo", "ci_hi"])


def expected_table(cell_tab: pd.DataFrame, expected: dict) -> pd.DataFrame:
    """Each (task, arch) of ``report.expected`` beside its main-grid cell: measured mean, interval, where it falls."""
    rows = []
    for task, archs in expected.items():
        for arch, (lo, hi) in archs.items():
            got = cell_tab[(cell_tab.task == task) & (cell_tab.arch == arch)] if len(cell_tab) else cell_tab
            if got.empty:
                rows.append({"task": task, "arch": arch, "expected_lo": lo, "expected_hi": hi, "where": "not run"})
                continue
            r = got.iloc[0]
            where = "inside" if lo <= r["mean"] <= hi else ("below" if r["mean"] < lo else "above")
            rows.append({"task": task, "arch": arch, "expected_lo": lo, "expected_hi": hi, "measured": r["mean"],
                         "ci_lo": r["ci_lo"], "ci_hi": r["ci_hi"], "seeds": int(r["n"]), "where": where})
    return pd.DataFrame(rows, columns=["task", "arch", "expected_lo", "expected_hi", "measured", "ci_lo", "ci_hi",
                                       "seeds", "where"])
