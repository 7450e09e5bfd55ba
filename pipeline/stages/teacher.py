"""`teacher` stage: train one teacher architecture on every distilled task, on a transfer set disjoint from
the students' images (``train_<distill.teacher_size>`` minus ``train_<train.size>``), and record its provenance.

Outputs per task: ``<out>/<task>/weights.pt`` (the weights students load, also logged to MLflow),
``provenance.json`` (what students cite and verify: run id, artifact URI, checkpoint sha256, transfer set, data
hashes, accuracy and disagreement with the true labels on the students' images, compute), ``metrics.json`` and
``predictions.npz``.
"""

from __future__ import annotations

from pipeline.stages.common import parse_stage, run_training, stage_main, training_parser


@stage_main
def main(argv: list[str] | None = None) -> None:
    parser = training_parser(__doc__, "--arch", "teacher architecture (one of distill.teachers)")
    args, params = parse_stage(parser, argv, {"arch": "distill.teachers"})
    from pipeline.grid import RunKey

    d, r = params.distill, params.train.recipe
    keys = [RunKey(task, args.arch, d.teacher_seed, d.teacher_size - params.train.size, r.steps, r.budget_mode)
            for task in d.tasks]
    for m in run_training("teacher", args.arch, keys, params, args):
        print(f"teacher/{args.arch}/{m['task']}: test acc {m['test_acc']:.3f}, disagrees with the true label on "
              f"{m['student_train']['disagreement']:.1%} of the students' images")


if __name__ == "__main__":
    raise SystemExit(main())
