"""Pure pandas: per-run records -> frames -> the report's tables.

Intervals come from :mod:`pipeline.report.stats` through :mod:`pipeline.report.cells`: Student-t over seeds, the
seed's accuracy on the shared test items (or its recorded test accuracy without item data).
"""

from __future__ import annotations

import math

import pandas as pd

from pipeline.report import stats
from pipeline.report.sources import run_outcome, slice_acc

CI_METHOD = ("Student-t over seeds (per-seed accuracy on the shared test items; paired per seed for contrasts, "
             "TOST for equivalence; two Holm families over every row, the first look at alpha x n1 / N, the second "
             "at the rest of alpha on an inverse-normal combination of the first look's p and the new seeds' p for "
             "the rows the plan stage continued, p = 1 for the others); k of n seeds reaching the escape threshold "
             "with a Clopper-Pearson interval")

# Run-level columns taken from metrics.json (budget counts, measurements) by :func:`runs_frame`.
BUDGET_KEYS = ("params", "optimizer_steps", "batch_size", "images_seen", "tokens_per_image", "tokens_seen",
               "forward_flops_per_image", "train_flops", "teacher_forward_flops", "teacher_train_flops",
               "total_flops_with_teacher")
MEASURED_KEYS = ("wall_time_s", "images_per_s", "peak_rss_mb")
ARCH_COUNTS = ("params", "tokens_per_image", "forward_flops_per_image")  # the same for every seed of a group
BUDGET_GROUP = ("source", "task", "arch", "train_size", "steps", "budget_mode", "data_seed")  # one row of budget.csv


def parse_slice(key: str) -> tuple[str, str]:
    """``"slice/offset=1,2"`` -> ``("offset", "1,2")``; ``"slice/id"`` -> ``("split", "id")``; ``"test"`` ->
    ``("split", "test")``."""
    name = key.removeprefix("slice/")
    if "=" in name:
        factor, _, value = name.partition("=")
        return factor, value
    return "split", name


def _teacher_arch(m: dict) -> str | None:
    """metrics.json names a student's teacher arch in ``teacher``; its full record is ``provenance.teacher``."""
    t = m.get("teacher")
    return t if isinstance(t, str) or t is None else t.get("arch")


def _teacher_seed(m: dict) -> float:
    """The seed of the teacher a student learned from (its provenance record); NaN for every other run."""
    record = (m.get("provenance") or {}).get("teacher") or {}
    return float(record["seed"]) if isinstance(record, dict) and "seed" in record else math.nan


