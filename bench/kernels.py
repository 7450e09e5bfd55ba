"""Reproducibility across machines: how far one training run moves when only the CPU kernels change, beside a seed.

    python -m bench.kernels [--params params.yaml] [--archs vit resnet] [--task alignment] [--data-seed 1]
                            [--seeds 0 1 2] [--out reports/kernels.md]

A run is bit-identical on a rerun on the same machine (tests/test_executor.py, tests/test_train.py). Another
machine may dispatch torch, MKL and oneDNN to other kernels, which sum in another order: the question for a
reader comparing numbers across machines is whether that is a rounding-sized change or a new draw. Here the
same run (one arch, task, data draw and seed at the params.yaml recipe) trains under each kernel choice this
machine can make (each setting in its own process, since the variables act when torch and MKL load; one
setting twice, as the control that must come out identical), and again with other seeds under this machine's
default kernels. Each is compared with this machine's default run: the test accuracy, the share of test images
predicted otherwise, the largest logit difference, and whether the logits are bit-identical. With
``--data-seed`` 1 the run is one of the study's ``draws`` cells, so the committed study's number (its machine)
stands beside them.

Needs ``data/tasks/<task>`` and ``data/slices/<task>`` (``dvc repro slice@<task>``); runs go to a scratch folder
and a scratch MLflow store, not to the study's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.config import Params, load_params, parse_params
from pipeline.environment import KERNEL_VARIABLES, environment
from pipeline.executor import ADDRESS_ENV
from pipeline.grid import Folders, RunKey, specs_for
from pipeline.io import write_text

DEFAULT = "this machine's default"
CONTROL = "default again (control)"  # a fresh process, the same kernels: must come out bit-identical
# name -> the variables set for that process (pipeline.environment.KERNEL_VARIABLES)
SETTINGS = {
    DEFAULT: {},
    CONTROL: {},
    "ATEN_CPU_CAPABILITY=default": {"ATEN_CPU_CAPABILITY": "default"},  # torch's kernels without SIMD dispatch
    "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},  # MKL's portable code path (its matmuls)
    "ONEDNN_MAX_CPU_ISA=SSE41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},  # oneDNN's convolutions at SSE4.1
}


def keys(params: Params, archs: list[str], task: str, seeds: list[int], data_seed: int) -> list[RunKey]:
    r = params.train.recipe
    return [RunKey(task, arch, seed, params.train.size, r.steps, r.budget_mode, data_seed)
            for arch in archs for seed in seeds]


def scratch_params(params: Params, store: Path) -> Params:
    """``params`` on a scratch MLflow store, with runs on a local pool (whose workers inherit the setting)."""
    raw = params.model_dump(mode="json")
    raw["tracking"]["tracking_uri"] = f"sqlite:///{store}"
    raw["train"]["runtime"]["scheduler"] = None
    return parse_params(raw)


def child_env(base: dict[str, str], setting: str) -> dict[str, str]:
    """``base`` with exactly the setting's kernel variables, and no outside cluster (whose workers would not see
    them)."""
    return {k: v for k, v in base.items() if k not in (*KERNEL_VARIABLES, ADDRESS_ENV)} | SETTINGS[setting]


def child(args: argparse.Namespace) -> int:
    """One setting's runs, in this process's kernel environment (set by the parent)."""
    from pipeline.experiment import execute

    at = Folders(args.data, args.slices, args.scratch / "runs", args.scratch / "ckpt")
    params = scratch_params(load_params(args.params), args.scratch / "mlflow.db").for_task(args.task)
    execute(specs_for("train", keys(params, args.archs, args.task, args.seeds, args.data_seed), at), params,
            "kernels", at.ckpt)
    (args.scratch / "environment.json").write_text(json.dumps(environment()))
    return 0


def train_setting(index: int, name: str, seeds: list[int], args, scratch: Path) -> Path:
    """Train one setting's runs in a fresh process whose kernel variables are exactly the setting's."""
    folder = scratch / f"setting{index}"
    env = child_env(dict(os.environ), name)
    print(f"== {name}: {len(args.archs) * len(seeds)} runs", flush=True)
    subprocess.run([sys.executable, "-m", "bench.kernels", "--child", "--scratch", str(folder),
                    "--params", str(args.params), "--data", str(args.data), "--slices", str(args.slices),
                    "--task", args.task, "--data-seed", str(args.data_seed), "--archs", *args.archs,
                    "--seeds", *map(str, seeds)], env=env, check=True)
    return folder


def read_run(folder: Path, key: RunKey) -> dict:
    run = folder / "runs" / key.arch / key.folder
    metrics = json.loads((run / "metrics.json").read_text())
    with np.load(run / "predictions.npz") as z:
        logits = z["logits"]
    return {"test_acc": metrics["test_acc"], "val_acc": metrics["val_acc"], "logits": logits}


def compare(runs: dict[tuple[str, str, int], dict], seed0: int) -> pd.DataFrame:
    """One row per run: its accuracies and how it differs from this machine's default run at ``seed0``."""
    rows = []
    for (setting, arch, seed), run in runs.items():
        ref = runs[(DEFAULT, arch, seed0)]
        rows.append({"arch": arch, "kernels": setting, "seed": seed, "test_acc": run["test_acc"],
                     "val_acc": run["val_acc"], "delta_test_acc": run["test_acc"] - ref["test_acc"],
                     "predictions_differ": float(np.mean(run["logits"].argmax(1) != ref["logits"].argmax(1))),
                     "max_logit_diff": float(np.abs(run["logits"] - ref["logits"]).max()),
                     "logits_identical": bool(np.array_equal(run["logits"], ref["logits"]))})
    return pd.DataFrame(rows)


