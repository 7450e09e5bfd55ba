"""The report's inputs, read from the files DVC tracks (never by scraping the MLflow run table).

Layouts (see dvc.yaml): ``runs/<arch>/<task>/n<size>-t<steps>-s<seed>-d<data_seed>[-<budget mode>]/`` with
``{metrics.json,predictions.npz}`` (pipeline.grid.RunKey.folder) and
``teachers/<arch>/<task>/{metrics.json,predictions.npz}``. A missing root is an empty source (that part of
the study was not run), so the report works with distillation or the data-size curve disabled.

Learning curves too come from metrics.json (its ``curve``: step, train loss, val loss and accuracy at every
validation), so every input of the report is a file DVC tracks.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.errors import StageError
from pipeline.grid import configured_cells
from pipeline.io import Shape, checked_arrays
from pipeline.io import read_json as read_checked
from pipeline.schemas import RUN_METRICS, SHORTCUT_FLOORS, TEACHER_PROVENANCE


def read_metrics(root: Path | None, source: str) -> list[dict]:
    """Every metrics.json under ``root`` with ``source``, ``dir`` and ``num_classes`` (from predictions) added."""
    if root is None or not root.exists():
        return []
    out = []
    for path in sorted(root.rglob("metrics.json")):
        m = read_checked(path, RUN_METRICS)
        pred = path.parent / "predictions.npz"
        k = m.get("num_classes")
        if k is None and pred.exists():  # older runs did not record it
            with np.load(checked_arrays(pred), allow_pickle=False) as z:
                k = int(z["logits"].shape[1])
        out.append({**m, "source": source, "dir": str(path.parent), "num_classes": k})
    return out


STOP_REASONS = ("criterion", "plateau", "cap", "race")


def run_outcome(m: dict) -> dict:
    """How a run ended, from metrics.json: ``steps_done``, ``criterion_step``, ``criterion_recorded``,
    ``stop_reason``. Runs from before training to a criterion lack the keys: they ran their fixed budget to
    the end (``stop_reason`` "cap", ``steps_done`` = their steps) and ``criterion_recorded`` is False, so a
    reader falls back to their learning curve instead of reading "not reached"."""
    steps = m.get("steps", (m.get("budget") or {}).get("optimizer_steps"))
    done = m.get("steps_done", steps)
    crit = m.get("criterion_step")
    reason = m.get("stop_reason") or "cap"
    return {"steps_done": math.nan if done is None else float(done),
            "criterion_step": math.nan if crit is None else float(crit),
            "criterion_recorded": "criterion_step" in m,
            "stop_reason": reason if reason in STOP_REASONS else str(reason)}


def slice_acc(m: dict, key: str) -> float:
    """Accuracy of one evaluation slice of a run (NaN when the task has no such slice)."""
    v = (m.get("slices") or {}).get(key)
    return float(v["acc"]) if isinstance(v, dict) and v.get("acc") is not None else math.nan


def read_predictions(folder: str | Path) -> tuple[np.ndarray, np.ndarray] | None:
    """``(index (N,) int64, logits (N, K) float32)`` of a run folder, or None if it kept none."""
    path = Path(folder) / "predictions.npz"
    if not path.exists():
        return None
    try:
        with np.load(checked_arrays(path), allow_pickle=False) as z:
            return z["index"], z["logits"]
    except (ValueError, OSError, KeyError) as err:
        raise StageError(f"{path}: unreadable predictions ({type(err).__name__}: {err})") from None


def read_images(tasks_dir: Path | None, task: str, index: np.ndarray) -> np.ndarray | None:
    """Pool images ``index`` of a task (uint8, N x H x W x C), or None when the pool is absent."""
    path = tasks_dir / task / "images.npy" if tasks_dir is not None else None
    if path is None or not path.exists():
        return None
    return np.asarray(np.load(checked_arrays(path), mmap_mode="r", allow_pickle=False)[index])


def read_pool(tasks_dir: Path | None, slices_dir: Path | None, task: str) -> dict | None:
    """What item-level statistics need from a task: pool ``labels`` (N,), pool ``factors`` (DataFrame or
    None) and the test ``subsets`` (``test``, ``slice/...`` -> pool indices). None when the pool is absent."""
    if tasks_dir is None or not (tasks_dir / task / "labels.npy").exists():
        return None
    labels = np.load(checked_arrays(tasks_dir / task / "labels.npy"), allow_pickle=False).astype(np.int64)
    fpath = tasks_dir / task / "factors.csv"
    factors = pd.read_csv(fpath) if fpath.exists() else None
    subsets: dict[str, np.ndarray] = {}
    ipath = (slices_dir / task / "indices.npz") if slices_dir is not None else None
    if ipath is not None and ipath.exists():
        with np.load(checked_arrays(ipath), allow_pickle=False) as z:
            subsets = {k: z[k] for k in z.files if k == "test" or k.startswith("slice/")}
    return {"labels": labels, "factors": factors, "subsets": subsets}


def read_floors(shortcuts_dir: Path | None, tasks: list[str]) -> dict[str, dict]:
    """task -> data/shortcuts/<task>/floors.json (the shortcut floors; absent tasks are left out)."""
    out = {}
    for task in tasks:
        path = shortcuts_dir / task / "floors.json" if shortcuts_dir else None
        if (rec := read_json(path, SHORTCUT_FLOORS)) is not None:
            out[task] = rec
    return out


def _find_rate(obj, word: str = "disagree") -> float | None:
    """The first number under a key containing ``word`` (provenance layouts nest it differently)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if word in str(key) and isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        for value in obj.values():
            if (found := _find_rate(value, word)) is not None:
                return found
    return None


