"""DVC stage ``report``: tables, figures, the prediction ledger and ``reports/README.md``.

Thin: read the tracked per-run metrics (:mod:`pipeline.report.sources`), keep the runs params configure, and
hand everything to :func:`pipeline.report.pages.write_report`. Item-level statistics read the task pools
(``--tasks``, labels and factors) and the test slices (``--slices``); shortcut floors come from
``--shortcuts`` (data/shortcuts/<task>/floors.json). Absent inputs give tables that say "not run".
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.errors import StageError
from pipeline.report import ledger, pages, sources
from pipeline.schemas import INTERFACE_SUMMARY
from pipeline.stages.common import parse_stage, stage_main


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    for name in ("runs", "teachers", "interface", "tasks", "slices", "shortcuts"):
        ap.add_argument(f"--{name}", type=Path, default=None)
    ap.add_argument("--out", type=Path, required=True, help="reports directory (README.md, tables/, figures/)")
    return ap


def configured(m: dict, params) -> bool:
    """Is this run part of the grid params.yaml configures now? (Run folders persist across DVC reruns, so a
    task or architecture removed from the params would otherwise linger in the report.)"""
    if m["source"] == "teachers":
        return m["arch"] in dict(params.distill.teachers) and m["task"] in params.distill.tasks
    return m["arch"] in ledger.configured_cells(params)  # the train stage prunes runs its grid no longer has


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv)
    records = [m for m in (sources.read_metrics(args.runs, "runs")
                           + sources.read_metrics(args.teachers, "teachers")) if configured(m, params)]
    if not records:
        raise StageError(f"no metrics.json under {args.runs} or {args.teachers}: nothing to report")
    iface = sources.read_json(args.interface / "summary.json" if args.interface else None,
                             INTERFACE_SUMMARY) or {}
    if iface and iface["checks"]["held"] > iface["checks"]["checked"]:
        raise StageError(f"{args.interface / 'summary.json'}: checks.held {iface['checks']['held']} exceeds "
                         f"checks.checked {iface['checks']['checked']}; rerun the interface stage")
    inputs = pages.load(params, records, args.tasks, args.slices, args.shortcuts, args.teachers, iface)
    pages.write_report(inputs, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
