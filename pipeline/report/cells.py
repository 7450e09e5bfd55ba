"""Item-level results: per-run 0/1 correctness on test items, seeds x items matrices, per-cell summaries.

A *cell* is one configuration (task, arch, train_size, steps, budget_mode, data_seed); its replicates are
seeds. Matrices pair seeds (rows, sorted by seed) and test items (columns, sorted by pool index), so two cells
with the same seeds and items give an item-paired difference. Nothing here reads files: the stage hands in
the runs frame, the pools (:func:`pipeline.report.sources.read_pool`) and the predictions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipeline.errors import StageError
from pipeline.report import stats
from pipeline.report.aggregate import parse_slice

CELL = ["task", "arch", "train_size", "steps", "budget_mode", "data_seed"]
TWIN_TASKS = ("arrangement", "relation")  # pools whose samples come in adjacent twins (index 2i, 2i + 1)


@dataclass
class Items:
    """Per-run correctness (run dir -> (pool index (N,), correct (N,) bool, logits)) and per-task pools."""

    pools: dict[str, dict]
    runs: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    def add(self, run_dir: str, task: str, index: np.ndarray, logits: np.ndarray) -> None:
        pool = self.pools.get(task)
        if pool is None:
            return
        test = pool["subsets"].get("test")
        if test is not None and (len(index) != len(logits) or not np.array_equal(np.sort(index), np.sort(test))):
            raise StageError(f"{run_dir}/predictions.npz: {len(index)} items, not the task's {len(test)} test "
                             f"items; rerun the train stage (dvc repro)")
        self.runs[run_dir] = (np.asarray(index), logits.argmax(-1) == pool["labels"][index], logits)

    def subset(self, task: str, name: str) -> np.ndarray | None:
        """Pool indices of a test subset (``test`` or ``slice/...``); None when the slice does not exist."""
        pool = self.pools.get(task)
        return None if pool is None else pool["subsets"].get(name)

    def matrix(self, rows: pd.DataFrame, subset: np.ndarray | None = None,
               seeds: list[int] | None = None, with_index: bool = False) -> tuple | None:
        """(seeds, seeds x items 0/1 matrix) of the runs ``rows`` (one cell), optionally restricted to pool
        indices ``subset`` and to ``seeds``; items = those every selected run predicted. None if no data.
        ``with_index`` adds the items' pool indices (to group twin pairs)."""
        rows = rows.sort_values("seed")
        if seeds is not None:
            rows = rows[rows.seed.isin(seeds)]
        got = [self.runs.get(d) for d in rows["dir"]]
        if not rows.size or any(g is None for g in got):
            return None
        common = subset if subset is not None else got[0][0]
        for index, _, _ in got:
            common = np.intersect1d(common, index)
        if not len(common):
            return None
        mat = np.stack([_take(index, correct, common) for index, correct, _ in got])
        out = [int(s) for s in rows.seed], mat.astype(float)
        return (*out, common) if with_index else out


    def agreeing_with(self, task: str, teachers: dict[str, tuple[np.ndarray, np.ndarray]],
                      own: dict[str, str]) -> Items:
        """The runs of ``own`` (run dir -> its teacher's dir; all on ``task``) scored against their own teacher
        instead of the labels: "right" on an item where a run predicts what its teacher predicts. ``teachers``:
        every teacher of the type (dir -> (pool index, logits)). Subsets ``agree/test``, ``agree/ood``, and the
        items the type gets wrong (every teacher of it), ``agree/teacher_wrong`` and ``agree/ood_teacher_wrong``:
        its shared errors, where only a bias the student inherited makes it agree (the labels never say so)."""
        pool = self.pools[task]
        labels, n = pool["labels"], len(pool["labels"])
        said, wrong = {}, None
        for folder, (index, logits) in teachers.items():
            said[folder] = np.full(n, -1, dtype=np.int64)
            said[folder][index] = logits.argmax(-1)
            errs = index[said[folder][index] != labels[index]]
            wrong = errs if wrong is None else np.intersect1d(wrong, errs)
        wrong = np.sort(wrong) if wrong is not None else np.array([], dtype=np.int64)
        subsets = {"agree/test": pool["subsets"]["test"], "agree/teacher_wrong": wrong}
        if (ood := pool["subsets"].get("slice/ood")) is not None:
            subsets.update({"agree/ood": ood, "agree/ood_teacher_wrong": np.intersect1d(ood, wrong)})
        view = Items({task: {**pool, "subsets": {**pool["subsets"], **subsets}}})
        for run_dir, teacher_dir in own.items():
            if (got := self.runs.get(run_dir)) is not None and teacher_dir in said:
                index, _, logits = got
                view.runs[run_dir] = (index, logits.argmax(-1) == said[teacher_dir][index], logits)
        return view

    def where_teachers_split(self, task: str, right: list[str], wrong: list[str], within: str) -> np.ndarray:
        """Items of ``within`` (``test`` or ``ood``) the ``right`` teachers (run dirs) get right by majority and the
        ``wrong`` ones get wrong by majority: where two teacher types disagree, so a student inheriting one type's
        bias differs there from one inheriting the other's."""
        pool = self.pools[task]
        among = pool["subsets"].get("test" if within == "test" else f"slice/{within}")
        if among is None:
            return np.array([], dtype=np.int64)

        def majority(dirs: list[str]) -> pd.Series:
            votes = [pd.Series(self.runs[d][1], index=self.runs[d][0]) for d in dirs if d in self.runs]
            return pd.concat(votes, axis=1).dropna().mean(axis=1) if votes else pd.Series(dtype=float)

        a, b = majority(right), majority(wrong)
        both = a.index.intersection(b.index).intersection(among)
        return np.sort(both[(a[both] > 0.5).to_numpy() & (b[both] < 0.5).to_numpy()].to_numpy()).astype(np.int64)


