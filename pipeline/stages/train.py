"""`train` stage: every training run of the study in one worker pool: each architecture of ``train.archs`` (its
main grid, ``tasks`` x ``train.seeds`` at ``train.size``, plus each ``train.grids`` entry that lists it: sizes,
steps, data draws, budget mode) and each DeiT student of ``distill.students`` (``distill.tasks`` x ``train.seeds``,
distilled from its verified teacher: a run refuses to start if the teacher's weights do not match the sha256 in
its provenance record). Every run of a cell trains at the learning rate the tune stage chose for it.

Runs fan out to workers (:func:`pipeline.executor.map_runs`), longest first; this process writes and tracks.
Outputs per run: ``<out>/<arch>/<task>/n<size>-t<steps>-s<seed>-d<data_seed>/{metrics.json,predictions.npz,
weights.pt}``; checkpoints in ``<ckpt>/...`` (scratch, not a DVC output: an interrupted run resumes).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.grid import train_specs
from pipeline.stages.common import parse_stage, run_folders, run_training, stage_main, training_parser
from pipeline.tune import read_choice


@stage_main
def main(argv: list[str] | None = None) -> None:
    parser = training_parser(__doc__)
    parser.add_argument("--tune", type=Path, help="data/tune/choice.json: each cell's learning rate (omitted: "
                        "train.recipe.lr everywhere)")
    args, params = parse_stage(parser, argv)

    specs = train_specs(params, run_folders(args), read_choice(args.tune, params) if args.tune else None)
    run_training("train", specs, params, args)


if __name__ == "__main__":
    raise SystemExit(main())
