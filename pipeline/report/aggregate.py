"""Pure pandas: per-run records -> frames -> seed summaries and the report's tables.

Interval convention (stated in every table that shows one): the mean over seeds with a two-sided Student-t
interval, ``mean +- t_{(1+level)/2, n-1} * sd / sqrt(n)``, sd with ddof=1. With one seed the interval is
undefined and stays NaN (shown as "n/a (1 seed)"): no interval is invented.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

CI_METHOD = "Student-t over seeds (mean +- t * sd / sqrt(n), sd with ddof=1); undefined with one seed"

# Run-level columns taken from metrics.json (budget counts, measurements) by :func:`runs_frame`.
BUDGET_KEYS = ("params", "optimizer_steps", "batch_size", "images_seen", "tokens_per_image", "tokens_seen",
               "forward_flops_per_image", "train_flops", "teacher_forward_flops", "teacher_train_flops",
               "total_flops_with_teacher")
MEASURED_KEYS = ("wall_time_s", "images_per_s", "peak_rss_mb")


def t_interval(values, level: float = 0.95) -> dict[str, float]:
    """Mean, sd and the Student-t interval of ``values`` (1-D, one per seed); NaN interval below two values."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": math.nan, "sd": math.nan, "ci_lo": math.nan, "ci_hi": math.nan}
    mean = float(x.mean())
    if n < 2:
        return {"n": 1, "mean": mean, "sd": math.nan, "ci_lo": math.nan, "ci_hi": math.nan}
    sd = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "ci_lo": mean - half, "ci_hi": mean + half}


def ledger_interval(values, n_test: int, level: float = 0.95) -> dict[str, float]:
    """Interval for judging a prediction: the t interval over seeds widened by test-set sampling error.

    All seeds share one test split, so seed spread misses the binomial error of that split; the two
    independent half-widths add in quadrature (``z * sqrt(p (1 - p) / n_test)`` at the mean ``p``). With
    one seed the binomial part alone is used. Returns mean, ci_lo, ci_hi, n (seeds) and half (half-width).
    """
    s = t_interval(values, level)
    if s["n"] == 0:
        return {**s, "half": math.nan}
    p = min(max(s["mean"], 0.0), 1.0)
    binom = float(stats.norm.ppf((1 + level) / 2)) * math.sqrt(p * (1 - p) / max(n_test, 1))
    seed_half = 0.0 if s["n"] < 2 else s["ci_hi"] - s["mean"]
    half = math.hypot(seed_half, binom)
    return {**s, "ci_lo": s["mean"] - half, "ci_hi": s["mean"] + half, "half": half}


def summarise(df: pd.DataFrame, by: list[str], value: str, level: float = 0.95) -> pd.DataFrame:
    """One row per ``by`` group: n (seeds), mean, sd, ci_lo, ci_hi of ``value`` (rows = seeds)."""
    cols = [*by, "n", "mean", "sd", "ci_lo", "ci_hi"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    rows = [{**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)),
             **t_interval(g[value].to_numpy(), level)}
            for key, g in df.groupby(by, sort=True, dropna=False)]
    return pd.DataFrame(rows, columns=cols)


def parse_slice(key: str) -> tuple[str, str]:
    """``"slice/offset=1,2"`` -> ``("offset", "1,2")``; ``"slice/id"`` -> ``("split", "id")``; ``"test"`` ->
    ``("split", "test")``."""
    name = key.removeprefix("slice/")
    if "=" in name:
        factor, _, value = name.partition("=")
        return factor, value
    return "split", name


