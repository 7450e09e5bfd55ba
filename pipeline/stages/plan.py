"""DVC stage ``plan``: the second look's seeds, from the first look's ledger (:mod:`pipeline.report.seeds`).

Reads what the report reads of the train stage's runs (``data/runs``, the teachers, the pools, slices and
floors), judges the ledger on ``train.seeds`` exactly as the report's first look does, and writes
``plan.json``: per paired or floor row whether it continues and why, per cell the extra seeds ``train_more`` trains.
A function of those files and the params alone, so ``dvc repro`` stays deterministic.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.errors import StageError
from pipeline.io import write_json
from pipeline.report import inputs, ledger, seeds, sources
from pipeline.stages.common import parse_stage, stage_main


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    for name in ("runs", "teachers", "tasks", "slices", "shortcuts"):
        ap.add_argument(f"--{name}", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="plan.json")
    return ap


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv)
    records = sources.read_records(params, args.runs, args.teachers)
    if not records:
        raise StageError(f"no metrics.json under {args.runs} or {args.teachers}: nothing to plan from")
    inp = inputs.load(params, records, args.tasks, args.slices, args.shortcuts, args.teachers, {})
    first = ledger.judge(params, inp.runs, inp.items, inp.floors, inp.disagreement, params.seed,
                         transfer_rates=inp.transfer_disagreement)
    plan = seeds.make_plan(first, params, seeds.seed_prices(inp.runs))
    write_json(args.out, plan)
    go = [r for r in plan["rows"] if r["continued"]]
    runs = sum(len(c["seeds"]) for c in plan["cells"])
    budget = "" if plan["budget"] is None else f" of plan.budget {plan['budget']:g}"
    print(f"plan: {len(go)} of {len(plan['rows'])} paired and floor rows continue to a second look "
          f"({runs} more runs over {len(plan['cells'])} cells, {plan['spent_kvit']:.1f}{budget} thousand ViT-step "
          "equivalents)" + "".join(f"\n  {r['id']}: {len(r['seeds'])} seeds, {r['price_kvit']} ({r['why']})"
                                   for r in go), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
