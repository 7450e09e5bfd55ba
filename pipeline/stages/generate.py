"""Stage ``data``: generate one task's pool (or import CIFAR-10), write it whole, draw a sample grid.

Writes ``<out>/images.npy`` (uint8 N,H,W,C), ``labels.npy`` (int64 N), ``factors.csv`` and ``meta.json``
into a temporary folder that replaces ``<out>`` only when everything succeeded (no partial output).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pipeline.io import atomic_dir, save_figure, sha256_bytes, sha256_file, write_json
from pipeline.stages.common import parse_stage, stage_main
from pipeline.tasks import TASKS
from pipeline.tasks.natural import NaturalParams, candidate_paths, resolve_path
from pipeline.tasks.preview import sample_grid


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True)
    ap.add_argument("--out", required=True, help="folder for this task's arrays (data/tasks/<task>)")
    ap.add_argument("--samples", help="PNG sample grid (reports/samples/<task>.png)")
    return ap


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv, {"task": "tasks.names"})
    cfg, spec, geo = getattr(params.tasks, args.task), TASKS[args.task], params.geometry
    start = time.perf_counter()
    data = spec.generate(cfg.n, params.seed, geo, cfg)
    seconds = time.perf_counter() - start
    meta = {
        "task": args.task, "num_classes": len(data.class_names), "class_names": data.class_names,
        "image_size": geo.image_size, "patch_size": geo.patch_size, "channels": geo.channels,
        "n": len(data.labels), "seed": params.seed, "params": cfg.model_dump(),
        "sha256": {"images": sha256_bytes(data.images.tobytes()), "labels": sha256_bytes(data.labels.tobytes())},
    }
    if isinstance(cfg, NaturalParams):
        archive = resolve_path(cfg)
        chosen = cfg.path[candidate_paths(cfg).index(archive)]  # as configured: the same on every machine
        meta["archive"] = {"path": chosen, "sha256": sha256_file(archive)}
    with atomic_dir(args.out) as tmp:
        np.save(tmp / "images.npy", data.images)
        np.save(tmp / "labels.npy", data.labels)
        data.factors.to_csv(tmp / "factors.csv", index=False)
        for name, array in getattr(data, "extra_arrays", {}).items():  # e.g. natural: native 32 px eval rows
            np.save(tmp / f"{name}.npy", array)
        write_json(tmp / "meta.json", meta)
    if args.samples:
        title = f"{args.task}: {len(data.labels)} samples at {geo.image_size} px, patch grid {geo.patch_size} px"
        save_figure(sample_grid(data, spec.slice_factors[0], geo.patch_size, title), args.samples)
    print(f"{args.task}: {len(data.labels)} images {data.images.shape[1:]} in {seconds:.2f} s "
          f"({len(data.labels) / seconds:,.0f}/s) -> {args.out}  sha256 {meta['sha256']['images'][:12]}")


if __name__ == "__main__":
    raise SystemExit(main())
