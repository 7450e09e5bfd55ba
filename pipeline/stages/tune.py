"""`tune` stage: matched learning-rate trials for every cell of the main grid (pipeline/tune.py states the policy).

Outputs: ``--choice`` (the learning rate of every (arch, task) cell: what the train stage reads), the trials'
runs under ``<out>/lr<lr>/`` and ``<report>/tuning.md`` + ``trials.csv``. The trials run in one round per value
of ``tune.lrs``, in order, each round racing the ones before it. With one value in ``tune.lrs`` nothing trains
and every cell gets that value.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeline import tune
from pipeline.grid import tune_specs
from pipeline.io import write_json, write_text
from pipeline.pruning import prune
from pipeline.stages.common import parse_stage, run_folders, run_training, stage_main, training_parser


@stage_main
def main(argv: list[str] | None = None) -> None:
    parser = training_parser(__doc__)
    parser.add_argument("--choice", type=Path, required=True, help="data/tune/choice.json: each cell's lr")
    parser.add_argument("--report", type=Path, required=True, help="reports/tune: the trial table")
    args, params = parse_stage(parser, argv)

    specs = tune_specs(params, run_folders(args))
    if not specs:  # trials of an earlier configuration are stale outputs now
        prune(args.out, [])
    metrics, every = [], tuple(s.out_dir for s in specs)  # no round prunes another round's trials
    for i, lr in enumerate(params.tune.lrs if specs else [], 1):  # rounds in the listed order, each racing the last
        race = tune.race_steps(tune.trial_table(metrics))
        batch = [replace(s, race=race.get((s.key.arch, s.key.task))) for s in specs if s.lr == lr]
        metrics += run_training("tune", batch, params, args, keep=every, name=f"tune, round {i}: lr {lr:g}")
    trials = tune.trial_table(metrics)
    chosen = tune.choose(trials, params.tune.lrs) if specs else None
    if specs:
        write_text(args.report / "trials.csv", trials.to_csv(index=False))
    write_text(args.report / "tuning.md", tune.markdown(trials, chosen, params))
    for folder in (args.out, args.ckpt):  # the DVC output and the checkpoints' folder, even with no trials
        folder.mkdir(parents=True, exist_ok=True)
    write_json(args.choice, tune.choice_record(params, chosen))
    print(f"tune: {len(specs)} trials; chosen learning rates in {args.choice}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
