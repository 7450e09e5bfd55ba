"""DVC stage ``finetune``: the main grid's runs of ``finetune.tasks`` fine-tuned at ``finetune.size``.

The science is in :mod:`pipeline.finetune`, the page in :mod:`pipeline.report.finetune`.

Outputs: ``<out>/<arch>/<run folder>/metrics.json`` per run (evaluation only and fine-tuned accuracy at the size;
a finished one with the same weights and settings is kept, so an interrupted stage resumes at the next run) and
``<report>/finetune.md`` + ``finetune.csv``. No tasks: nothing trains and the page says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.executor import map_runs
from pipeline.grid import Folders
from pipeline.io import read_json, write_json, write_text
from pipeline.pruning import prune
from pipeline.report import finetune as page
from pipeline.schemas import RUN_METRICS
from pipeline.stages.common import parse_stage, stage_main


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, required=True, help="data/tasks")
    ap.add_argument("--slices", type=Path, required=True, help="data/slices")
    ap.add_argument("--runs", type=Path, required=True, help="data/runs: the trained runs (weights.pt)")
    ap.add_argument("--out", type=Path, required=True, help="data/finetune: one result per run")
    ap.add_argument("--report", type=Path, required=True, help="reports/finetune: the table")
    return ap


def run_jobs(params, args: argparse.Namespace) -> tuple[list, dict]:
    """Every configured job and its result: finished ones read back, the others fine-tuned now."""
    from pipeline import finetune  # torch and timm (the models): only a stage with tasks needs them

    jobs = finetune.jobs(params, Folders(args.data, args.slices, args.runs, args.runs), args.out)
    done = {j.out_dir: rec for j in jobs if (rec := finetune.finished(j)) is not None}
    todo = [j for j in jobs if j.out_dir not in done]
    print(f"finetune: {len(jobs)} runs at {params.finetune.size} px ({len(done)} already done)", flush=True)
    rt = params.train.runtime
    for job, result in map_runs(finetune.fine_tune, todo, workers=rt.workers, threads=rt.threads,
                                describe=lambda j: j.spec.name, scheduler=rt.scheduler,
                                log_dir=args.out / "failed"):
        write_json(job.out_dir / finetune.RESULT, result)
        done[job.out_dir] = result
    return jobs, done


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv)
    if params.finetune.tasks:
        jobs, done = run_jobs(params, args)
    else:
        jobs, done = [], {}
        print("finetune: no finetune.tasks, nothing to fine-tune", flush=True)
    prune(args.out, [j.out_dir for j in jobs])  # results of runs no longer configured
    args.out.mkdir(parents=True, exist_ok=True)
    trained = {j.spec.name: read_json(j.spec.out_dir / "metrics.json", RUN_METRICS)["test_acc"] for j in jobs}
    tab = page.table([done[j.out_dir] for j in jobs], trained, params.report.confidence)
    write_text(args.report / "finetune.csv", tab.to_csv(index=False))
    write_text(args.report / "finetune.md", page.markdown(tab, params))


if __name__ == "__main__":
    raise SystemExit(main())
