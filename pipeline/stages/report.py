"""DVC stage ``report``: tables, figures, the prediction ledger and ``reports/README.md``.

Thin: read the tracked per-run metrics (:mod:`pipeline.report.sources`), keep the runs params configure, and
hand everything to :func:`pipeline.report.pages.write_report`; the second look's runs (``--runs-more``) and
its plan (``--plan``) when the ``plan`` stage gave any row more seeds. Item-level statistics read the task pools
(``--tasks``, labels and factors) and the test slices (``--slices``); shortcut floors come from
``--shortcuts`` (data/shortcuts/<task>/floors.json). Absent inputs give tables that say "not run".
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.errors import StageError
from pipeline.report import pages, sources
from pipeline.schemas import INTERFACE_SUMMARY, SEED_PLAN
from pipeline.stages.common import parse_stage, stage_main


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    for name in ("runs", "teachers", "interface", "tasks", "slices", "shortcuts"):
        ap.add_argument(f"--{name}", type=Path, default=None)
    ap.add_argument("--runs-more", type=Path, default=None, help="data/runs_more: the second look's seeds")
    ap.add_argument("--plan", type=Path, default=None, help="data/plan/plan.json: which rows got them")
    ap.add_argument("--out", type=Path, required=True, help="reports directory (README.md, tables/, figures/)")
    return ap


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv)
    records = sources.read_records(params, args.runs, args.teachers, args.runs_more)
    if not records:
        raise StageError(f"no metrics.json under {args.runs} or {args.teachers}: nothing to report")
    iface = sources.read_json(args.interface / "summary.json" if args.interface else None,
                             INTERFACE_SUMMARY) or {}
    if iface and iface["checks"]["held"] > iface["checks"]["checked"]:
        raise StageError(f"{args.interface / 'summary.json'}: checks.held {iface['checks']['held']} exceeds "
                         f"checks.checked {iface['checks']['checked']}; rerun the interface stage")
    inputs = pages.load(params, records, args.tasks, args.slices, args.shortcuts, args.teachers, iface,
                        seed_plan=sources.read_json(args.plan, SEED_PLAN))
    pages.write_report(inputs, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
