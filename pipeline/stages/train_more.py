"""DVC stage ``train_more``: the second look's runs, exactly the cells and seeds ``plan.json`` names.

Each is a main-grid run (``train.size``, the recipe's steps and budget mode, the cell's tuned learning rate,
a student with its verified teacher) at a seed the first look did not train, through the same code as the
``train`` stage; outputs under ``<out>/<arch>/<run folder>`` beside nothing else. An empty plan trains nothing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeline.errors import StageError
from pipeline.grid import RunKey, configured_cells, specs_for
from pipeline.io import read_json
from pipeline.schemas import SEED_PLAN
from pipeline.stages.common import parse_stage, run_folders, run_training, stage_main, training_parser
from pipeline.tune import read_choice


def plan_specs(plan: dict, params, at, lrs: dict) -> list:
    """The RunSpecs of the plan's cells: main-grid keys at the extra seeds, students with their teachers."""
    t, r, students = params.train, params.train.recipe, params.distill.students
    conf, first = configured_cells(params), set(t.seeds)
    specs = []
    for cell in plan["cells"]:
        if cell["task"] not in conf.get(cell["arch"], ()) or first & set(cell["seeds"]):
            raise StageError(f"plan.json: cell {cell['arch']}/{cell['task']} with seeds {cell['seeds']} is not a "
                             "configured cell at new seeds (a plan from other params); rerun the plan stage")
        keys = [RunKey(cell["task"], cell["arch"], s, t.size, r.steps, r.budget_mode) for s in cell["seeds"]]
        student = students.get(cell["arch"])
        specs += specs_for("distill" if student else "train", keys, at, model="deit" if student else None,
                           teacher=student.teacher if student else None, teacher_of=params.distill.teacher_of)
    return [replace(s, lr=lrs.get((s.key.arch, s.key.task))) for s in specs]


@stage_main
def main(argv: list[str] | None = None) -> None:
    parser = training_parser(__doc__)
    parser.add_argument("--tune", type=Path, required=True, help="data/tune/choice.json: each cell's learning rate")
    parser.add_argument("--plan", type=Path, required=True, help="data/plan/plan.json: the plan stage's output")
    args, params = parse_stage(parser, argv)

    specs = plan_specs(read_json(args.plan, SEED_PLAN), params, run_folders(args), read_choice(args.tune, params))
    run_training("train_more", specs, params, args)


if __name__ == "__main__":
    raise SystemExit(main())