def runs_frame(records: list[dict]) -> pd.DataFrame:
    """metrics.json records (each with an added ``source`` and ``dir``) -> one row per run.

    Columns: source, task, arch, model, seed, train_size, num_classes, test_acc, val_acc, shift_consistency,
    n_test, id_acc, ood_acc, how the run ended (:func:`~pipeline.report.sources.run_outcome`), the budget counts,
    the measurements, teacher_arch, teacher_seed, mlflow_run_id, dir.
    """
    rows = []
    for m in records:
        b, meas = m.get("budget", {}), m.get("measured", {})
        rows.append({
            # a run trained without its task's views (a grid's minimal pair) is its own source: no main table pools it
            "source": "noaug" if m.get("augment") is False else m["source"],
            "task": m["task"], "arch": m["arch"], "model": m.get("model", m["arch"]),
            "seed": int(m["seed"]), "train_size": int(m["train_size"]), "num_classes": m.get("num_classes"),
            "steps": m.get("steps", b.get("optimizer_steps")), "data_seed": int(m.get("data_seed") or 0),
            "budget_mode": m.get("budget_mode", "steps"), "lr": m.get("lr"),
            "test_acc": float(m["test_acc"]), "val_acc": m.get("val_acc"),
            "shift_consistency": m.get("shift_consistency"),
            "n_test": int(m.get("slices", {}).get("test", {}).get("n", 0)),
            # in distribution: the task's `slice/id` where it has one, else the whole test split
            "id_acc": _or(slice_acc(m, "slice/id"), float(m["test_acc"])), "ood_acc": slice_acc(m, "slice/ood"),
            **run_outcome(m),
            **{k: b.get(k) for k in BUDGET_KEYS}, **{k: meas.get(k) for k in MEASURED_KEYS},
            "teacher_arch": _teacher_arch(m), "teacher_seed": _teacher_seed(m), "mlflow_run_id": m.get("mlflow_run_id"),
            "dir": m.get("dir"), "curve": m.get("curve"),
        })
    cols = ["source", "task", "arch", "model", "seed", "train_size", "num_classes", "steps", "data_seed",
            "budget_mode", "lr", "test_acc", "val_acc",
            "shift_consistency", "n_test", "id_acc", "ood_acc", "steps_done", "criterion_step",
            "criterion_recorded", "stop_reason", *BUDGET_KEYS, *MEASURED_KEYS, "teacher_arch", "teacher_seed",
            "mlflow_run_id", "dir",
            "curve"]
    df = pd.DataFrame(rows, columns=cols)
    for col in ("val_acc", "shift_consistency"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def _or(value: float, default: float) -> float:
    return default if value != value else value


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
def budget_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run configuration (:data:`BUDGET_GROUP`: the FLOPs-matched grid and another data draw are rows of their
    own): the counts an architecture fixes (:data:`ARCH_COUNTS`: one value per group), the seed mean, to a whole
    count, of those that criterion stopping makes differ from seed to seed (steps, images, tokens, FLOPs, the
    teacher's; the steps' range beside) and the seed mean of the measurements."""
    if runs.empty:
        return pd.DataFrame()
    keys = [k for k in BUDGET_GROUP if k in runs]
    per_seed = [k for k in BUDGET_KEYS if k not in ARCH_COUNTS and k != "batch_size"]
    spec = {**{k: (k, "first") for k in ARCH_COUNTS}, **{k: (k, "mean") for k in (*per_seed, *MEASURED_KEYS)},
            "optimizer_steps_min": ("optimizer_steps", "min"), "optimizer_steps_max": ("optimizer_steps", "max"),
            "seeds": ("seed", "nunique"), "teacher_arch": ("teacher_arch", "first")}
    order = [*keys, *(k for k in BUDGET_KEYS if k != "batch_size"), "optimizer_steps_min", "optimizer_steps_max",
             *MEASURED_KEYS, "seeds", "teacher_arch"]
    out = runs.groupby(keys, dropna=False, sort=True).agg(**spec).reset_index()[order]
    return out.assign(**{k: out[k].round().astype("Int64") for k in per_seed})  # whole counts: exact in the csv


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


def distillation_table(runs: pd.DataFrame, agreements: pd.DataFrame, accuracy: pd.DataFrame | None = None,
                       disagreement: dict | None = None, transfer: dict | None = None) -> pd.DataFrame:
    """Per task x arch (the arms of the distillation rows, and the teachers): seeds, mean test accuracy, its
    teacher and that teacher's disagreement with the labels on the students' training images
    (``teacher_disagrees``) and on the task's transfer set (``teacher_disagrees_transfer``, from ``transfer``),
    in- and out-of-distribution accuracy with seed-level intervals (``accuracy``: rows
    task, arch, source, slice, mean, ci_lo, ci_hi), the mean agreement with every teacher on the test split
    (``agree_<teacher>``), on its out-of-distribution slice (``agree_ood_<teacher>``) and on the items that
    teacher gets wrong (``agree_wrong_<teacher>``: where a transferred bias shows, since the labels never say so),
    and ``constant_seeds``: the seeds that predict one class for every test item (their agreement shows no bias).

    runs: the main grid's runs and the teachers (one training configuration: a mean over several sizes or budgets
    would mix cells); agreements: rows (task, arch, source, seed, teacher, agreement) from predictions.npz.
    """
    if agreements.empty:
        return pd.DataFrame()
    keys = ["task", "arch", "source"]
    pool = runs.merge(agreements[keys].drop_duplicates(), on=keys)
    out = pool.groupby(keys, as_index=False).agg(seeds=("seed", "nunique"), mean=("test_acc", "mean"),
                                                 teacher_arch=("teacher_arch", "first"))
    for col, rates in (("teacher_disagrees", disagreement or {}), ("teacher_disagrees_transfer", transfer or {})):
        out[col] = [rates.get((t, task), math.nan) for t, task in zip(out.teacher_arch, out.task, strict=True)]
    for name, g in (accuracy.groupby("slice") if accuracy is not None and len(accuracy) else ()):
        tag = name.removeprefix("slice/")
        wide = g.set_index(keys)[["mean", "ci_lo", "ci_hi"]].rename(
            columns={"mean": f"acc_{tag}", "ci_lo": f"acc_{tag}_lo", "ci_hi": f"acc_{tag}_hi"})
        out = out.merge(wide.reset_index(), on=keys, how="left")
    for value, prefix in (("agreement", "agree_"), ("agree_ood", "agree_ood_"),
                          ("agree_teacher_wrong", "agree_wrong_"), ("agree_ood_teacher_wrong", "agree_ood_wrong_")):
        if value not in agreements or agreements[value].isna().all():
            continue
        wide = agreements.pivot_table(index=keys, columns="teacher", values=value, aggfunc="mean")
        out = out.merge(wide.add_prefix(prefix).reset_index().rename_axis(columns=None), on=keys, how="left")
    if "classes" in agreements:  # a seed is one row per teacher type it is compared with: count it once
        seeds = agreements.drop_duplicates([*keys, "seed"]).assign(constant=lambda a: a["classes"] == 1)
        out = out.merge(seeds.groupby(keys, as_index=False).agg(constant_seeds=("constant", "sum")), on=keys,
                        how="left")
    return out


def agreement_table(agreements: pd.DataFrame, level: float) -> pd.DataFrame:
    """Long form of the agreements (:func:`pipeline.report.sources.agreements`): per task, arch, teacher and
    ``where`` (test, ood, teacher_wrong, ood_teacher_wrong), the seeds, the seed mean and its seed-level t
    interval. A teacher compared with another teacher is one seed: no interval."""
    cols = ["task", "arch", "source", "teacher", "where", "seeds", "mean", "ci_lo", "ci_hi"]
    if agreements.empty:
        return pd.DataFrame(columns=cols)
    names = {"agreement": "test", "agree_ood": "ood", "agree_teacher_wrong": "teacher_wrong",
             "agree_ood_teacher_wrong": "ood_teacher_wrong"}
    long = agreements.melt(id_vars=["task", "arch", "source", "teacher", "seed"],
                           value_vars=[k for k in names if k in agreements],
                           var_name="where", value_name="value").dropna(subset=["value"])
    rows = [{**dict(zip(["task", "arch", "source", "teacher", "where"], key, strict=True)), "seeds": len(g),
             **stats.seed_accuracy(g.sort_values("seed")["value"].to_numpy(dtype=float), level)}
            for key, g in long.groupby(["task", "arch", "source", "teacher", "where"], sort=True)]
    out = pd.DataFrame(rows, columns=cols)
    out["where"] = out["where"].map(names)
    return out


def first_step(curve, threshold: float) -> float:
    """First logged step whose validation accuracy reaches ``threshold`` (NaN: not reached / no curve)."""
    for point in curve if isinstance(curve, list) else []:
        v = point.get("val_acc")
        if v is not None and v == v and v >= threshold:
            return float(point["step"])
    return math.nan


def steps_to_reach(runs: pd.DataFrame, threshold: float, cell: list[str]) -> pd.DataFrame:
    """Per cell: how many seeds reached ``threshold`` validation accuracy, and the median first step among them
    ("cannot" vs "not yet" on the budget axis); ``reached`` reads "not reached" when none did."""
    cols = [*cell, "n", "k_reached", "median_step", "reached"]
    main = runs[runs.source == "runs"].assign(step=lambda d: [first_step(c, threshold) for c in d["curve"]])
    rows = []
    for key, g in main.groupby(cell, sort=True, dropna=False):
        hit = g["step"].dropna()
        med = float(hit.median()) if len(hit) else math.nan
        rows.append({**dict(zip(cell, key, strict=True)), "n": len(g), "k_reached": len(hit), "median_step": med,
                     "reached": f"step {med:.0f} ({len(hit)} of {len(g)} seeds)" if len(hit) else "not reached"})
    return pd.DataFrame(rows, columns=cols)


def interface_table(summary: dict) -> pd.DataFrame:
    """data/interface/summary.json ``checks`` -> one row per group of checks (and ``all``): held, checked."""
    checks = summary.get("checks", {})
    fams = sorted({k.split(".")[0] for k in checks if "." in k})
    rows = [{"group": f, "held": checks.get(f"{f}.held", 0), "checked": checks.get(f"{f}.checked", 0)}
            for f in fams]
    rows.append({"group": "all", "held": checks.get("held", 0), "checked": checks.get("checked", 0)})
    return pd.DataFrame(rows)
