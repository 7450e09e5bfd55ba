"""`distill` stage: one DeiT student (distillation token) per task and seed, from a verified teacher.

The student name (``deit``, ``deit_vit``) and its teacher architecture come from ``distill.students``; it trains
on ``distill.tasks`` x ``train.seeds`` at ``train.size``. Every run refuses to start if the teacher's weights do
not match the sha256 in its provenance record.
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
    from pipeline.experiment import execute, prune
    from pipeline.grid import RunKey, specs_for

    t, r = params.train, params.train.recipe
    keys = [RunKey(task, args.student, seed, t.size, r.steps, r.budget_mode)
            for task in params.distill.tasks for seed in t.seeds]
    specs = specs_for("distill", keys, args.data, args.slices, args.out, args.ckpt,
                      teacher=params.distill.students[args.student], teacher_dir=args.teachers)
    execute(specs, params, "distill", f"distill/{args.student}", args.ckpt)
    prune(args.out, [s.out_dir for s in specs])  # after success: a failed stage changes nothing


if __name__ == "__main__":
    raise SystemExit(main())
