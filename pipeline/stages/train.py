"""`train` stage: every run of one architecture: its main grid (``train.archs.<arch>.tasks`` x ``train.seeds``
at ``train.size``) plus each ``train.grids`` entry that lists it (sizes, steps, data draws, budget mode).

Runs fan out to workers (:func:`pipeline.executor.map_runs`); this process writes and tracks. Outputs per run:
``<out>/<task>/n<size>-t<steps>-s<seed>-d<data_seed>/{metrics.json,predictions.npz,weights.pt}``; checkpoints in
``<ckpt>/...`` (a persisted DVC output: an interrupted run resumes).
"""

from __future__ import annotations

from pipeline.stages.common import parse_stage, run_training, stage_main, training_parser


@stage_main
def main(argv: list[str] | None = None) -> None:
    parser = training_parser(__doc__, "--arch", "a key of train.archs")
    args, params = parse_stage(parser, argv, {"arch": "train.archs"})
    from pipeline.grid import train_keys

    run_training("train", args.arch, train_keys(params, args.arch), params, args)


if __name__ == "__main__":
    raise SystemExit(main())
