"""`train` stage: every run of one architecture: its main grid (``train.archs.<arch>.tasks`` x ``train.seeds``
at ``train.size``) plus each ``train.grids`` entry that lists it (sizes, steps, data draws, budget mode).

Runs fan out to workers (:func:`pipeline.executor.map_runs`); this process writes and tracks. Outputs per run:
``<out>/<task>/n<size>-t<steps>-s<seed>-d<data_seed>/{metrics.json,predictions.npz,weights.pt}``; checkpoints in
``<ckpt>/...`` (a persisted DVC output: an interrupted run resumes).
"""

from __future__ import annotations

import argparse

from pipeline.config import load_params
from pipeline.errors import ConfigError
from pipeline.stages.common import add_run_paths, quiet_lightning, stage_main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--arch", required=True, help="a key of train.archs")
    add_run_paths(p)
    return p.parse_args(argv)


@stage_main
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    params = load_params(args.params)
    if args.arch not in params.train.archs:
        raise ConfigError(f"{args.params}: train.archs: no architecture {args.arch!r} "
                          f"(configured: {', '.join(params.train.archs)})")
    quiet_lightning()
    from pipeline.experiment import execute, prune
    from pipeline.grid import specs_for, train_keys

    specs = specs_for("train", train_keys(params, args.arch), args.data, args.slices, args.out, args.ckpt)
    execute(specs, params, "train", f"train/{args.arch}", args.ckpt)
    prune(args.out, [s.out_dir for s in specs])  # after success: a failed stage changes nothing


if __name__ == "__main__":
    raise SystemExit(main())
