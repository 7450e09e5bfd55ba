"""Matched recipe calibration: the same learning-rate trials for every architecture on every task.

    python -m bench.calibrate [--lrs 1e-3 2e-3 4e-3] [--seed 0] [--tasks T ...] [--out reports/calibration]

Every (arch, task) cell of the main grid (``train.archs``; the DeiT students need teachers and are left out)
trains once per learning rate at the default budget (``train.recipe`` with only ``lr`` changed), on the default
data (``dvc repro`` must have produced ``data/tasks`` and ``data/slices``), through the pipeline's own
:func:`pipeline.experiment.execute` (its worker pool, MLflow experiment ``<prefix>-calibrate``). The table says,
per arch and task, the validation accuracy at each lr, so a reader can tell a recipe problem (one lr escapes a
plateau, another does not) from an architectural one (no lr escapes), and sees that every architecture got
exactly the same number of trials. ``--tasks`` recalibrates only those tasks (after a difficulty change) and keeps
the other tasks' rows.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

from pipeline.config import Params, load_params, parse_params
from pipeline.grid import Folders, RunKey, RunSpec, specs_for
from pipeline.io import write_text, write_with


def trial_specs(params: Params, tasks: list[str], seed: int, at: Folders) -> list[RunSpec]:
    """One run per (arch, task) of the main grid among ``tasks``, at the main budget and ``seed``."""
    t, r = params.train, params.train.recipe
    return [s for arch, cell in t.archs.items()
            for s in specs_for("train", [RunKey(task, arch, seed, t.size, r.steps, r.budget_mode)
                                         for task in cell.tasks if task in tasks], at)]


def with_lr(params: Params, lr: float) -> Params:
    raw = params.model_dump(mode="json")
    raw["train"]["recipe"]["lr"] = lr
    return parse_params(raw)


def calibrate(params: Params, tasks: list[str], lrs: list[float], seed: int, data: Path, slices: Path,
              scratch: Path) -> pd.DataFrame:
    """Train every trial; one row per (arch, task, lr)."""
    from pipeline.experiment import execute

    rows = []
    for lr in lrs:
        at = Folders(data, slices, scratch / f"lr{lr:g}" / "runs", scratch / f"lr{lr:g}" / "ckpt")
        specs = trial_specs(params, tasks, seed, at)
        for m in execute(specs, with_lr(params, lr), "calibrate", at.ckpt):
            rows.append({"arch": m["arch"], "task": m["task"], "lr": lr, "val_acc": m["val_acc"],
                         "id_acc": m["slices"].get("slice/id", m["slices"]["test"])["acc"],
                         "test_acc": m["test_acc"]})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 2e-3, 4e-3])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", nargs="+", default=None, help="default: every task in tasks.names")
    ap.add_argument("--data", type=Path, default=Path("data/tasks"))
    ap.add_argument("--slices", type=Path, default=Path("data/slices"))
    ap.add_argument("--out", type=Path, default=Path("reports/calibration"))
    args = ap.parse_args(argv)
    params = load_params(args.params)
    tasks = args.tasks or list(params.tasks.names)
    n = len(trial_specs(params, tasks, args.seed, Folders(args.data, args.slices, Path(), Path())))
    print(f"calibration: {n} cells x {len(args.lrs)} learning rates = {n * len(args.lrs)} runs", flush=True)
    with tempfile.TemporaryDirectory(prefix="calibrate-") as scratch:
        table = calibrate(params, tasks, args.lrs, args.seed, args.data, args.slices, Path(scratch))
    old = args.out / "calibration.csv"
    if args.tasks and old.exists():
        kept = pd.read_csv(old)
        table = pd.concat([kept[~kept.task.isin(tasks)], table])
    table = table.sort_values(["task", "arch", "lr"])
    write_with(old, lambda tmp: table.to_csv(tmp, index=False))
    write_text(args.out / "calibration.md", markdown(table, params, args.seed))
    print(markdown(table, params, args.seed))
    return 0


def markdown(table: pd.DataFrame, params, seed: int) -> str:
    """The calibration table (validation accuracy per task x arch x lr) with the recipe it was run under."""
    lrs = sorted(table.lr.unique())
    wide = table.pivot_table(index=["task", "arch"], columns="lr", values="val_acc").round(3)
    wide.columns = [f"val acc @ lr {c:g}" for c in wide.columns]
    r = params.train.recipe
    return "\n".join([
        "# Recipe calibration (matched across architectures)",
        "",
        f"Measurement: validation accuracy after {r.steps} steps (batch {r.batch_size}, AdamW, wd "
        f"{r.weight_decay}, {r.warmup_steps} warmup steps, cosine), one seed ({seed}), for each learning "
        f"rate in {[float(x) for x in lrs]}. Every architecture got the same {len(lrs)} trials per task "
        f"({len(table)} runs in all, `python -m bench.calibrate`). The default recipe uses lr {r.lr:g} for every "
        "architecture. A cell that stays near chance at every learning rate is not a recipe problem at this budget.",
        "",
        wide.reset_index().to_markdown(index=False),
        "",
    ])


if __name__ == "__main__":
    raise SystemExit(main())
