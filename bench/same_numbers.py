"""Did a refactor change a number? The same training runs under two revisions of the code, compared bit for bit.

    python -m bench.same_numbers --base REV [--head WORKTREE] [--archs vit resnet ...] [--task alignment]
                                 [--seeds 0] [--steps 300] [--out reports/same_numbers.md]

A cleanup of the house (modules split, imports moved, identity rules changed) must leave every number where it
was. Comparing ledgers across machines cannot show that (kernels differ: ``bench.kernels``); this does, on one
machine: each revision trains the same main-grid runs (one per architecture given; by default one per family)
on the same data, in its own process with its own package (``PYTHONPATH`` and working directory at that
revision's checkout), and the logits, weights and metrics of each pair are compared. ``--base`` is any git
revision (checked out into a scratch worktree); ``--head`` the working tree by default.

Needs ``data/tasks/<task>`` and ``data/slices/<task>`` (``dvc repro slice@<task>``). Writes nothing but ``--out``.
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
import torch
import yaml

from pipeline.io import write_text

ONE_PER_FAMILY = ["vit", "swin", "resnet", "mixer", "convmixer"]
# the metrics a refactor may move: when and how long a run took, and the code identity (what the refactor changes)
VOLATILE = {"measured", "identity", "mlflow_run_id", "provenance", "started", "finished", "environment"}
CHILD = ("from pathlib import Path; import sys; from bench.kernels import keys, scratch_params; "
         "from pipeline.config import load_params; from pipeline.experiment import execute; "
         "from pipeline.grid import Folders, specs_for; "
         "a = sys.argv[1:]; at = Folders(Path(a[0]), Path(a[1]), Path(a[2]) / 'runs', Path(a[2]) / 'ckpt'); "
         "params = scratch_params(load_params(a[3]), Path(a[2]) / 'mlflow.db').for_task(a[4]); "
         "execute(specs_for('train', keys(params, a[6:], a[4], [int(a[5])], 0), at), params, 'same', at.ckpt)")


def train(checkout: Path, scratch: Path, args, params_file: Path, seed: int) -> None:
    """Train the runs with ``checkout``'s package, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, "-c", CHILD, str(args.data.resolve()), str(args.slices.resolve()), str(scratch),
                    str(params_file), args.task, str(seed), *args.archs], cwd=checkout, env=env, check=True)


def read(scratch: Path, arch: str, task: str) -> dict:
    (run,) = (scratch / "runs" / arch / task).iterdir()
    metrics = json.loads((run / "metrics.json").read_text())
    with np.load(run / "predictions.npz") as z:
        logits = z["logits"]
    weights = torch.load(run / "weights.pt", map_location="cpu", weights_only=True)
    return {"metrics": {k: v for k, v in metrics.items() if k not in VOLATILE}, "logits": logits, "weights": weights}


def compare(base: dict, head: dict) -> dict:
    same_weights = base["weights"].keys() == head["weights"].keys() and all(
        torch.equal(base["weights"][k], head["weights"][k]) for k in base["weights"])
    return {"test_acc_base": base["metrics"].get("test_acc"), "test_acc_head": head["metrics"].get("test_acc"),
            "logits_identical": bool(np.array_equal(base["logits"], head["logits"])),
            "weights_identical": same_weights,
            "metrics_identical": json.dumps(base["metrics"], sort_keys=True)
            == json.dumps(head["metrics"], sort_keys=True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision of the code before the change")
    ap.add_argument("--head", type=Path, default=Path.cwd(), help="checkout of the code after it (this one)")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--archs", nargs="+", default=ONE_PER_FAMILY)
    ap.add_argument("--task", default="alignment")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=500, help="train.recipe.steps for these runs (fixed-step mode)")
    ap.add_argument("--data", type=Path, default=Path("data/tasks"))
    ap.add_argument("--slices", type=Path, default=Path("data/slices"))
    ap.add_argument("--out", type=Path, default=Path("reports/same_numbers.md"))
    args = ap.parse_args(argv)
    for path in (args.data / args.task, args.slices / args.task):
        if not path.is_dir():
            raise SystemExit(f"error: {path} is missing: run `dvc repro slice@{args.task}` first")
    base_rev = subprocess.run(["git", "rev-parse", "--short", args.base], capture_output=True, text=True, check=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="same-numbers-") as tmp:
        tmp = Path(tmp)
        raw = yaml.safe_load(args.params.read_text())
        raw["train"]["recipe"].update(steps=args.steps, budget_mode="steps")
        params_file = tmp / "params.yaml"
        params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
        base = tmp / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.base], check=True)
        try:
            for seed in args.seeds:
                for name, checkout in (("base", base), ("head", args.head.resolve())):
                    print(f"== {name} ({checkout}), seed {seed}: {len(args.archs)} runs", flush=True)
                    train(checkout, tmp / f"{name}{seed}", args, params_file, seed)
                for arch in args.archs:
                    rows.append({"arch": arch, "seed": seed, **compare(read(tmp / f"base{seed}", arch, args.task),
                                                                       read(tmp / f"head{seed}", arch, args.task))})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], check=False)
    table = pd.DataFrame(rows)
    verdict = ("every pair is bit-identical" if table[["logits_identical", "weights_identical",
                                                        "metrics_identical"]].all().all()
               else "SOME PAIRS DIFFER: the change moved a number")
    text = "\n".join([
        "# Same numbers before and after a code change",
        "",
        f"Written by `python -m bench.same_numbers` (its docstring says how): base `{base_rev.stdout.strip()}` "
        f"against the working tree, `{args.task}`, {args.steps} steps, seeds {args.seeds}, on one machine. "
        f"Metrics compared without {', '.join(sorted(VOLATILE))}.",
        "",
        table.to_markdown(index=False),
        "",
        f"**{verdict}.**",
        "",
    ])
    write_text(args.out, text)
    print(text)
    return 0 if "DIFFER" not in verdict else 1


if __name__ == "__main__":
    raise SystemExit(main())
