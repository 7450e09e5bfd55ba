"""`distill` stage: one DeiT student (distillation token) per task and seed, from a verified teacher.

The student label (``deit``, ``deit_vit``) and its teacher architecture come from ``distill.students``.
Every run refuses to start if the teacher's weights do not match the sha256 in its provenance record.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.stages.common import add_run_paths, parse_stage, quiet_lightning, stage_main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--student", required=True, help="a key of distill.students")
    p.add_argument("--teachers", type=Path, required=True, help="the teacher stage output of this student's teacher")
    add_run_paths(p)
    return p


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv, {"student": "distill.students"})
    quiet_lightning()
    from pipeline.experiment import RunSpec, prune, run_pool

    specs = [RunSpec(stage="train", task=task, arch="deit", label=args.student, seed=seed,
                     train_size=params.train.size, data_dir=args.data / task, slices_dir=args.slices / task,
                     out_dir=args.out / task / f"n{params.train.size}" / f"s{seed}",
                     ckpt_dir=args.ckpt / task / f"n{params.train.size}" / f"s{seed}", teacher_dir=args.teachers)
             for task in params.distill.tasks for seed in params.train.seeds]
    prune(args.out, [s.out_dir for s in specs])
    print(f"distill {args.student}: {len(specs)} runs on {params.train.runtime.workers} worker(s)", flush=True)
    for m in run_pool(specs, params, params.train.runtime.workers):
        print(f"{m['task']}/{m['arch']}/s{m['seed']}: test acc {m['test_acc']:.3f} "
              f"(teacher {m['teacher']['arch']} {m['teacher']['test_acc']:.3f})")


if __name__ == "__main__":
    raise SystemExit(main())