def teacher_disagreement(teachers_dir: Path | None, word: str = "disagree") -> dict[tuple[str, str], float]:
    """(teacher arch, task) -> the teachers' disagreement with the true labels on the students' training
    images, from ``<teachers>/<arch>/s<seed>/<task>/provenance.json``, the mean over a type's teachers;
    ``word="transfer_disagree"``: on the task's transfer set instead (where it has one)."""
    if teachers_dir is None or not teachers_dir.exists():
        return {}
    found: dict[tuple[str, str], list[float]] = {}
    for path in sorted(teachers_dir.glob("*/*/*/provenance.json")):
        rate = _find_rate(read_checked(path, TEACHER_PROVENANCE), word)
        if rate is not None:
            found.setdefault((path.parents[2].name, path.parent.name), []).append(rate)
    return {key: float(np.mean(rates)) for key, rates in found.items()}


def configured(m: dict, params) -> bool:
    """Is this run part of the grid params.yaml configures now? (Run folders persist across DVC reruns, so a
    task or architecture removed from the params would otherwise linger in the report.)"""
    if m["source"] == "teachers":
        return m["arch"] in dict(params.distill.teachers) and m["task"] in params.distill.teacher_tasks(m["arch"])
    return m["arch"] in configured_cells(params)  # the train stage prunes runs its grid no longer has


def read_records(params, runs: Path | None, teachers: Path | None, more: Path | None = None) -> list[dict]:
    """Every configured run's metrics.json: the train stage's and the second look's (both source ``runs``:
    the same cells, more seeds), and the teachers'."""
    found = read_metrics(runs, "runs") + read_metrics(more, "runs") + read_metrics(teachers, "teachers")
    return [m for m in found if configured(m, params)]


def read_json(path: Path | None, shape: Shape) -> dict | None:
    """A JSON mapping of ``shape``, or None when the file is absent (that part of the study was not run)."""
    if path is None or not path.exists():
        return None
    return read_checked(path, shape)


def learning_histories(runs: pd.DataFrame, keys: tuple[str, ...] = ("train/loss", "val/acc")) -> pd.DataFrame:
    """Long frame (source, task, arch, seed, train_size, metric, step, value) from the ``curve`` that every
    run's metrics.json carries (one row per validation; kept across a resume by the Curves callback)."""
    rows = []
    for r in runs.itertuples():
        curve = getattr(r, "curve", None)
        if not isinstance(curve, list):
            continue
        for point in curve:
            for key in keys:
                value = point.get(key.replace("/", "_"))
                if value is not None and not math.isnan(value):
                    rows.append({"source": r.source, "task": r.task, "arch": r.arch, "seed": r.seed,
                                 "train_size": r.train_size, "metric": key, "step": point["step"], "value": value})
    cols = ["source", "task", "arch", "seed", "train_size", "metric", "step", "value"]
    return pd.DataFrame(rows, columns=cols)


