"""The Markdown of reports/performance.md: each measured figure beside its goal, and how it was measured.

Formatting only: bench/measure.py, bench/dvc_figures.py and the other bench modules measure, bench/compare.py
compares the quick profile with the default, bench/recorded.yaml holds what is quoted rather than measured.
"""

from __future__ import annotations

import pandas as pd

from bench import startup, worker_env
from bench.compare import QUICK, on_reference_machine, stage_seconds, verdict_changes
from bench.measure import BLOCK, StepResult
from bench.recorded import RECORDED_CHANGES, REFERENCE_STEPS
from pipeline.config import Params

LIGHTNING_GOAL, NOOP_GOAL_S, STUDY_GOAL_MIN, STEPS_GOAL = 1.10, 3.0, 30, 0.85
# the stages that train (a report setting must rerun none of them)
TRAINING_STAGES = ("teacher", "tune", "train", "train_more", "finetune")


def _verdict(lo: float, hi: float, goal: float) -> str:
    """Goal met (the whole interval at or below it), missed (wholly above) or undecided."""
    return "yes" if hi <= goal else "no" if lo > goal else "undecided"


def interval_text(r: StepResult) -> str:
    """The ratio's 95% interval as the report and the console print it."""
    iv = r.interval
    return "n/a (too few steps)" if iv is None else f"{iv[0]:.3f}-{iv[1]:.3f}"


def render(steps: list[StepResult], floor: StepResult, aa: StepResult, timing_shape: tuple[int, int, int],
           matmul: float, data: dict[str, float], data_n: int, dvc: dict | None, timing: dict | None, mode: str,
           params: Params) -> str:
    """The page's head and its sections 1-4 and 6 (training step, FLOP/s, data generation, DVC, the default
    repro's stages); the other sections are the ``render_*`` below, appended by ``python -m bench``."""
    lines = [
        "# Performance (level 3: measured on this machine)",
        "",
        f"Written by `python -m bench{' --small' if mode == 'small' else ''}` (bench/__main__.py). Measured, "
        "not counted: wall-clock times on a shared machine vary by tens of percent between runs; a figure is "
        "the best of its repeats unless it says otherwise, on one torch thread (as every training process runs).",
        "",
        *_steps(steps, floor, aa, timing_shape, matmul, params),
        "",
        f"## Data generation ({data_n:,} images of {params.geometry.image_size}x{params.geometry.image_size}, "
        "bench/data_speed.py)",
        "",
        "| task | images/s |",
        "|---|---|",
        *[f"| {task} | {rate:,.0f} |" for task, rate in data.items()],
        "",
        "## DVC",
        "",
        *_dvc(dvc),
        "", "## Full default `dvc repro`, wall time by stage", "",
        *_repro(timing),
    ]
    return "\n".join(lines) + "\n"