def committed(accuracy_csv: Path, params: Params, key: RunKey) -> float | None:
    """The committed study's test accuracy for ``key`` where the study ran exactly that run: ``key`` lies in its
    ``draws`` grid (one seed, so its cell is one run)."""
    draws, t, r = params.train.grids.get("draws"), params.train, params.train.recipe
    if not accuracy_csv.exists() or draws is None:
        return None
    inside = (key.arch in (draws.archs or list(t.archs)) and key.task in (draws.tasks or t.archs[key.arch].tasks)
              and key.data_seed in (draws.data_seeds or [0]) and (draws.seeds or t.seeds) == [key.seed]
              and key.train_size in (draws.sizes or [t.size]) and key.steps in (draws.steps or [r.steps])
              and key.budget_mode == (draws.budget_mode or r.budget_mode))
    if not inside:
        return None
    table = pd.read_csv(accuracy_csv)
    hit = table[(table.task == key.task) & (table.arch == key.arch) & (table.train_size == key.train_size)
                & (table.steps == key.steps) & (table.budget_mode == key.budget_mode)
                & (table.data_seed == key.data_seed) & (table.n == 1)]
    return float(hit["mean"].iloc[0]) if len(hit) == 1 else None


def _span(values: pd.Series, fmt: str) -> str:
    return f"{values.min():{fmt}}-{values.max():{fmt}}"


def summary(table: pd.DataFrame, seed0: int) -> list[str]:
    """Per arch: the kernel-only changes beside the seed-to-seed changes, in numbers."""
    lines = []
    for arch, t in table.groupby("arch", sort=False):
        kern = t[(t.seed == seed0) & ~t.kernels.isin([DEFAULT, CONTROL])]
        seeds = t[(t.kernels == DEFAULT) & (t.seed != seed0)]
        same = "bit-identical" if t[t.kernels == CONTROL].logits_identical.all() else "NOT identical"
        lines.append(
            f"- **{arch}**: the control rerun is {same}; a kernel change alone moves the test accuracy by "
            f"{_span(kern.delta_test_acc.abs(), '.4f')} and changes {_span(kern.predictions_differ, '.1%')} of the "
            f"test predictions; another seed moves it by {_span(seeds.delta_test_acc.abs(), '.4f')} and changes "
            f"{_span(seeds.predictions_differ, '.1%')}.")
    return lines


