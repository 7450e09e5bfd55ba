"""Stage ``slice``: cut one task's pool into nested training subsets, val, test and evaluation slices.

Reads ``<data>/images.npy``, ``labels.npy``, ``factors.csv`` and ``meta.json`` (checking the arrays against
their recorded sha256; the images for their content digests: a copy of an image is never drawn twice);
writes ``<out>/indices.npz`` (int64 arrays, byte-deterministic) and ``<out>/manifest.json`` together, or nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.errors import ConfigError, StageError
from pipeline.io import (
    atomic_dir,
    check_kind,
    checked_arrays,
    read_json,
    save_npz,
    sha256_bytes,
    sha256_file,
    write_json,
)
from pipeline.schemas import TASK_META
from pipeline.slicing import image_digests, make_splits, manifest
from pipeline.stages.common import parse_stage, stage_main
from pipeline.tasks import TASKS


def load_task(folder: Path) -> tuple[np.ndarray, np.ndarray, pd.DataFrame, dict]:
    """(images, labels, factors, meta) of a task's folder, each checked against the others and meta.json."""
    meta = read_json(folder / "meta.json", TASK_META)
    loaded: dict = {}
    for name, read in (("images.npy", lambda p: np.load(checked_arrays(p), allow_pickle=False)),
                       ("labels.npy", lambda p: np.load(checked_arrays(p), allow_pickle=False)),
                       ("factors.csv", lambda p: pd.read_csv(check_kind(p), keep_default_na=False))):
        try:
            loaded[name] = read(folder / name)
        except (OSError, ValueError) as err:  # pandas' EmptyDataError and ParserError are ValueErrors
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise StageError(f"{folder / name}: cannot read it ({first[:160]}); rerun the data stage") from None
    images, labels, factors = loaded["images.npy"], loaded["labels.npy"], loaded["factors.csv"]
    if images.dtype != np.uint8 or images.ndim != 4 or len(images) != len(labels):
        raise StageError(f"{folder / 'images.npy'}: expected uint8 (N,H,W,C) matching labels, got {images.dtype} "
                         f"{images.shape} vs {labels.shape}")
    for name, arr in (("images", images), ("labels", labels)):
        if sha256_bytes(np.ascontiguousarray(arr).tobytes()) != meta["sha256"][name]:
            raise StageError(f"{folder / f'{name}.npy'}: sha256 differs from meta.json (modified after generation?)")
    if len(factors) != len(labels) or "role" not in factors.columns:
        what = f"{len(factors)} rows for {len(labels)} labels" if len(factors) != len(labels) else "no role column"
        raise StageError(f"{folder / 'factors.csv'}: {what}; rerun the data stage")
    k, names = meta["num_classes"], meta["class_names"]
    if len(names) != k or (len(labels) and not 0 <= labels.min() <= labels.max() < k):
        raise StageError(f"{folder / 'meta.json'}: num_classes {k} and {len(names)} class_names do not describe "
                         f"labels.npy (labels {labels.min()}..{labels.max()}); rerun the data stage")
    return images, labels, factors, meta


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
    images, labels, factors, meta = load_task(data)
    digests = image_digests(images)
    spec = TASKS[args.task]
    factors = factors.join(spec.derive(factors, params))
    try:
        arrays = make_splits(labels, factors, meta["num_classes"], spec.slice_factors, params.slice,
                             params.seed, args.task, twins=spec.twins, digests=digests)
    except ConfigError as err:
        raise ConfigError(f"{args.params}: {err}") from None
    source = {"images_sha256": meta["sha256"]["images"], "labels_sha256": meta["sha256"]["labels"],
              "factors_sha256": sha256_file(data / "factors.csv")}
    with atomic_dir(args.out) as tmp:
        save_npz(tmp / "indices.npz", arrays)
        write_json(tmp / "manifest.json",
                   manifest(arrays, labels, factors, meta["class_names"], source, twins=spec.twins))
    sizes = {k: len(v) for k, v in arrays.items() if not k.startswith("slice/")}
    copies = len(digests) - len(np.unique(digests))
    n_slices = sum(k.startswith("slice/") for k in arrays)
    print(f"{args.task}: {sizes}, {copies} pixel-identical copies never drawn, {n_slices} slices -> {args.out}")


if __name__ == "__main__":
    raise SystemExit(main())
