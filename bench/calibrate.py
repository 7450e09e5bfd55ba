"""Matched recipe calibration: the same learning-rate trials for every architecture on every task.

    python -m bench.calibrate [--lrs 1e-3 2e-3 4e-3] [--seed 0] [--tasks T ...] [--out reports/calibration]

Every (arch, task, lr) trains once at the default budget (``train.recipe`` with only ``lr`` changed), on the
default data (``dvc repro`` must have produced ``data/tasks`` and ``data/slices``). The table says, per arch
and task, the in-distribution validation accuracy at each lr, so a reader can tell a recipe problem (one lr
escapes a plateau, another does not) from an architectural one (no lr escapes), and sees that every
architecture got exactly the same number of trials. Runs log to MLflow experiment ``<prefix>-calibrate``.
``--tasks`` recalibrates only those tasks (after a difficulty change) and keeps the other tasks' rows.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

from pipeline.config import load_params
from pipeline.io import write_text, write_with
from pipeline.learner import quiet_lightning


def trials(params, tasks: list[str], lrs: list[float], seed: int, scratch: Path):
    from pipeline.experiment import RunSpec

    for arch in params.train.archs:
        for task in tasks:
            for lr in lrs:
                tag = f"{arch}-{task}-lr{lr:g}"
                yield lr, RunSpec(stage="calibrate", task=task, arch=arch, seed=seed, train_size=params.train.size,
                                  data_dir=Path("data/tasks") / task, slices_dir=Path("data/slices") / task,
                                  out_dir=scratch / tag / "out", ckpt_dir=scratch / tag / "ckpt",
                                  label=f"{arch}@lr{lr:g}")


def run_lr(item):
    """One trial in a worker: the default params with only the learning rate changed."""
    from pipeline.experiment import run

    params, lr, spec = item
    raw = params.model_dump(mode="json")
    raw["train"]["recipe"]["lr"] = lr
    from pipeline.config import parse_params

    return lr, spec.arch, run(spec, parse_params(raw))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 2e-3, 4e-3])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", nargs="+", default=None, help="default: every task of train.tasks")
    ap.add_argument("--out", type=Path, default=Path("reports/calibration"))
    args = ap.parse_args(argv)
    params = load_params(args.params)
    tasks = args.tasks or params.train.tasks
    quiet_lightning()
    import multiprocessing

    with tempfile.TemporaryDirectory(prefix="calibrate-") as scratch:
        items = [(params, lr, spec) for lr, spec in trials(params, tasks, args.lrs, args.seed, Path(scratch))]
        print(f"calibration: {len(items)} runs ({len(params.train.archs)} archs x {len(tasks)} tasks "
              f"x {len(args.lrs)} learning rates) on {params.train.runtime.workers} workers", flush=True)
        with multiprocessing.get_context("fork").Pool(params.train.runtime.workers) as pool:
            results = pool.map(run_lr, items)
    rows = [{"arch": arch, "task": m["task"], "lr": lr, "val_acc": m["val_acc"],
             "id_acc": m["slices"].get("slice/id", m["slices"]["test"])["acc"], "test_acc": m["test_acc"],
             "final_train_loss": (m["curve"][-1].get("train_loss") if m["curve"] else None)}
            for lr, arch, m in results]
    table = pd.DataFrame(rows)
    old = args.out / "calibration.csv"
    if args.tasks and old.exists():
        kept = pd.read_csv(old)
        table = pd.concat([kept[~kept.task.isin(tasks)], table])
    table = table.sort_values(["task", "arch", "lr"])
    write_with(args.out / "calibration.csv", lambda tmp: table.to_csv(tmp, index=False))
    write_text(args.out / "calibration.md", markdown(table, params, args.seed))
    print(markdown(table, params, args.seed))


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
    main()
