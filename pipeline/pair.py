"""``bias pair ROW --seeds N``: one paired ledger row's two arms trained again, seeds 0..N-1, through the train
stage's own code (:func:`pipeline.experiment.fit`, as ``bias run-one``), in a scratch folder: nothing goes to
``data/``, DVC or MLflow. The row's per-seed difference, mean and interval are computed as the ledger computes them
(the same items, twin pairs averaged first, :func:`pipeline.report.stats.paired_seeds`), so on the study's seeds
it reproduces the ledger's estimate; more seeds say how far that estimate moves."""

from __future__ import annotations

import difflib
import shutil
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pandas as pd

from pipeline.config import Params
from pipeline.errors import ConfigError, StageError
from pipeline.grid import Folders, RunSpec, at_main_budget, train_specs
from pipeline.report import cells, stats
from pipeline.report.contrasts import CONTRASTS, plan
from pipeline.report.sources import read_pool
from pipeline.run_inputs import check_inputs
from pipeline.tune import read_choice

LEDGER = Path("reports/tables/ledger.csv")  # the committed study's ledger, printed beside the new estimate
DATA = Path("data")


def find_row(params: Params, row_id: str) -> dict:
    """The paired ledger row ``row_id`` of this configuration (:func:`pipeline.report.contrasts.plan`), or a
    contrast id without its task (``alignment.stride``) where that plans one row. Refuses, naming the row, what is
    not a row here or is not two arms of the main grid that train on their own."""
    planned = plan(params)
    paired = [r["id"] for r in planned if r["kind"] == "paired"]
    matches = [r for r in planned if r["id"] == row_id] or \
        [r for r in planned if r["kind"] == "paired" and r["id"].rpartition(".")[0] == row_id]
    if len(matches) > 1:
        raise ConfigError(f"row {row_id}: runs on {len(matches)} tasks here; name one: "
                          f"{', '.join(r['id'] for r in matches)}")
    if not matches:
        known = next((c for c in CONTRASTS if row_id == c["id"] or row_id.startswith(f"{c['id']}.")), None)
        if known:
            raise ConfigError(f"row {row_id}: {known['a']} vs {known['b']} is a contrast of "
                              f"pipeline/report/contrasts.csv, but this configuration does not train both arms on "
                              f"its task (train.archs, distill.students), so the ledger has no such row")
        if (kind := committed_kind(row_id)) is not None and kind != "paired":
            raise ConfigError(f"row {row_id}: {article(kind)} row of {LEDGER} (a check of one arm), not two arms "
                              "that train on their own; `bias pair` takes a paired row")
        if row_id.startswith("budget."):
            raise ConfigError(f"row {row_id}: a budget row pairs one cell with itself under another budget, not two "
                              "arms; train the cell with `bias run-one --steps`")
        near = difflib.get_close_matches(row_id, paired, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(near)}? " if near else ""
        raise ConfigError(f"row {row_id}: no such ledger row ({hint}paired rows here: {', '.join(paired)})")
    row = matches[0]
    if row["kind"] != "paired":
        against = "the task's shortcut floor" if row["kind"] == "floor" else "an exact check of its own"
        raise ConfigError(f"row {row['id']}: {article(row['kind'])} row ({row['a']} against {against}), not two arms "
                          "that train on their own; `bias pair` takes a paired row")
    if row["subset"].startswith("agree/"):
        raise ConfigError(f"row {row['id']}: scored on {row['subset']}, agreement with the teacher's predictions "
                          "(the report reads them from the teacher stage); `bias pair` scores against the labels")
    return row


def article(kind: str) -> str:
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def arm_specs(params: Params, row: dict, seeds: int, out: Path, lrs: dict) -> list[RunSpec]:
    """Both arms' main-grid runs of ``row`` for seeds 0..seeds-1, in seed order, arm a first; outputs under
    ``out``. Seeds beyond ``train.seeds`` are the same runs with another seed (the grid is asked for them)."""
    more = params.model_copy(update={"train": params.train.model_copy(update={"seeds": list(range(seeds))})})
    at = Folders(DATA / "tasks", DATA / "slices", out / "runs", out / "ckpt", DATA / "teachers")
    specs = {(s.key.arch, s.key.seed): s for s in train_specs(more, at, lrs)
             if s.key.task == row["task"] and at_main_budget(s, more)}
    return [specs[arm, seed] for seed in range(seeds) for arm in (row["a"], row["b"])]


def paired(row: dict, items: cells.Items, names: dict[tuple[str, int], str], seeds: int, level: float) -> dict:
    """The row's seed-level paired difference over the runs ``names`` ((arm, seed) -> the run's key in
    ``items``), as :func:`pipeline.report.measure.measure_paired` computes it: the same items, twin pairs
    averaged first, :func:`pipeline.report.stats.paired_seeds`."""
    subset = items.subset(row["task"], row["subset"])
    got = [items.matrix(pd.DataFrame({"seed": range(seeds), "dir": [names[arm, s] for s in range(seeds)]}),
                        subset, list(range(seeds)), with_index=True) for arm in (row["a"], row["b"])]
    units = cells.twin_ids(row["task"], got[0][2], items.pools[row["task"]]["factors"])
    return {**stats.paired_seeds(got[0][1], got[1][1], units, level), "twins": units is not None}


