"""`teacher` stage: train one teacher architecture on every distilled task, and record its provenance.

Outputs per task: ``<out>/<task>/model.pt`` (the weights students load), ``provenance.json`` (what students
cite: run id, architecture, checkpoint sha256, data and slice hashes, accuracy, compute), ``metrics.json``
and ``predictions.npz`` (for teacher-agreement measures).
"""

from __future__ import annotations

import argparse
import json

from pipeline.stages.common import add_run_paths, parse_stage, quiet_lightning, stage_main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--arch", required=True, help="teacher architecture (one of distill.teachers)")
    add_run_paths(p)
    return p


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv, {"arch": "distill.teachers"})
    quiet_lightning()
    from pipeline.distill import PROVENANCE, WEIGHTS, provenance
    from pipeline.experiment import RunSpec, prune, run_pool
    from pipeline.io import write_json

    size, seed = params.train.size, params.distill.teacher_seed
    specs = [RunSpec(stage="teacher", task=task, arch=args.arch, seed=seed, train_size=size,
                     data_dir=args.data / task, slices_dir=args.slices / task, out_dir=args.out / task,
                     ckpt_dir=args.ckpt / task)
             for task in params.distill.tasks]
    prune(args.out, [s.out_dir for s in specs])
    print(f"teacher {args.arch}: {len(specs)} runs on {params.train.runtime.workers} worker(s)", flush=True)
    for spec, m in zip(specs, run_pool(specs, params, params.train.runtime.workers, save_weights=True), strict=True):
        manifest = json.loads((spec.slices_dir / "manifest.json").read_text())
        record = provenance(m, spec.out_dir / WEIGHTS, manifest.get("sha256", {}).get(f"train_{size}", ""))
        write_json(spec.out_dir / PROVENANCE, record)
        print(f"teacher {args.arch} on {spec.task}: test acc {m['test_acc']:.3f}, "
              f"sha256 {record['checkpoint_sha256'][:12]}")


if __name__ == "__main__":
    raise SystemExit(main())