def markdown(table: pd.DataFrame, environments: dict[str, dict], params: Params, args, seed0: int,
             reference: dict[str, float | None]) -> str:
    r = params.train.recipe
    env = environments[DEFAULT]
    shown = table.assign(
        test_acc=table.test_acc.map("{:.4f}".format), val_acc=table.val_acc.map("{:.4f}".format),
        delta_test_acc=table.delta_test_acc.map("{:+.4f}".format),
        predictions_differ=table.predictions_differ.map("{:.1%}".format),
        max_logit_diff=table.max_logit_diff.map("{:.2g}".format),
        logits_identical=table.logits_identical.map({True: "yes", False: "no"}),
        cpu_capability=table.kernels.map(lambda k: environments[k]["cpu_capability"]))
    here = table[(table.kernels == DEFAULT) & (table.seed == seed0)].set_index("arch").test_acc
    ref_lines = [f"- {arch}: **{acc:.4f}** (`reports/tables/accuracy.csv`, the `draws` cell {args.task}/{arch}, "
                 f"data seed {args.data_seed}, one run), against {here[arch]:.4f} here."
                 for arch, acc in reference.items() if acc is not None]
    return "\n".join([
        "# Reproducibility across machines: CPU kernels beside seeds",
        "",
        "Written by `python -m bench.kernels` (its docstring says how). Each row is one training run of "
        f"`{args.task}` (train size {params.train.size}, data draw {args.data_seed}, {r.steps} steps at the "
        "params.yaml recipe) in its own process; *kernels* is what that process was told to dispatch to, "
        "*cpu capability* what torch then reported. Every difference is against this machine's default run at "
        f"seed {seed0}.",
        "",
        f"This machine: {env['cpu']}, torch {env['torch']} (dispatching to {env['cpu_capability']}), timm "
        f"{env['timm']}, lightning {env['lightning']}, numpy {env['numpy']}, Python {env['python']}.",
        "",
        shown[["arch", "kernels", "seed", "cpu_capability", "test_acc", "val_acc", "delta_test_acc",
               "predictions_differ", "max_logit_diff", "logits_identical"]].to_markdown(index=False,
                                                                                        disable_numparse=True),
        "",
        *summary(table, seed0),
        "",
        *(["The committed study ran on another machine. Its number for the same run:", "", *ref_lines, ""]
          if ref_lines else []),
        "What follows for a reader: numbers are bit-identical only on the same kernels and versions (every "
        "MLflow run carries the stage process's as `env.*` tags, `pipeline/environment.py`, and the executor "
        "warns about a worker whose differ). Across machines, compare seed means and their intervals, which the "
        "report gives, not single runs.",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--archs", nargs="+", default=["vit", "resnet"])
    ap.add_argument("--task", default="alignment")
    ap.add_argument("--data-seed", type=int, default=1, help="1: a draws cell of the study (its number is shown)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the first also runs under every setting")
    ap.add_argument("--data", type=Path, default=Path("data/tasks"))
    ap.add_argument("--slices", type=Path, default=Path("data/slices"))
    ap.add_argument("--out", type=Path, default=Path("reports/kernels.md"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    params = load_params(args.params)
    for path in (args.data / args.task, args.slices / args.task):
        if not path.is_dir():
            raise SystemExit(f"error: {path} is missing: run `dvc repro slice@{args.task}` first")
    seed0 = args.seeds[0]
    runs, environments = {}, {}
    with tempfile.TemporaryDirectory(prefix="kernels-") as tmp:
        for index, name in enumerate(SETTINGS):
            seeds = args.seeds if name == DEFAULT else [seed0]
            folder = train_setting(index, name, seeds, args, Path(tmp))
            environments[name] = json.loads((folder / "environment.json").read_text())
            for key in keys(params, args.archs, args.task, seeds, args.data_seed):
                runs[(name, key.arch, key.seed)] = read_run(folder, key)
    table = compare(runs, seed0)
    reference = {key.arch: committed(Path("reports/tables/accuracy.csv"), params, key)
                 for key in keys(params, args.archs, args.task, [seed0], args.data_seed)}
    text = markdown(table, environments, params, args, seed0, reference)
    write_text(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
