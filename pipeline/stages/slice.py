"""Stage ``slice``: cut one task's pool into nested training subsets, val, test and evaluation slices.

Reads ``<data>/labels.npy``, ``factors.csv`` and ``meta.json`` (checking the labels against their recorded
sha256); writes ``<out>/indices.npz`` (int64 arrays, byte-deterministic) and ``<out>/manifest.json``
together, or nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.errors import ConfigError, StageError
from pipeline.io import atomic_dir, checked_arrays, read_json, save_npz, sha256_bytes, sha256_file, write_json
from pipeline.schemas import TASK_META
from pipeline.slicing import make_splits, manifest
from pipeline.stages.common import parse_stage, stage_main
from pipeline.tasks import TASKS


def load_task(folder: Path) -> tuple[np.ndarray, pd.DataFrame, dict]:
    meta = read_json(folder / "meta.json", TASK_META)
    try:
        labels = np.load(checked_arrays(folder / "labels.npy"), allow_pickle=False)
        factors = pd.read_csv(folder / "factors.csv", keep_default_na=False)
    except (OSError, ValueError) as err:
        raise StageError(f"{folder}: cannot read the task data ({err})") from None
    if sha256_bytes(labels.tobytes()) != meta["sha256"]["labels"]:
        raise StageError(f"{folder / 'labels.npy'}: sha256 differs from meta.json (modified after generation?)")
    if len(factors) != len(labels) or "role" not in factors.columns:
        what = f"{len(factors)} rows for {len(labels)} labels" if len(factors) != len(labels) else "no role column"
        raise StageError(f"{folder / 'factors.csv'}: {what}; rerun the data stage")
    k, names = meta["num_classes"], meta["class_names"]
    if len(names) != k or (len(labels) and not 0 <= labels.min() <= labels.max() < k):
        raise StageError(f"{folder / 'meta.json'}: num_classes {k} and {len(names)} class_names do not describe "
                         f"labels.npy (labels {labels.min()}..{labels.max()}); rerun the data stage")
    return labels, factors, meta


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True)
    ap.add_argument("--data", required=True, help="the task's folder from the data stage")
    ap.add_argument("--out", required=True, help="folder for indices.npz and manifest.json")
    return ap


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv, {"task": "tasks.names"})
    data = Path(args.data)
    labels, factors, meta = load_task(data)
    spec = TASKS[args.task]
    factors = factors.join(spec.derive(factors, params))
    try:
        arrays = make_splits(labels, factors, meta["num_classes"], spec.slice_factors, params.slice,
                             params.seed, args.task, twins=spec.twins)
    except ConfigError as err:
        raise ConfigError(f"{args.params}: {err}") from None
    source = {"images_sha256": meta["sha256"]["images"], "labels_sha256": meta["sha256"]["labels"],
              "factors_sha256": sha256_file(data / "factors.csv")}
    with atomic_dir(args.out) as tmp:
        save_npz(tmp / "indices.npz", arrays)
        write_json(tmp / "manifest.json",
                   manifest(arrays, labels, factors, meta["class_names"], source, twins=spec.twins))
    sizes = {k: len(v) for k, v in arrays.items() if not k.startswith("slice/")}
    print(f"{args.task}: {sizes}, {sum(k.startswith('slice/') for k in arrays)} slices -> {args.out}")


if __name__ == "__main__":
    raise SystemExit(main())
