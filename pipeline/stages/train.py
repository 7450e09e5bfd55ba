"""`train` stage: every (task, train size, seed) run of one architecture; dvc.yaml's matrix expands the archs.

``--grid main`` trains ``train.tasks`` at ``train.size``; ``--grid curve`` trains ``train.curve.tasks`` at every
``train.curve.sizes`` (the data-size axis). Runs of one stage share its process pool (see
:func:`pipeline.experiment.run_pool`). Outputs per run: ``<out>/<task>/n<size>/s<seed>/metrics.json`` and
``predictions.npz``; checkpoints in ``<ckpt>/...`` (a persisted DVC output: an interrupted run resumes).
"""

from __future__ import annotations

import argparse

from pipeline.config import Params, load_params
from pipeline.errors import ConfigError
from pipeline.stages.common import add_run_paths, quiet_lightning, stage_main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--arch", required=True)
    p.add_argument("--grid", choices=("main", "curve"), default="main")
    add_run_paths(p)
    return p.parse_args(argv)


def grid(params: Params, which: str) -> list[tuple[str, int, int]]:
    """(task, train size, seed) of every run in the main grid or on the data-size curve."""
    t = params.train
    tasks, sizes = (t.tasks, [t.size]) if which == "main" else (t.curve.tasks, t.curve.sizes)
    return [(task, size, seed) for task in tasks for size in sizes for seed in t.seeds]


@stage_main
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    params = load_params(args.params)
    quiet_lightning()
    from pipeline.models import ARCHS  # heavy imports only once the params are known to be valid

    if args.arch not in ARCHS:
        raise ConfigError(f"{args.params}: train.archs: unknown architecture {args.arch!r} "
                          f"(known: {', '.join(ARCHS)})")
    from pipeline.experiment import RunSpec, prune, run_pool

    stage = "train" if args.grid == "main" else "curve"
    specs = [RunSpec(stage=stage, task=task, arch=args.arch, seed=seed, train_size=size,
                     data_dir=args.data / task, slices_dir=args.slices / task,
                     out_dir=args.out / task / f"n{size}" / f"s{seed}",
                     ckpt_dir=args.ckpt / task / f"n{size}" / f"s{seed}")
             for task, size, seed in grid(params, args.grid)]
    prune(args.out, [s.out_dir for s in specs])
    print(f"{stage} {args.arch}: {len(specs)} runs on {params.train.runtime.workers} worker(s)", flush=True)
    for m in run_pool(specs, params, params.train.runtime.workers):
        print(f"{m['task']}/{m['arch']}/n{m['train_size']}/s{m['seed']}: test acc {m['test_acc']:.3f} "
              f"({m['measured']['wall_time_s']:.1f} s)")


if __name__ == "__main__":
    raise SystemExit(main())
