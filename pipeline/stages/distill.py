"""`distill` stage: one DeiT student (distillation token) per task and seed, from a verified teacher.

The student name (``deit``, ``deit_vit``) and its teacher architecture come from ``distill.students``; it trains
on ``distill.tasks`` x ``train.seeds`` at ``train.size``. Every run refuses to start if the teacher's weights do
not match the sha256 in its provenance record.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.stages.common import parse_stage, run_training, stage_main, training_parser


@stage_main
def main(argv: list[str] | None = None) -> None:
    parser = training_parser(__doc__, "--student", "a key of distill.students")
    parser.add_argument("--teachers", type=Path, required=True, help="the teacher stage output of its teacher")
    args, params = parse_stage(parser, argv, {"student": "distill.students"})
    from pipeline.grid import RunKey

    t, r = params.train, params.train.recipe
    keys = [RunKey(task, args.student, seed, t.size, r.steps, r.budget_mode)
            for task in params.distill.tasks for seed in t.seeds]
    run_training("distill", args.student, keys, params, args,
                 teacher=params.distill.students[args.student], teacher_dir=args.teachers)


if __name__ == "__main__":
    raise SystemExit(main())
