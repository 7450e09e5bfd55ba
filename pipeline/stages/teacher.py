"""`teacher` stage: every teacher architecture of ``distill.teachers`` on every task its students train on, on a
teacher set disjoint from the students' images (``train_<distill.teacher_size>`` minus ``train_<train.size>``),
with its provenance.

Outputs per teacher and task, ``<out>/<arch>/<task>/``: ``weights.pt`` (the weights students load, also logged to
MLflow), ``provenance.json`` (what students cite and verify: run id, artifact URI, checkpoint sha256, its own
training set, data hashes, accuracy and disagreement with the true labels on the students' images and on the
task's transfer set, compute), ``metrics.json`` and ``predictions.npz``.
"""

from __future__ import annotations

from pipeline.grid import teacher_specs
from pipeline.stages.common import parse_stage, run_folders, run_training, stage_main, training_parser


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(training_parser(__doc__, students=False), argv)

    for m in run_training("teacher", teacher_specs(params, run_folders(args)), params, args):
        where = f" and {m['transfer']['disagreement']:.1%} of the transfer set" if "transfer" in m else ""
        print(f"teacher/{m['arch']}/{m['task']}: test acc {m['test_acc']:.3f}, disagrees with the true label on "
              f"{m['student_train']['disagreement']:.1%} of the students' images{where}")


if __name__ == "__main__":
    raise SystemExit(main())