def runs_frame(records: list[dict]) -> pd.DataFrame:
    """metrics.json records (each with an added ``source`` and ``dir``) -> one row per run.

    Columns: source, task, arch, model, seed, train_size, num_classes, test_acc, val_acc, shift_consistency,
    n_test, the budget counts, the measurements, teacher_arch, mlflow_run_id, dir.
    """
    rows = []
    for m in records:
        b, meas = m.get("budget", {}), m.get("measured", {})
        rows.append({
            "source": m["source"], "task": m["task"], "arch": m["arch"], "model": m.get("model", m["arch"]),
            "seed": int(m["seed"]), "train_size": int(m["train_size"]), "num_classes": m.get("num_classes"),
            "test_acc": float(m["test_acc"]), "val_acc": m.get("val_acc"),
            "shift_consistency": m.get("shift_consistency"),
            "n_test": int(m.get("slices", {}).get("test", {}).get("n", 0)),
            **{k: b.get(k) for k in BUDGET_KEYS}, **{k: meas.get(k) for k in MEASURED_KEYS},
            "teacher_arch": (m.get("teacher") or {}).get("arch"), "mlflow_run_id": m.get("mlflow_run_id"),
            "dir": m.get("dir"), "curve": m.get("curve"),
        })
    cols = ["source", "task", "arch", "model", "seed", "train_size", "num_classes", "test_acc", "val_acc",
            "shift_consistency", "n_test", *BUDGET_KEYS, *MEASURED_KEYS, "teacher_arch", "mlflow_run_id", "dir",
            "curve"]
    df = pd.DataFrame(rows, columns=cols)
    for col in ("val_acc", "shift_consistency"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def slices_frame(records: list[dict]) -> pd.DataFrame:
    """Long frame: one row per run x slice: source, task, arch, seed, train_size, slice, factor, value, acc, n."""
    rows = [{"source": m["source"], "task": m["task"], "arch": m["arch"], "seed": int(m["seed"]),
             "train_size": int(m["train_size"]), "slice": key, **dict(zip(("factor", "value"), parse_slice(key),
                                                                          strict=True)),
             "acc": float(v["acc"]), "n": int(v["n"])}
            for m in records for key, v in m.get("slices", {}).items()]
    return pd.DataFrame(rows, columns=["source", "task", "arch", "seed", "train_size", "slice", "factor", "value",
                                       "acc", "n"])


# --------------------------------------------------------------------------- tables
def accuracy_table(runs: pd.DataFrame, level: float) -> pd.DataFrame:
    """Main grid (source ``runs``): test accuracy per task x arch over seeds, plus shift consistency mean."""
    main = runs[runs.source == "runs"]
    acc = summarise(main, ["task", "arch", "train_size"], "test_acc", level)
    shift = main.groupby(["task", "arch", "train_size"], as_index=False)["shift_consistency"].mean()
    return acc.merge(shift, on=["task", "arch", "train_size"], how="left")


def budget_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per source x task x arch x size: counts (identical over seeds: first) and measurements (seed mean)."""
    if runs.empty:
        return pd.DataFrame()
    keys = ["source", "task", "arch", "train_size"]
    counts = runs.groupby(keys, as_index=False)[[k for k in BUDGET_KEYS if k != "batch_size"]].first()
    measured = runs.groupby(keys, as_index=False)[list(MEASURED_KEYS)].mean()
    seeds = runs.groupby(keys, as_index=False)["seed"].nunique().rename(columns={"seed": "seeds"})
    teacher = runs.groupby(keys, as_index=False)["teacher_arch"].first()
    out = counts.merge(measured, on=keys).merge(seeds, on=keys).merge(teacher, on=keys)
    return out.sort_values(keys, kind="stable").reset_index(drop=True)


def slice_table(slices: pd.DataFrame, level: float) -> pd.DataFrame:
    """Main grid per task x arch x slice: accuracy over seeds and the slice's size n (test samples)."""
    main = slices[(slices.source == "runs") & (slices.slice != "test")]  # "test" is the accuracy table
    out = summarise(main, ["task", "arch", "factor", "value"], "acc", level)
    sizes = main.groupby(["task", "arch", "factor", "value"], as_index=False)["n"].first()
    return out.merge(sizes, on=["task", "arch", "factor", "value"], how="left")


def factor_curve(table: pd.DataFrame, task: str, factor: str) -> pd.DataFrame:
    """Rows of :func:`slice_table` for one task's factor, with a numeric ``x`` where the values are numbers."""
    sub = table[(table.task == task) & (table.factor == factor)].copy()
    sub["x"] = pd.to_numeric(sub["value"], errors="coerce")
    return sub.sort_values(["arch", "x", "value"]).reset_index(drop=True)


def wide(curve: pd.DataFrame, x: str, columns: list[str], value: str = "mean") -> pd.DataFrame:
    """``x`` x arch table of ``value`` with exactly ``columns`` (for DVC plots, whose y fields are fixed in
    dvc.yaml: an architecture that was not run is an empty column, not a missing one)."""
    if curve.empty:
        return pd.DataFrame(columns=[x, *columns])
    table = curve.pivot_table(index=x, columns="arch", values=value, aggfunc="first")
    return table.reindex(columns=columns).reset_index().rename_axis(columns=None)


def size_curve(runs: pd.DataFrame, level: float) -> pd.DataFrame:
    """The data-size axis (source ``curve``): test accuracy per task x arch x train_size over seeds."""
    return summarise(runs[runs.source == "curve"], ["task", "arch", "train_size"], "test_acc", level)


def agreement(index_a: np.ndarray, logits_a: np.ndarray, index_b: np.ndarray, logits_b: np.ndarray) -> float:
    """Fraction of shared test samples on which two models predict the same class.

    index_*: (N,) int64 sample indices; logits_*: (N, K). Samples are matched by index (both runs evaluate
    the same test split, but the match does not rely on the order).
    """
    common, ia, ib = np.intersect1d(index_a, index_b, return_indices=True)
    if not len(common):
        return math.nan
    return float((logits_a[ia].argmax(-1) == logits_b[ib].argmax(-1)).mean())


def distillation_table(runs: pd.DataFrame, agreements: pd.DataFrame, level: float) -> pd.DataFrame:
    """Per task x arch (label-only ViT, students, teachers): accuracy over seeds, its teacher, the mean
    agreement with every teacher (columns ``agree_<teacher>``), and shift consistency.

    agreements: rows (task, arch, source, seed, teacher, agreement) computed from predictions.npz.
    """
    if agreements.empty:
        return pd.DataFrame()
    keys = ["task", "arch", "source"]
    pool = runs.merge(agreements[keys].drop_duplicates(), on=keys)
    acc = summarise(pool, keys, "test_acc", level)
    agree = agreements.pivot_table(index=keys, columns="teacher", values="agreement",
                                   aggfunc="mean").add_prefix("agree_").reset_index().rename_axis(columns=None)
    extra = pool.groupby(keys, as_index=False).agg(
        teacher_arch=("teacher_arch", "first"), shift_consistency=("shift_consistency", "mean"))
    return acc.merge(extra, on=keys).merge(agree, on=keys, how="left")


def interface_table(summary: dict) -> pd.DataFrame:
    """data/interface/summary.json ``checks`` -> one row per family (and ``all``): held, checked."""
    checks = summary.get("checks", {})
    fams = sorted({k.split(".")[0] for k in checks if "." in k})
    rows = [{"family": f, "held": checks.get(f"{f}.held", 0), "checked": checks.get(f"{f}.checked", 0)}
            for f in fams]
    rows.append({"family": "all", "held": checks.get("held", 0), "checked": checks.get("checked", 0)})
    return pd.DataFrame(rows)
