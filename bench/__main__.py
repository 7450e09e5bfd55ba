"""Benchmarks: ``python -m bench [--small] [--repo PATH] [--out reports/performance.md]``.

``python -m bench phases [--arch vit] [--steps 200] [--repeat 2]``: where one run's wall time goes
(bench/overheads.py), printed as JSON.

Prints and writes (Markdown) what the pipeline costs on this machine, each figure beside its goal:

1. training step time through Lightning (``pipeline.learner.trainer``) vs a
   plain PyTorch loop on the same model, optimizer, schedule and batches, step by step in alternation
   (goal: total-time ratio <= 1.10, with a bootstrap interval), an A/A control and Lightning's loop cost on a
   linear model;
2. achieved training FLOP/s (pipeline.budget counts) vs this machine's measured fp32 matmul rate;
3. data generation images/s (bench/data_speed.py);
4. a no-op ``dvc repro`` (goal <= 3 s) and whether a report-only param edit retrains nothing, in ``--repo``
   (a repository where ``dvc repro`` already ran) or, without it in full mode, a tiny copy reproduced first;
5. where one run's wall time goes, by phase, per arch (bench/overheads.py: imports, data, model, training
   steps, validation, checkpoints, loop, evaluation, MLflow) and the training steps' share;
6. wall time of the full default repro by stage, read from ``reports/repro_timing.json``
   (expected format: ``{"<stage name as dvc prints it>": seconds, ...}``, written by whoever runs the repro).

``--small`` (CI): a few steps and images, seconds; without ``--repo`` it skips the DVC figures.
Everything runs on one torch thread, as every training process of the pipeline does.

This module only parses arguments and runs the measurements in order: bench/measure.py (1-2), bench/dvc_figures.py
(4), bench/overheads.py (5) and the others measure; bench/compare.py compares the quick profile with the default;
bench/render.py writes the Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import pandas as pd
import yaml

from bench import data_speed, overheads, startup, tiny, worker_env
from bench.compare import QUICK
from bench.dvc_figures import dvc_figures
from bench.measure import aa_control, loop_floor, matmul_flops_per_s, training_step
from bench.render import (
    interval_text,
    render,
    render_changes,
    render_phases,
    render_quick,
    render_startup,
    render_worker_env,
)
from pipeline import executor
from pipeline.config import Params
from pipeline.io import write_text
from pipeline.learner import quiet_lightning, training_threads


def main(argv: list[str] | None = None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    if argv[:1] == ["phases"]:
        return overheads.main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CI mode: seconds, not minutes")
    ap.add_argument("--repo", type=Path, help="an already reproduced repository for the DVC figures")
    ap.add_argument("--out", type=Path, default=tiny.ROOT / "reports/performance.md")
    ap.add_argument("--archs", nargs="+", default=["vit", "swin", "resnet"])
    args = ap.parse_args(argv)
    quiet_lightning()
    executor.cheap_cuda_check()  # as every run does (pipeline.executor._call)
    warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")  # validation is not part of a step
    training_threads(1)  # as every run does
    params = Params.model_validate(yaml.safe_load((tiny.ROOT / "params.yaml").read_text()))
    small = args.small
    fits, steps, skip = (1, 8, 3) if small else (5, 200, 20)
    data_n = 1000 if small else 20_000

    results = []
    for arch in args.archs:
        results.append(training_step(arch, params, steps, skip, fits))
        r = results[-1]
        print(f"{arch}: Lightning {r.lightning_s * 1e3:.2f} ms/step, plain {r.plain_s * 1e3:.2f} ms/step, "
              f"ratio {r.ratio:.3f} ({interval_text(r)})", flush=True)
    floor = loop_floor(params, steps, skip, fits)
    aa = aa_control(args.archs[0], params, steps, skip, fits)
    print(f"Lightning's loop on a linear model: {(floor.lightning_s - floor.plain_s) * 1e3:.2f} ms/step extra; "
          f"A/A control {aa.ratio:.3f} ({interval_text(aa)})", flush=True)
    matmul = matmul_flops_per_s(repeats=5 if small else 20)
    print(f"fp32 matmul: {matmul / 1e9:.1f} GFLOP/s (1 thread)")
    repeats_data = 1 if small else 3
    data = {t: data_speed.throughput(t, data_n, params.geometry, repeats_data, params) for t in data_speed.SYNTHETIC}
    print("data images/s: " + ", ".join(f"{t} {v:,.0f}" for t, v in data.items()))

    dvc = None if args.repo is None and small else measure_dvc(args.repo)
    timing_path = tiny.ROOT / "reports/repro_timing.json"
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else None

    phases = []
    for arch in args.archs[:1] if small else args.archs:  # small (CI): one arch keeps the test short
        phases.append(overheads.breakdown(arch, 20 if small else params.train.recipe.steps, repeat=1))
        print(f"{arch}: steps {phases[-1]['step_share']:.1%} of a run's wall time", flush=True)
    # fresh processes (with Dask clusters): not in CI's small mode
    workers = [] if small else worker_env.measure(args.archs, 200)
    starts, exits, gcs = ([], [], []) if small else (startup.measure(5), startup.measure_exit(5),
                                                      startup.measure_imports(5))
    cuda = {} if small else worker_env.cuda_check()
    text = render(results, floor, aa, (fits, steps, skip), matmul, data, data_n, dvc, timing,
                  "small" if small else "full", params)
    sections = (render_phases(phases) + render_quick(*committed_quick(timing)) + render_worker_env(workers)
                + render_startup(starts, exits, gcs) + render_changes(workers, starts, exits, gcs, cuda, phases))
    write_text(args.out, text + "\n".join(sections) + "\n")
    print(f"-> {args.out}")
    return 0


def measure_dvc(repo: Path | None) -> dict:
    """Section 4 in ``repo`` (already reproduced) or, without one, in a tiny copy reproduced first."""
    where = "tiny copy" if repo is None else str(repo)
    if repo is None:
        repo = tiny.make_repo(Path(tempfile.mkdtemp(prefix="bench-")) / "repo")
        print(f"reproducing a tiny copy in {repo} ...", flush=True)
        tiny.dvc(repo, "repro", timeout=1800)
    dvc = {"repo": where, **dvc_figures(repo)}
    print(f"dvc: {dvc}")
    return dvc


def committed_quick(timing: dict | None) -> tuple:
    """What :func:`bench.render.render_quick` compares, read from the committed reports (None where absent)."""
    quick_path, root = tiny.ROOT / QUICK, tiny.ROOT / "reports"
    quick = json.loads(quick_path.read_text()) if quick_path.exists() else None
    summaries = [json.loads(p.read_text()) if p.exists() else None
                 for p in (root / "quick/summary.json", root / "summary.json")]
    csvs = (root / "tables/ledger.csv", root / "quick/ledger.csv")
    ledgers = tuple(pd.read_csv(p) for p in csvs) if all(p.exists() for p in csvs) else None
    return quick, timing, *summaries, ledgers


if __name__ == "__main__":
    raise SystemExit(main())