def _take(index: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``values`` (aligned with ``index``) at the pool indices ``wanted`` (all present in ``index``)."""
    order = np.argsort(index, kind="stable")
    return values[order][np.searchsorted(index[order], wanted)]


def main_config(runs: pd.DataFrame) -> dict:
    """The main grid's (train_size, steps, budget_mode): the most common values among the data_seed-0 runs
    (extra axes have fewer runs), so the report needs no knowledge of the grid's schema."""
    main = runs[(runs.source == "runs") & (runs.data_seed == 0)]
    if main.empty:
        return {}
    return {k: main[k].mode(dropna=False).iloc[0] for k in ("train_size", "steps", "budget_mode")}


def select(runs: pd.DataFrame, task: str, arch: str, config: dict) -> pd.DataFrame:
    """The runs of one cell: ``config`` fixes train_size/steps/budget_mode (data_seed 0 unless given)."""
    want = {"data_seed": 0, **config}
    sel = (runs.source == "runs") & (runs.task == task) & (runs.arch == arch)  # teachers are not cells
    for key, value in want.items():
        sel &= runs[key].isna() if value is None or value != value else runs[key] == value
    return runs[sel]


def slice_accuracy(runs: pd.DataFrame, items: Items, slices: tuple[str, ...], level: float) -> pd.DataFrame:
    """Per (task, arch, source) of ``runs`` and per slice it has: mean over seeds of each seed's accuracy on the
    slice's items, with its seed-level t interval (NaN with one seed, e.g. a teacher)."""
    rows = []
    for (task, arch, source), g in runs.groupby(["task", "arch", "source"], sort=True):
        for name in slices:
            idx = items.subset(task, name)
            if idx is not None and (got := items.matrix(g, idx)) is not None:
                rows.append({"task": task, "arch": arch, "source": source, "slice": name,
                             **stats.seed_accuracy(got[1].mean(axis=1), level)})
    return pd.DataFrame(rows, columns=["task", "arch", "source", "slice", "mean", "ci_lo", "ci_hi"])


def cell_summary(rows: pd.DataFrame, items: Items, rp, seed: int) -> dict:
    """Mean, seed-level t CI, k of n seeds >= escape threshold (Clopper-Pearson), bimodality. The per-seed
    accuracy is the seed's mean over the shared test items (or its recorded test_acc without item data)."""
    accs = rows.sort_values("seed")["test_acc"].to_numpy(dtype=float)
    n, k = len(accs), int((accs >= rp.escape_threshold).sum())
    cp_lo, cp_hi = stats.clopper_pearson(k, n, rp.confidence)
    got = items.matrix(rows)
    per_seed, n_items = (got[1].mean(axis=1), got[1].shape[1]) if got is not None else (accs, 0)
    b = stats.seed_accuracy(per_seed, rp.confidence)
    mean, lo, hi = b["mean"], b["ci_lo"], b["ci_hi"]
    bimodal = 0 < k < n
    note = ("bimodal: needs more seeds" if bimodal and n < rp.min_seeds_bimodal else
            "bimodal" if bimodal else "")
    return {"n": n, "mean": mean, "ci_lo": lo, "ci_hi": hi, "items": n_items, "k_escaped": k,
            "k_ci_lo": cp_lo, "k_ci_hi": cp_hi, "bimodal": bimodal, "note": note}


def cell_table(runs: pd.DataFrame, items: Items, rp, seed: int) -> pd.DataFrame:
    """One row per cell of the trained grid (source ``runs``) with :func:`cell_summary`."""
    main = runs[runs.source == "runs"]
    rows = [{**dict(zip(CELL, key, strict=True)), **cell_summary(g, items, rp, seed)}
            for key, g in main.groupby(CELL, sort=True, dropna=False)]
    cols = [*CELL, "n", "mean", "ci_lo", "ci_hi", "items", "k_escaped", "k_ci_lo", "k_ci_hi", "bimodal", "note"]
    return pd.DataFrame(rows, columns=cols)


def size_cells(cell_tab: pd.DataFrame, config: dict) -> pd.DataFrame:
    """The data-size axis inside the main runs: cells at the main budget and data draw whose (task, arch) was
    trained at more than one training-set size."""
    if cell_tab.empty or not config:
        return cell_tab
    sub = cell_tab[(cell_tab.steps == config["steps"]) & (cell_tab.budget_mode == config["budget_mode"])
                   & (cell_tab.data_seed == 0)]
    return sub[sub.groupby(["task", "arch"])["train_size"].transform("nunique") > 1].assign(curve="matched steps")


def exposure_cells(cell_tab: pd.DataFrame, points: dict[str, list[tuple[int, int, str]]]) -> pd.DataFrame:
    """The data-size curves at matched exposure: per curve name, the cells at its (train_size, steps, budget_mode)
    points (a grid with ``epochs`` gives each size its own steps), official data draw."""
    parts = [cell_tab[(cell_tab.train_size == n) & (cell_tab.steps == t) & (cell_tab.budget_mode == mode)
                      & (cell_tab.data_seed == 0)].assign(curve=name)
             for name, rows in points.items() for n, t, mode in rows]
    return pd.concat(parts) if parts else cell_tab.iloc[0:0].assign(curve="")


def slice_summary(rows: pd.DataFrame, items: Items, task: str, rp, seed: int) -> list[dict]:
    """Per test slice of one cell: mean over seeds and its seed-level t CI on the slice's items."""
    out = []
    for name, idx in sorted((items.pools.get(task) or {}).get("subsets", {}).items()):
        if name == "test" or (got := items.matrix(rows, idx)) is None:
            continue
        out.append({"slice": name, "n": got[1].shape[0], **stats.seed_accuracy(got[1].mean(axis=1), rp.confidence),
                    "items": got[1].shape[1]})
    return out


def twin_ids(task: str, index: np.ndarray, factors: pd.DataFrame | None) -> np.ndarray | None:
    """Twin id per pool index: the pool's ``twin`` factor when it has one, else adjacent pairs (2i, 2i + 1)
    for the tasks that generate twins that way; None for tasks without twins."""
    if factors is not None and "twin" in factors.columns:
        return factors["twin"].to_numpy()[index]
    return index // 2 if task in TWIN_TASKS else None


def twin_check(index: np.ndarray, logits: np.ndarray, labels: np.ndarray, twins: np.ndarray,
               atol: float = 1e-5) -> dict:
    """Exact check on complete twin pairs (both twins in the test set): are the twins' logits equal (to float
    tolerance), and what is the accuracy on those pairs (exactly 0.5 when equal and the labels differ)."""
    order = np.argsort(twins, kind="stable")
    t, idx, lg = twins[order], index[order], logits[order]
    first = np.flatnonzero(t[:-1] == t[1:])  # position of the first twin of each complete pair
    if not len(first):
        return {"pairs": 0, "max_logit_diff": math.nan, "pair_acc": math.nan}
    a, b = first, first + 1
    diff = float(np.abs(lg[a] - lg[b]).max())
    pred = lg.argmax(-1)
    both = np.concatenate([a, b])
    acc = float((pred[both] == labels[idx[both]]).mean())
    return {"pairs": len(first), "max_logit_diff": diff, "pair_acc": acc, "equal": diff <= atol}


def slice_table(runs: pd.DataFrame, items: Items, config: dict, rp, seed: int) -> pd.DataFrame:
    """Main-grid cells x test slices (``slice/<factor>=<value>``, ``slice/id``, ``slice/ood``) with CIs."""
    rows = []
    for (task, arch), _ in runs[runs.source == "runs"].groupby(["task", "arch"], sort=True):
        cell = select(runs, task, arch, config)
        for r in slice_summary(cell, items, task, rp, seed):
            factor, value = parse_slice(r["slice"])
            rows.append({"task": task, "arch": arch, "factor": factor, "value": value, **r})
    return pd.DataFrame(rows, columns=["task", "arch", "factor", "value", "slice", "n", "mean", "ci_lo", "ci_hi",
                                       "items"])


def offset_grid(runs: pd.DataFrame, items: Items, config: dict, task: str = "alignment") -> pd.DataFrame:
    """Accuracy per arch x (dx, dy) offset (seed mean of the per-offset accuracy), main grid, from the pool's
    factors: in-distribution and unseen offsets stay separate cells."""
    pool = items.pools.get(task)
    cols = ["arch", "dx", "dy", "acc", "n"]
    if pool is None or pool["factors"] is None or not {"dx", "dy"} <= set(pool["factors"].columns):
        return pd.DataFrame(columns=cols)
    dx, dy = pool["factors"]["dx"].to_numpy(), pool["factors"]["dy"].to_numpy()
    parts = []
    for arch in sorted(runs[(runs.source == "runs") & (runs.task == task)].arch.unique()):
        for d in select(runs, task, arch, config)["dir"]:
            if (got := items.runs.get(d)) is not None:
                index, correct, _ = got
                parts.append(pd.DataFrame({"arch": arch, "dx": dx[index], "dy": dy[index], "c": correct}))
    if not parts:
        return pd.DataFrame(columns=cols)
    per = pd.concat(parts).groupby(["arch", "dx", "dy"], as_index=False).agg(acc=("c", "mean"), n=("c", "size"))
    return per[cols]
