"""What a profile's ``dvc repro`` should take on this machine, before anything runs.

    python -m bench.estimate [--params profiles/quick.yaml ...] [--timing reports/repro_timing.json] [--vit-ms 10.9]
    python -m bench.estimate --all     # params.yaml and every profile (profiles/*.yaml), one ViT measurement for all

Prices every run the profile's grid lists (tune trials, teachers, train runs: ``pipeline.grid``) with the committed
study's measured figures per ``<arch>/<task>`` cell (``repro_timing.json``'s ``training.cells``, written by
``bench.repro_breakdown``): ms per optimizer step, seconds outside the steps, and how its runs stopped under the
criterion (the share that ran to the cap, and the step where the others stopped: :func:`expected_steps`). A
cell the study lacks takes its architecture's mean, then the study's. Everything is scaled by
this machine's ViT step time over the study machine's (``--vit-ms``, else measured here: 300 steps of ``bench
phases``), and a profile of other images, models or batch by its FLOPs per step over the study's (its FLOPs move
with the tokens, but a CPU's rate per FLOP does not stay put: on the natural slice a swin_local run took 1.7x its
price). Training stages: the runs' worker-seconds over the workers, times the study's own ratio of training worker
time to run time (process start, the pool, idle workers at the end); the other stages: the study's times, scaled
(the second look, ``train_more``, at the study's own time: how many rows it continues is decided by the first look's
results). Prints one row per stage, the expected total and an upper bound with every run at its cap. It is an
estimate from another profile's runs: a profile whose cells learn faster or slower than the study's moves it. A
profile for an accelerator is left to ``bench.gpu_estimate``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pandas as pd

from pipeline import profiles
from pipeline.config import load_params
from pipeline.errors import ConfigError
from pipeline.grid import Folders, teacher_specs, train_specs, tune_specs
from pipeline.report import stats

MEASURE_STEPS = 300


def cell_figures(cells: dict[str, dict], arch: str, task: str) -> dict:
    """The study's figures for (arch, task), else its arch's mean over tasks, else the mean over every cell."""
    if f"{arch}/{task}" in cells:
        return cells[f"{arch}/{task}"]
    same = [v for k, v in cells.items() if k.split("/")[0] == arch] or list(cells.values())
    out = {k: sum(v[k] for v in same) / len(same) for k in ("ms_per_step", "other_s", "cap_share")}
    if all("at_cap" in v for v in same):
        early = [v["early_steps"] for v in same if v.get("early_steps") is not None]
        out |= {"at_cap": sum(v["at_cap"] for v in same) / len(same),
                "early_steps": sum(early) / len(early) if early else None}
    return out


def expected_steps(f: dict, steps: int, budget_mode: str) -> float:
    """A run's expected optimizer steps under ``steps`` (the cap, for the criterion): its cell's capped share runs
    to the cap and the rest stop where the study's early stops did (at most the cap); a study without those
    figures scales its mean share of the cap instead, which moves every stop with the cap."""
    if budget_mode != "criterion":
        return float(steps)
    if "at_cap" not in f:
        return steps * f["cap_share"]
    early = min(f["early_steps"], steps) if f.get("early_steps") is not None else steps
    return f["at_cap"] * steps + (1 - f["at_cap"]) * early


def flops_scale(params, study) -> dict[str, float]:
    """Per model: the profile's forward FLOPs per optimizer step over the study's, where the profile's images,
    models or batch differ from the study's ({} where they match: the study's step times hold as measured)."""
    same = (params.geometry, params.models, params.train.recipe.batch_size)
    if same == (study.geometry, study.models, study.train.recipe.batch_size):
        return {}
    models = sorted({s.model for s in train_specs(params, Folders(*[Path(".")] * 5))})
    mine, theirs = forward_flops(params, models), forward_flops(study, models)
    return {m: mine[m] * params.train.recipe.batch_size / (theirs[m] * study.train.recipe.batch_size)
            for m in models}


def forward_flops(params, models) -> dict[str, int]:
    """Analytic forward FLOPs per image of each model at the width its runs solve to (``pipeline.budget``'s
    family formulas: no model is built or traced)."""
    from pipeline.budget import analytic_forward_flops
    from pipeline.models import solve_width

    key = (params.model_dump_json(), tuple(models))  # solving widths builds models: seconds per call
    if key not in _FLOPS:
        k = params.models.reference_classes
        _FLOPS[key] = {m: analytic_forward_flops(m, params, solve_width(m, params, k), k) for m in models}
    return dict(_FLOPS[key])


_FLOPS: dict[tuple[str, tuple[str, ...]], dict[str, int]] = {}


def run_table(params, cells: dict[str, dict], scale: dict[str, float] | None = None,
              tune_cells: dict[str, dict] | None = None) -> pd.DataFrame:
    """One row per run of the profile with its expected and capped seconds on the study's machine (each step's
    time times ``scale`` of its model: see :func:`flops_scale`). Tune trials are priced from the study's trials
    (``tune_cells``: they stop by the race as well) where it has them, else like the other runs."""
    at = Folders(*[Path(".")] * 5)
    rows = []
    for stage, specs in (("tune", tune_specs(params, at)), ("teacher", teacher_specs(params, at)),
                         ("train", train_specs(params, at))):
        for s in specs:
            f = cell_figures(tune_cells if stage == "tune" and tune_cells else cells, s.key.arch, s.key.task)
            step_s = f["ms_per_step"] / 1e3 * (scale or {}).get(s.model, 1.0)
            rows.append({"stage": stage, "arch": s.key.arch, "task": s.key.task,
                         "expected_s": expected_steps(f, s.key.steps, s.key.budget_mode) * step_s + f["other_s"],
                         "cap_s": s.key.steps * step_s + f["other_s"]})
    return pd.DataFrame(rows)


def estimate(params, timing: dict, factor: float, study=None) -> pd.DataFrame:
    """Per stage: runs, expected and capped wall seconds on a machine ``factor`` times the study's step time
    (``study``: the study's params, which scale a profile of other images or models by FLOPs per step)."""
    t = timing["training"]
    workers = params.train.runtime.workers
    overhead = t["worker_s"] / t["run_s"]  # the study's training worker time per second inside its runs
    runs = run_table(params, t["cells"], flops_scale(params, study) if study is not None else None,
                     t.get("tune_cells"))
    table = runs.groupby("stage").agg(runs=("arch", "size"), expected_s=("expected_s", "sum"),
                                      cap_s=("cap_s", "sum"))
    table[["expected_s", "cap_s"]] *= factor * overhead / workers
    names = set(params.tasks.names)
    # the second look (train_more) is data-dependent: priced at the study's own, and left out without one
    skip = {"total", "tune", "train", "teacher"} | (set() if stats.second_look(params) else {"train_more"})
    fixed = {stage: s * factor for stage, s in timing.items() if isinstance(s, int | float)
             and stage not in skip and ("@" not in stage or stage.split("@")[1] in names)}
    other = pd.DataFrame({"runs": 0, "expected_s": pd.Series(fixed), "cap_s": pd.Series(fixed)})
    return pd.concat([other, table])


def this_machine_vit_ms() -> tuple[float, float]:
    """The fastest and slowest of two measurements of this machine's ms per ViT step (a busy machine moves them
    apart: the estimate is then a range, and a warning says why)."""
    from bench import overheads

    seconds = overheads.breakdown("vit", MEASURE_STEPS, repeat=2, time_imports=False)["steps_s"]
    return min(seconds) / MEASURE_STEPS * 1e3, max(seconds) / MEASURE_STEPS * 1e3


def load_warning() -> str | None:
    """A line when other work competes for the cores now (1-minute load average above the core count)."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores:
        return (f"warning: load average {load:.1f} on {cores} cores: other work is running, so this machine's step "
                "time and every figure below are inflated; measure again on an idle machine")
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=Path, nargs="+", default=[Path("params.yaml")])
    ap.add_argument("--all", action="store_true", help="params.yaml and every profile (profiles/*.yaml)")
    ap.add_argument("--timing", type=Path, default=Path("reports/repro_timing.json"))
    ap.add_argument("--vit-ms", type=float, help="this machine's ms per ViT step (default: measured now)")
    ap.add_argument("--study-params", type=Path, default=Path("params.yaml"),
                    help="the params of the study --timing measured (a profile of other images or models is "
                         "scaled from it by FLOPs per step)")
    args = ap.parse_args(argv)
    timing = json.loads(args.timing.read_text())
    if "cells" not in timing.get("training", {}) or "machine_steps_s" not in timing:
        raise SystemExit(f"error: {args.timing}: no training.cells or machine_steps_s; rerun "
                         "`python -m bench.repro_breakdown --phases` on a full repro")
    ref = timing["machine_steps_s"]
    study_ms = ref["s"]["vit"] / ref["steps"] * 1e3
    if args.vit_ms is None and (warning := load_warning()):
        print(warning)
    lo_ms, here_ms = (args.vit_ms, args.vit_ms) if args.vit_ms else this_machine_vit_ms()
    paths = [Path("params.yaml"), *sorted(Path(profiles.DIR).glob("*.yaml"))] if args.all else args.params
    summary = []
    try:
        study = load_params(args.study_params)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    for path in paths:
        try:
            params = profiles.load(path)  # an overlay is composed onto params.yaml
        except ConfigError as err:  # one line naming the file and key, as the stages say it
            raise SystemExit(f"error: {err}") from None
        if params.train.runtime.accelerator != "cpu":  # CPU step times say nothing about an accelerator
            print(f"{path}: for an accelerator (train.runtime.accelerator {params.train.runtime.accelerator}); "
                  f"python -m bench.gpu_estimate --params {path}")
            continue
        table = estimate(params, timing, here_ms / study_ms, study)
        total, cap = round(table.expected_s.sum() / 60), round(table.cap_s.sum() / 60)
        low = round(table.expected_s.sum() / 60 * lo_ms / here_ms)  # the fastest measurement's pricing
        span = f"{low}-{total} min" if low < total else f"{total} min ({total // 60}:{total % 60:02d})"
        step = f"{lo_ms:.2f}-{here_ms:.2f} ms" if lo_ms < here_ms else f"{here_ms:.2f} ms"
        print(f"{path}: expected dvc repro {span}, at most {cap} min with every run at its cap; this machine's ViT "
              f"step {step}, the study's {study_ms:.2f} ms ({args.timing})")
        print((table[["runs", "expected_s", "cap_s"]] / [1, 60, 60]).rename(
            columns={"expected_s": "expected_min", "cap_s": "cap_min"}).to_markdown(floatfmt=".1f"))
        summary.append({"profile": str(path), "runs": int(table.runs.sum()), "expected_min": total, "cap_min": cap})
    if len(summary) > 1:
        print(f"\nEvery profile at {here_ms:.2f} ms per ViT step:")
        print(pd.DataFrame(summary).to_markdown(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