def _steps(steps: list[StepResult], floor: StepResult, aa: StepResult, timing_shape: tuple[int, int, int],
           matmul: float, params: Params) -> list[str]:
    """Section 1 and the matmul reference: Lightning's step against a plain loop's, its control and its floor."""
    g, batch = params.geometry, params.train.recipe.batch_size
    fits, n_steps, skip = timing_shape
    lines = [
        "## Training step: Lightning vs a plain PyTorch loop",
        "",
        f"Same model (params.yaml widths, {g.image_size} px), AdamW groups, warmup+cosine schedule, gradient "
        f"clipping and batches (batch {batch}); the Trainer is configured like `pipeline/experiment.py` "
        "(deterministic, no logger, no progress bar) without its checkpoints. Goal: ratio <= "
        f"{LIGHTNING_GOAL:.2f}. Each arch is fitted {fits} times for {n_steps} steps, two copies side by side "
        "from the same initial weights on the same batches: after every Lightning step a callback runs one plain "
        "step, so the two are timed in alternation, milliseconds apart, and a slow spell of a shared machine "
        "slows both alike (a Lightning step is its whole loop from one batch's start to the next's, minus the "
        f"plain step in between; the first {skip} steps of a fit are warm-up). Step times are means; the ratio "
        "is Lightning's total step time over the plain loop's (what the loop costs, not a typical step). Its 95% "
        f"interval is a two-level bootstrap: fits, then blocks of {BLOCK} consecutive steps within them (2000 "
        "replicates), so it carries the variation between fits as well as between steps. The goal is met when "
        "the whole interval is at or below it, missed when the whole interval is above it, and undecided "
        "otherwise.",
        "",
        "| arch | Lightning ms/step | plain ms/step | ratio | 95% interval | goal met | same final weights | "
        "achieved train GFLOP/s | share of matmul peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        achieved = s.train_flops_per_step / s.lightning_s
        iv = s.interval
        verdict = "undecided" if iv is None else _verdict(*iv, LIGHTNING_GOAL)
        lines.append(f"| {s.arch} | {s.lightning_s * 1e3:.2f} | {s.plain_s * 1e3:.2f} | {s.ratio:.3f} | "
                     f"{interval_text(s)} | {verdict} | {'yes' if s.identical else 'NO'} | {achieved / 1e9:.2f} | "
                     f"{achieved / matmul:.1%} |")
    same = all(s.identical for s in steps)
    extra = ", ".join(f"{s.arch} {(s.lightning_s - s.plain_s) * 1e3:.2f} ms of {s.plain_s * 1e3:.2f}" for s in steps)
    return lines + [
        "",
        ("*Same final weights*: in every fit the two copies ended bit-identical, so both sides computed the same "
         "training." if same else "*Same final weights*: NO for some arch: the two sides did not compute the "
         "same training there, and its ratio compares different work."),
        "",
        f"Control (A/A): two plain copies of the {aa.arch} alternating step by step in a plain loop, the same "
        f"fits: ratio {aa.ratio:.3f} ({interval_text(aa)}), where the truth is 1; a harness that favoured one side of "
        "a pair would show here.",
        "",
        f"Lightning's loop alone: on a one-layer linear classifier (next to no compute) a Lightning step takes "
        f"{floor.lightning_s * 1e3:.2f} ms and a plain one {floor.plain_s * 1e3:.2f} ms, "
        f"{(floor.lightning_s - floor.plain_s) * 1e3:.2f} ms more (ratio interval {interval_text(floor)}). "
        "That loop runs Lightning's per-step hooks, the closure around the optimizer step, the scheduler and "
        "clipping calls and `Classifier.training_step`'s finite-loss check; the step feeds `self.log_dict` only "
        f"on the steps a logger writes. The extra per step with the models: {extra}.",
        "",
        f"Matmul reference: fp32 512x512 @ 512x512 on one thread, {matmul / 1e9:.1f} GFLOP/s. Achieved = counted "
        "training FLOPs per step (pipeline.budget: 3 x forward, 2 FLOPs per multiply-add) / Lightning step time.",
    ]


def _dvc(dvc: dict | None) -> list[str]:
    """Section 4: a no-op repro's time, and what an edit of a report setting reruns (bench/dvc_figures.py)."""
    if dvc is None:
        return ["Not measured in this run (small mode without `--repo`)."]
    if "error" in dvc:
        return [f"Not measured: {dvc['error']}."]
    lines = [f"- No-op `dvc repro` in `{dvc['repo']}`: {dvc['noop_s']:.2f} s (goal <= {NOOP_GOAL_S:.0f} s: "
             f"{'met' if dvc['noop_s'] <= NOOP_GOAL_S else 'not met'}); stages run: "
             f"{'some (not a no-op!)' if dvc['noop_ran'] else 'none'}."]
    if dvc["report_key"] is None:
        return lines + ["- Report param edit: not measured (no `report` stage in dvc.lock)."]
    others = [s for s in dvc["changed"] if not s.startswith("report")]
    retrain = [s for s in others if s.split("@")[0] in TRAINING_STAGES]
    return lines + [f"- Report param edit (`{dvc['report_key']}`, the one the fewest other stages read): "
                    f"`dvc status` lists {', '.join(dvc['changed']) or 'nothing'}; other stages changed: "
                    f"{', '.join(others) or 'none'}; training stages changed: {', '.join(retrain) or 'none'} "
                    f"(goal: none)."]


def _repro(timing: dict | None) -> list[str]:
    """Section 6: the default study's repro, stage by stage, from ``reports/repro_timing.json``."""
    if not timing:
        return ["Not measured in this run (no `reports/repro_timing.json`; expected format "
                "`{\"<stage>\": seconds}`)."]
    stages = stage_seconds(timing)
    total = timing.get("total", sum(stages.values()))  # bench.repro_timing's wall total, DVC's own time in
    lines = ["From `reports/repro_timing.json`, written by `python -m bench.repro_breakdown` (a fresh-clone "
             "repro's timestamped console; per-run detail in `repro_breakdown.md`) or `python -m "
             "bench.repro_timing`. A stage lasts until the next one starts. That repro may have run on "
             "another machine than the rest of this page (compare its step times in `repro_breakdown.md` "
             "with the tables here).", "",
             "| stage | seconds |", "|---|---|",
             *[f"| {k} | {v:,.0f} |" for k, v in stages.items()],
             f"| **total (wall)** | {total:,.0f} |", "",
             f"Against the goal of a full default study in {STUDY_GOAL_MIN} min on this 2-core machine: "
             f"{total / 60:.1f} min, {'met' if total <= STUDY_GOAL_MIN * 60 else 'missed'} "
             f"({total / 60 / STUDY_GOAL_MIN:.2f}x the goal)."]
    if t := timing.get("training"):  # bench.repro_breakdown's per-run sums
        lines += ["", f"Training stages: {t['runs']} runs in {t['wall_s'] / 60:.1f} min of wall time. Optimizer "
                  f"steps take {t['steps_share']:.0%} of the training stages' worker time (goal "
                  f">= {STEPS_GOAL:.0%}) and {t['steps_share_of_runs']:.0%} of the runs' own time in their "
                  "workers (data, model, fit, evaluation); the difference is stage start-up, the stage "
                  "process's writing and MLflow while workers wait, and idle workers at the end."]
    return lines


def render_quick(quick: dict | None, default: dict | None, quick_summary: dict | None, summary: dict | None,
                 ledgers: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> list[str]:
    """The 30-minute profile's fresh-clone repro (bench.repro_breakdown --out reports/quick), estimated on the
    default repro's machine (:func:`bench.compare.on_reference_machine`); nothing without one. ``default``: the
    default repro's ``repro_timing.json``."""
    if not quick:
        return []
    total, t = quick["total"], quick.get("training", {})
    stages = stage_seconds(quick)
    lines = ["", "## The 30-minute profile (`params-quick.yaml`), measured", "",
             f"From `{QUICK}`: a fresh clone's `cp params-quick.yaml params.yaml && make repro` (installation "
             "excluded), broken down by `python -m bench.repro_breakdown --phases --out reports/quick` (its per-run "
             "detail and report summary: `reports/quick/`).", "",
             "| stage | seconds |", "|---|---|", *[f"| {k} | {v:,.0f} |" for k, v in stages.items()],
             f"| **total (wall)** | {total:,.0f} |", ""]
    if t:
        lines += [f"Training stages: {t['runs']} runs in {t['wall_s'] / 60:.1f} min; optimizer steps take "
                  f"{t['steps_share']:.0%} of their worker time and {t['steps_share_of_runs']:.0%} of the runs' own "
                  "time.", ""]
    lines.append(f"Measured: **{total / 60:.1f} min** on the machine that ran it.")
    if e := on_reference_machine(quick, default):
        ref = ", ".join(f"{a} {v:.2f} s" for a, v in REFERENCE_STEPS["s"].items())
        lines.append(
            "Estimated (not measured) on the machine of the default repro: that machine's training steps were "
            f"{', '.join(f'{a} {r:.2f}x' for a, r in e.step_ratios.items())} faster (`python -m bench phases`, "
            f"{REFERENCE_STEPS['steps']} steps, on the machine that ran this profile right after it, against {ref} "
            f"quoted from performance.md at {REFERENCE_STEPS['commit']}), and the stages both profiles share "
            f"({', '.join(e.shared)}) ran {e.other_ratio:.2f}x faster there. Training "
            f"stages scaled by the step ratios, the rest by the shared stages': **about {e.mid:.0f} min** "
            f"({e.lo:.1f}-{e.hi:.1f} over the per-arch ratios), against the goal of {STUDY_GOAL_MIN} min: "
            f"{'within it, as an estimate' if e.hi <= STUDY_GOAL_MIN else 'not shown to fit'}.")
    else:
        lines.append("Not scaled to another machine (no `machine_steps_s` in its timing, or no default timing).")
    if quick_summary and summary:
        def counts(s: dict) -> str:
            return ", ".join(f"{k} {v}" for k, v in s.get("ledger", {}).items())

        lines += ["", f"What it decides: ledger verdicts at this profile: {counts(quick_summary)}; at the default "
                  f"(`reports/summary.json`): {counts(summary)}. Fewer seeds and no extra axes leave more "
                  "contrasts inconclusive or not run; the default study is the one that decides (a verdict this "
                  "profile reaches that the default leaves undecided is not confirmed by it)."]
    if ledgers is not None:
        lines += ["", *verdict_changes(*ledgers)]
    return lines




PHASES = ("imports", "data", "model", "fit/steps", "fit/validation", "fit/checkpoint", "fit/loop", "fit/setup",
          "evaluation", "mlflow")


def render_phases(rows: list[dict]) -> list[str]:
    """The per-run phase table (seconds) and each run's training-step share of its wall time."""
    head = " | ".join(p.removeprefix("fit/") for p in PHASES)
    lines = ["", "## Where one run's wall time goes", "",
             "One run per arch at the params.yaml model and recipe, on random data of the task shape, through the "
             "pipeline's own DataModule/Classifier/callbacks and the Trainer settings of `pipeline/experiment.py` (no "
             "logger); `mlflow` is what the stage process writes for a run (params, final metrics, an artifact) on a "
             "fresh sqlite store (`python -m bench phases`; `pipeline.learner.PhaseTimer` splits the fit). "
             "`imports` is a fresh interpreter's (paid once per worker process, not per run); "
             f"`mlflow store` (table creation) once per repository. Goal: steps >= {STEPS_GOAL:.0%} of a run's wall "
             "time.", "",
             f"| arch | run steps | {head} | total | steps share | steps share without imports | "
             "mlflow store |", "|" + "---|" * (len(PHASES) + 6)]
    for r in rows:
        ph = r["phases"]
        no_imports = ph["fit/steps"] / (r["total_s"] - ph["imports"])
        lines.append(f"| {r['arch']} | {r['steps']} | " + " | ".join(f"{ph[p]:.2f}" for p in PHASES)
                     + f" | {r['total_s']:.1f} | {r['step_share']:.1%} | {no_imports:.1%} | "
                     f"{r['mlflow_store_s']:.1f} |")
    return lines


def render_worker_env(rows: list[dict]) -> list[str]:
    """The executor's worker environment: a plain AdamW step here vs in Dask workers (bench/worker_env.py);
    nothing in small mode."""
    if not rows:
        return []
    lines = ["", "## A training step inside the executor's workers", "",
             "Plain AdamW steps of the params.yaml model (ms/step), two workers stepping at once. Dask's nanny starts "
             "workers with `MALLOC_TRIM_THRESHOLD_=65536`, which also switches off glibc's dynamic mmap threshold: "
             "activation buffers are mmapped and faulted in afresh at every step. `pipeline/executor.py` unsets it "
             "for its local cluster (on a cluster you start yourself, set "
             "`distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_: null` in the workers' Dask config; "
             "any value, even a large one, keeps the mmap threshold fixed).",
             "", "| arch | " + " | ".join(worker_env.SETTINGS) + " | speed-up |", "|---" * 5 + "|"]
    for r in rows:
        lines.append(f"| {r['arch']} | " + " | ".join(f"{r[k]:.2f}" for k in worker_env.SETTINGS)
                     + f" | {r['speed-up']:.2f}x |")
    return lines


def render_startup(rows: list[dict], exit_rows: list[dict], gc_rows: list[dict]) -> list[str]:
    """A training stage's start-up, cold vs warm workers (bench/startup.py); nothing in small mode."""
    if not rows:
        return []
    by = {r["mode"]: r for r in rows}
    lines = ["", "## A training stage's start-up", "",
             "From a fresh stage process to two workers ready to train (median of "
             f"{rows[0]['repeats']} fresh processes per mode, `python -m bench.startup`): the process starts the "
             "Dask pool, imports what the stage process imports (run preparation, MLflow) and gives each worker a "
             "first task that needs the training stack. *cold*: workers import it when that task arrives (the "
             "executor before `worker_pool`); *warm*: `worker_pool` has them import it from the start, alongside "
             "the stage process. Closing the pool is timed apart: workers that have imported torch and Lightning "
             "take seconds to tear their modules down.", "",
             "| mode | ready (s) | pool close (s) | whole process (s) |", "|---|---|---|---|"]
    for mode in startup.MODES:
        r = by[mode]
        lines.append(f"| {mode} | {r['ready_s']:.2f} | {r['close_s']:.2f} | {r['process_s']:.2f} |")
    lines.append(f"\nWarm workers save {by['cold']['ready_s'] - by['warm']['ready_s']:.2f} s per training stage.")
    exits = {r["mode"]: r["exit_s"] for r in exit_rows}
    lines += ["", "A process's exit after importing torch, timm, Lightning and MLflow (median of "
              f"{exit_rows[0]['repeats']}; wall time minus imports): {exits['plain']:.2f} s as is, "
              f"{exits['frozen']:.2f} s after `gc.freeze()`, which every stage run as a program does at its end "
              "(`pipeline/stages/common.py`) and every Dask worker at its close (`pipeline/executor.py`): the "
              "interpreter's last collections then skip the objects those libraries made."]
    gcs = {r["mode"]: r["imports_cpu_s"] for r in gc_rows}
    lines += ["", f"Importing that stack takes {gcs['python']:.2f} s of CPU at Python's own GC thresholds and "
              f"{gcs['raised']:.2f} s at those `pipeline/__init__.py` sets for every process (median of "
              f"{gc_rows[0]['repeats']}); a run sets Python's own back before it trains (`pipeline/executor.py`)."]
    return lines


def render_changes(workers: list[dict], starts: list[dict], exits: list[dict], gc_rows: list[dict], cuda: dict,
                   phases: list[dict]) -> list[str]:
    """One table: each kept speed change and what it bought (this run's figures first); nothing in small mode."""
    if not workers or not starts:
        return []
    by = {r["mode"]: r for r in starts}
    ex = {r["mode"]: r["exit_s"] for r in exits}
    gcs = {r["mode"]: r["imports_cpu_s"] for r in gc_rows}
    default, ours = (sum(r[k] for r in workers) / len(workers) for k in worker_env.SETTINGS[1:])
    vit_ms = next((r["phases"]["fit/steps"] / r["steps"] * 1e3 for r in phases if r["arch"] == "vit"), None)
    share = f"; {(cuda['nvml'] - cuda['runtime']) / vit_ms:.1%} of a ViT training step" if cuda and vit_ms else ""
    rows = [
        ("Dask workers without Dask's `MALLOC_TRIM_THRESHOLD_`", "ms per step in a worker, mean of "
         + ", ".join(r["arch"] for r in workers), f"{default:.2f}", f"{ours:.2f}", f"{default / ours:.2f}x",
         "this run (table above)"),
        ("warm workers: the training stack imported while the stage prepares", "s until both workers are ready",
         f"{by['cold']['ready_s']:.2f}", f"{by['warm']['ready_s']:.2f}",
         f"{by['cold']['ready_s'] / by['warm']['ready_s']:.2f}x", "this run (table above)"),
        ("`gc.freeze()` before a process exits", "s to exit after importing the stack", f"{ex['plain']:.2f}",
         f"{ex['frozen']:.2f}", f"{ex['plain'] / ex['frozen']:.2f}x", "this run (above)"),
        ("GC thresholds raised but for runs (`pipeline/__init__.py`)", "CPU s to import the stack",
         f"{gcs['python']:.2f}", f"{gcs['raised']:.2f}", f"{gcs['python'] / gcs['raised']:.2f}x", "this run (above)"),
        *([("no NVML probe in AdamW's CUDA check without a GPU (`executor.cheap_cuda_check`)",
            "ms per fused AdamW `step()` on the ViT (once per training step)", f"{cuda['nvml']:.2f}",
            f"{cuda['runtime']:.2f}", f"{cuda['nvml'] / cuda['runtime']:.2f}x (of `step()`{share})",
            "this run (`bench.worker_env.cuda_check`)")] if cuda else []),
        *((c["change"], c["measured"], c["before"], c["after"], "", c["source"]) for c in RECORDED_CHANGES),
    ]
    table = pd.DataFrame(rows, columns=["change", "measured", "before", "after", "speed-up", "measured by"])
    return ["", "## What each kept change bought", "",
            "Every change below leaves results bit-identical (tests/test_faults.py, tests/test_executor.py, "
            "tests/test_train.py). The first rows are measured by this run; the others were measured once, where "
            "the last column says, and are quoted, not re-measured.", "",
            table.to_markdown(index=False)]