def committed_kind(row_id: str, ledger: Path = LEDGER) -> str | None:
    """The kind (paired, floor, exact) of ``row_id`` in the committed ledger; None when it has no such row."""
    if not ledger.exists():
        return None
    got = pd.read_csv(ledger, usecols=["id", "kind"])
    return next(iter(got.loc[got["id"] == row_id, "kind"]), None)


def committed(row_id: str, ledger: Path = LEDGER) -> str:
    """The committed ledger's estimate of ``row_id`` in one line, or why there is none."""
    if not ledger.exists():
        return f"committed ledger: {ledger} absent"
    got = pd.read_csv(ledger)
    got = got[got["id"] == row_id]
    if got.empty or pd.isna(got.iloc[0]["estimate"]):
        return f"committed ledger ({ledger}): no estimate for {row_id}"
    r = got.iloc[0]
    ci = f"[{r.ci_lo:+.4f}, {r.ci_hi:+.4f}]" if pd.notna(r.ci_lo) else "no interval"
    return (f"committed ledger ({ledger}): {r.estimate:+.4f} {ci} over {int(r.seeds)} seed(s), "
            f"{int(r['items'])} items; verdict {r.verdict}")


def run(row_id: str, seeds: int, params: Params) -> int:
    """Train, print each run as it starts and ends, then the per-seed differences, mean and interval beside the
    committed ledger's (cwd: the repository root, as the stages)."""
    row = find_row(params, row_id)
    choice = DATA / "tune" / "choice.json"
    lrs = read_choice(choice, params) if choice.exists() else {}
    out = Path(tempfile.mkdtemp(prefix="bias-pair-"))
    try:
        specs = arm_specs(params, row, seeds, out, lrs)
        pool = read_pool(DATA / "tasks", DATA / "slices", row["task"])
        try:
            if pool is None:
                raise StageError(f"{DATA / 'tasks' / row['task']}: missing")
            check_inputs(specs, params)
        except (ConfigError, StageError, OSError) as err:
            needs = f"slice@{row['task']}" + (" teacher" if any(s.teacher_dir for s in specs) else "")
            raise StageError(f"row {row['id']}: its arms cannot train from what is on disk ({err}); run "
                             f"`dvc repro {needs}` first (the stages the row reads)") from None
        items = cells.Items({row["task"]: pool})
        if items.subset(row["task"], row["subset"]) is None:
            raise StageError(f"row {row['id']}: data/slices/{row['task']} has no {row['subset']} items; rerun "
                             f"`dvc repro slice@{row['task']}`")
        print(f"pair {row['id']}: {row['a']} - {row['b']} on {row['subset']} of {row['task']}, seeds 0..{seeds - 1}, "
              f"{len(specs)} runs in {out} (nothing recorded)", flush=True)
        from pipeline.experiment import Job, fit  # torch and Lightning: once the row's inputs are there

        names, t0 = {}, time.perf_counter()
        for k, spec in enumerate(specs, 1):
            lr = f"lr {spec.lr or params.train.recipe.lr:g} ({'tuned' if spec.lr else 'train.recipe.lr'})"
            print(f"[{datetime.now():%H:%M:%S}] run {k} of {len(specs)} started: {spec.name}, {lr}", flush=True)
            t = time.perf_counter()
            ev = fit(Job(spec, params.for_task(spec.key.task), "pair", None))["evaluation"]
            items.add(spec.name, row["task"], ev["test_idx"], ev["logits"])
            names[spec.key.arch, spec.key.seed] = spec.name
            print(f"[{datetime.now():%H:%M:%S}] run {k} of {len(specs)} done in {time.perf_counter() - t:.1f} s",
                  flush=True)
        d = paired(row, items, names, seeds, params.report.confidence)
        print(f"\n{'seed':>4}  {row['a']:>16}  {row['b']:>16}  {'a - b':>8}")
        for s, (ma, mb) in enumerate(zip(d["mean_a"], d["mean_b"], strict=True)):
            print(f"{s:>4}  {ma:>16.4f}  {mb:>16.4f}  {ma - mb:>+8.4f}")
        level = f"{params.report.confidence:.0%}"
        ci = f"{level} interval [{d['ci_lo']:+.4f}, {d['ci_hi']:+.4f}]" if seeds > 1 else \
            f"no {level} interval from one seed"
        how = f"seed-level paired t, {'twin pairs averaged first, ' if d['twins'] else ''}{d['items']} items"
        print(f"mean {d['estimate']:+.4f}, {ci} ({how}); {len(specs)} runs in {time.perf_counter() - t0:.0f} s")
        print(committed(row["id"]), flush=True)
        return 0
    finally:
        shutil.rmtree(out, ignore_errors=True)