def agreement(index_a: np.ndarray, logits_a: np.ndarray, index_b: np.ndarray, logits_b: np.ndarray,
              within: np.ndarray | None = None) -> float:
    """Fraction of shared test samples on which two models predict the same class (NaN if none are shared).

    index_*: (N,) int64 sample indices; logits_*: (N, K). Samples are matched by index (both runs evaluate
    the same test split, but the match does not rely on the order); ``within``: only these pool indices.
    """
    common, ia, ib = np.intersect1d(index_a, index_b, return_indices=True)
    if within is not None:
        keep = np.isin(common, within)
        ia, ib = ia[keep], ib[keep]
    if not len(ia):
        return math.nan
    return float((logits_a[ia].argmax(-1) == logits_b[ib].argmax(-1)).mean())


def agreements(runs: pd.DataFrame, arms, teacher_tasks: list[str], items=None) -> pd.DataFrame:
    """Agreement of every arm in ``arms`` (students and their label-only controls) and each teacher with every
    teacher, per seed.

    Rows: task, arch, source, seed, teacher, agreement (on the shared test split, from predictions.npz) and, with
    ``items`` (:class:`pipeline.report.cells.Items`: the pools' labels and slices), ``agree_ood`` (on the
    out-of-distribution slice, where the task has one) and ``agree_teacher_wrong`` (on the test items the teacher
    gets wrong: a student that inherited the teacher's bias repeats its mistakes; one trained on labels does not);
    ``classes``: how many classes the arm predicts over the test split (1: the same class for every item, which
    agrees with a teacher wherever the teacher says that class, inheriting nothing).
    """

    teachers = runs[runs.source == "teachers"]
    pool = runs[(runs.source == "runs") & runs.arch.isin(list(arms)) | (runs.source == "teachers")]
    rows = []
    for t in teachers.itertuples():
        if t.task not in teacher_tasks or (tp := read_predictions(t.dir)) is None:
            continue
        same_type = teachers[(teachers.task == t.task) & (teachers.arch == t.arch)]
        for r in pool[pool.task == t.task].itertuples():
            if r.source == "teachers" and (r.arch == t.arch or r.seed != t.seed):  # teachers pair by seed
                continue
            if r.source != "teachers" and own_teacher(r, same_type) != t.dir:  # each run beside its own
                continue
            if (rp := read_predictions(r.dir)) is None:
                continue
            rows.append({"task": t.task, "arch": r.arch, "source": r.source, "seed": r.seed, "teacher": t.arch,
                         "agreement": agreement(rp[0], rp[1], tp[0], tp[1]),
                         **_where_it_matters(items, t.task, rp, tp), "classes": len(np.unique(rp[1].argmax(-1)))})
    return pd.DataFrame(rows, columns=["task", "arch", "source", "seed", "teacher", *AGREEMENTS, "classes"])


def own_teacher(run, teachers: pd.DataFrame) -> str | None:
    """The dir of the teacher (of ``teachers``: one type on one task) a run is compared with: a student's own (its
    recorded teacher seed); any other run the one its seed would have had (teachers cycle over seeds in order)."""
    by_seed = dict(zip(teachers.seed.astype(int), teachers.dir, strict=True))
    if not by_seed:
        return None
    taught = getattr(run, "teacher_seed", math.nan)
    return by_seed.get(int(taught) if taught == taught else sorted(by_seed)[int(run.seed) % len(by_seed)])


# agreement with a teacher: on the test split, its out-of-distribution slice, the items the teacher gets wrong,
# and the out-of-distribution items it gets wrong (where a transfer set's bias shows)
AGREEMENTS = ("agreement", "agree_ood", "agree_teacher_wrong", "agree_ood_teacher_wrong")


def _where_it_matters(items, task: str, rp: tuple, tp: tuple) -> dict[str, float]:
    pool = items.pools.get(task) if items is not None else None
    if pool is None:
        return dict.fromkeys(AGREEMENTS[1:], math.nan)
    ood = items.subset(task, "slice/ood")
    wrong = tp[0][tp[1].argmax(-1) != pool["labels"][tp[0]]]
    on = {"agree_ood": ood, "agree_teacher_wrong": wrong,
          "agree_ood_teacher_wrong": np.intersect1d(ood, wrong) if ood is not None else None}
    return {k: agreement(rp[0], rp[1], tp[0], tp[1], idx) if idx is not None and len(idx) else math.nan
            for k, idx in on.items()}
