"""Benchmarks: ``python -m bench [--small] [--repo PATH] [--out reports/performance.md]``.

``python -m bench phases [--arch vit] [--steps 200] [--repeat 2]``: where one run's wall time goes
(bench/overheads.py), printed as JSON.

Prints and writes (Markdown) what the pipeline costs on this machine, each figure beside its goal:

1. training step time through Lightning (a Trainer configured like ``pipeline.experiment._trainer``) vs a
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
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
import yaml
from torch.utils.data import DataLoader

from bench import data_speed, overheads, startup, tiny, worker_env
from bench.recorded import RECORDED_CHANGES, REFERENCE_STEPS
from pipeline import budget, executor
from pipeline.config import Params
from pipeline.learner import BatchTensors, Classifier, as_batch, quiet_lightning
from pipeline.models import build_model

LIGHTNING_GOAL, NOOP_GOAL_S, STUDY_GOAL_MIN, STEPS_GOAL = 1.10, 3.0, 30, 0.85


# --------------------------------------------------------------------------- 1-2: training step, FLOP/s
def _module(model: torch.nn.Module, params: Params, steps: int) -> Classifier:
    r = params.train.recipe
    return Classifier(model, lr=r.lr, weight_decay=r.weight_decay, warmup_steps=min(r.warmup_steps, steps - 1),
                      total_steps=steps, min_lr_ratio=r.min_lr_ratio, label_smoothing=r.label_smoothing)


class PlainStep:
    """A hand-written training step of a copy of the model: its next batch from its own loader, then the same
    optimizer, schedule, clipping and loss as :class:`~pipeline.learner.Classifier` under the Trainer."""

    def __init__(self, model: torch.nn.Module, loader: DataLoader, params: Params, steps: int):
        self.model, self.recipe, self.batches = model, params.train.recipe, iter(loader)
        conf = _module(model, params, steps).configure_optimizers()
        self.opt, self.sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
        model.train()

    def __call__(self) -> None:
        x, y = next(self.batches)
        self.opt.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(x), y, label_smoothing=self.recipe.label_smoothing).backward()
        if self.recipe.grad_clip:  # over the optimizer's parameters in its groups' order, as Lightning clips
            torch.nn.utils.clip_grad_norm_([q for g in self.opt.param_groups for q in g["params"]],
                                           self.recipe.grad_clip)
        self.opt.step()
        self.sched.step()


class Interleaved(L.Callback):
    """After every Lightning step, one :class:`PlainStep` (the same batch, from its own pass over the loader): the
    two are timed in alternation, milliseconds apart, so a slow spell of a shared machine slows both sides of a
    pair alike.

    Lightning step ``k``: from batch ``k``'s start to batch ``k + 1``'s (its whole loop: data, hooks, closure,
    optimizer), minus the plain step run in between. The first ``skip`` steps are warm-up.
    """

    def __init__(self, plain: PlainStep, skip: int):
        self.plain_step, self.skip = plain, skip
        self.lightning: list[float] = []
        self.plain: list[float] = []
        self._start, self._inside = None, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        now = time.perf_counter()
        if self._start is not None and batch_idx > self.skip:
            self.lightning.append(now - self._start - self._inside)
        self._start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        t = time.perf_counter()
        self.plain_step()
        self._inside = time.perf_counter() - t
        if batch_idx >= self.skip:
            self.plain.append(self._inside)


def interleaved_steps(model: torch.nn.Module, loader: DataLoader, params: Params, steps: int,
                      skip: int) -> tuple[list[float], list[float], bool]:
    """Per-step seconds (Lightning, plain) of two copies of ``model`` trained side by side on the same batches
    (each fetched from its own pass over ``loader``), and whether they end with bit-identical weights (the same
    computation both ways); the Trainer is ``pipeline.experiment._trainer``'s settings minus its checkpoints."""
    rt, r = params.train.runtime, params.train.recipe
    harness = Interleaved(PlainStep(copy.deepcopy(model), loader, params, steps), skip)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, precision=rt.precision, deterministic=True,
                        logger=False, enable_checkpointing=False, callbacks=[harness], limit_val_batches=0,
                        gradient_clip_val=r.grad_clip or None, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    module = _module(copy.deepcopy(model), params, steps)
    trainer.fit(module, train_dataloaders=loader)
    n = len(harness.lightning)  # the last step has no next start
    return harness.lightning, harness.plain[:n], _same_weights(module.model, harness.plain_step.model)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    x, y = a.state_dict(), b.state_dict()
    return all(torch.equal(x[k], y[k]) for k in x)


def plain_pairs(model: torch.nn.Module, loader: DataLoader, params: Params, steps: int,
                skip: int) -> tuple[list[float], list[float], bool]:
    """The A/A control of :func:`interleaved_steps`: two plain copies alternating step by step in a plain loop.
    Their ratio should be 1 within its interval; a harness that favoured the first or the second of a pair would
    show here."""
    a, b = (PlainStep(copy.deepcopy(model), loader, params, steps) for _ in range(2))
    first, second = [], []
    for k in range(steps):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        if k >= skip:
            first.append(t1 - t0)
            second.append(time.perf_counter() - t1)
    return first, second, _same_weights(a.model, b.model)


def matmul_flops_per_s(n: int = 512, repeats: int = 20) -> float:
    """This machine's fp32 matmul rate on one thread: 2 n^3 FLOPs per (n x n) @ (n x n), best of ``repeats``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


# consecutive steps per bootstrap block (neighbours share a machine's slow spells), and the fewest blocks an
# interval is given for
BLOCK, MIN_BLOCKS = 20, 5


@dataclass
class StepResult:
    """Per-step times of one model both ways, in ``fits`` separate fits, paired step by step."""

    arch: str
    fits: list[tuple[list[float], list[float]]]  # per fit: (s per step one way, s per step the other way)
    train_flops_per_step: int
    identical: bool  # in every fit both copies ended with bit-identical weights
    block: int = BLOCK

    @property
    def lightning_s(self) -> float:
        """Mean s per step, the first way (Lightning)."""
        return sum(sum(a) for a, _ in self.fits) / sum(len(a) for a, _ in self.fits)

    @property
    def plain_s(self) -> float:
        return sum(sum(b) for _, b in self.fits) / sum(len(b) for _, b in self.fits)

    @property
    def ratio(self) -> float:
        """Total time the first way over total time the other: what the training loop costs, not a typical step."""
        return self.lightning_s / self.plain_s

    @property
    def interval(self) -> tuple[float, float] | None:
        """95% interval of :attr:`ratio` (:func:`ratio_interval`); None with fewer than MIN_BLOCKS blocks."""
        return ratio_interval(self.fits, self.block)


def ratio_interval(fits: list[tuple[list[float], list[float]]], block: int, level: float = 0.95,
                   replicates: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """Two-level bootstrap of sum(first) / sum(second): fits drawn with replacement, then blocks of ``block``
    consecutive paired steps within each drawn fit (percentile interval, seeded). The blocks keep the
    step-to-step correlation of a machine's slow spells; the fits carry the variation from one fit to the next.
    """
    per_fit = [np.array([(sum(a[i:i + block]), sum(b[i:i + block])) for i in range(0, len(a) - block + 1, block)])
               for a, b in fits]
    per_fit = [f for f in per_fit if len(f)]
    if sum(len(f) for f in per_fit) < MIN_BLOCKS:
        return None
    rng = np.random.default_rng(seed)
    ratios = np.empty(replicates)
    for r in range(replicates):
        total = np.zeros(2)
        for f in rng.integers(0, len(per_fit), len(per_fit)):
            total += per_fit[f][rng.integers(0, len(per_fit[f]), len(per_fit[f]))].sum(axis=0)
        ratios[r] = total[0] / total[1]
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _loader(params: Params, steps: int) -> DataLoader:
    """``steps`` batches in order, fetched as the pipeline's runs fetch them (:class:`BatchTensors`)."""
    batch = params.train.recipe.batch_size
    g = params.geometry
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch, g.channels, g.image_size, g.image_size, generator=gen)
    y = torch.randint(0, 10, (steps * batch,), generator=gen)
    return DataLoader(BatchTensors(x, y), batch_size=batch, collate_fn=as_batch)


def _fits(measure, model: torch.nn.Module, params: Params, steps: int, skip: int,
          fits: int) -> tuple[list, bool]:
    """``measure`` (:func:`interleaved_steps` or :func:`plain_pairs`) ``fits`` times from ``model``'s weights: the
    paired step times of each fit, and whether every fit ended with the same weights both ways."""
    loader = _loader(params, steps)
    runs = [measure(model, loader, params, steps, skip) for _ in range(fits)]
    return [(a, b) for a, b, _ in runs], all(same for *_, same in runs)


def training_step(arch: str, params: Params, steps: int, skip: int, fits: int, block: int = BLOCK) -> StepResult:
    """Lightning and plain step times of ``arch`` (:func:`interleaved_steps`, ``fits`` times) from the same
    initial weights on the same batches."""
    L.seed_everything(0, verbose=False)
    model = build_model(arch, params, 10)
    pairs, identical = _fits(interleaved_steps, model, params, steps, skip, fits)
    per_image = budget.train_flops_per_image(budget.measured_forward_flops(model, params))
    return StepResult(arch, pairs, per_image * params.train.recipe.batch_size, identical, block)


def loop_floor(params: Params, steps: int, skip: int, fits: int, block: int = BLOCK) -> StepResult:
    """Both ways on a one-layer linear classifier, whose own compute is next to nothing: what Lightning's loop
    alone costs per step."""
    g = params.geometry
    L.seed_everything(0, verbose=False)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(g.channels * g.image_size ** 2, 10))
    pairs, identical = _fits(interleaved_steps, model, params, steps, skip, fits)
    return StepResult("linear", pairs, 0, identical, block)


def aa_control(arch: str, params: Params, steps: int, skip: int, fits: int, block: int = BLOCK) -> StepResult:
    """:func:`plain_pairs` on ``arch``: the harness's own bias and noise, where the true ratio is 1."""
    L.seed_everything(0, verbose=False)
    pairs, identical = _fits(plain_pairs, build_model(arch, params, 10), params, steps, skip, fits)
    return StepResult(arch, pairs, 0, identical, block)


# --------------------------------------------------------------------------- 4: DVC
def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def report_only_param(repo: Path) -> str | None:
    """A params key that only report stages declare (None when there is none)."""
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]

    def declared(stage: dict) -> list[str]:
        body = stage.get("do", stage)
        return [p for p in body.get("params", []) if isinstance(p, str)]

    report = [p for name, s in stages.items() if name.startswith("report") for p in declared(s)]
    others = [p for name, s in stages.items() if not name.startswith("report") for p in declared(s)]
    for key in report:
        if not any(key == o or key.startswith(f"{o}.") or o.startswith(f"{key}.") for o in others):
            return key
    return None


def _edited(value):
    """A different value of the same type (what an edit of the key looks like)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_edited"
    if isinstance(value, list):
        return list(reversed(value)) if len(set(map(str, value))) > 1 else value + value[:1]
    if isinstance(value, dict):
        k = next(iter(value))
        return {**value, k: _edited(value[k])}
    return value


def dvc_figures(repo: Path) -> dict:
    """No-op ``dvc repro`` time, and the stages ``dvc status`` reports after a report-only param edit."""
    status = json.loads(tiny.dvc(repo, "status", "--json").stdout or "{}")
    if status:
        return {"error": f"{repo} is not up to date ({', '.join(status)}): run dvc repro there first"}
    noop_s, proc = timed(lambda: tiny.dvc(repo, "repro"))
    out = {"noop_s": noop_s, "noop_ran": "Running stage" in proc.stdout, "report_key": None, "changed": None}
    key = report_only_param(repo)
    if key is not None:
        path = repo / "params.yaml"
        original = path.read_text()
        params = yaml.safe_load(original)
        *parents, last = key.split(".")
        node = params
        for k in parents:
            node = node[k]
        node[last] = _edited(node[last])
        try:
            path.write_text(yaml.safe_dump(params, sort_keys=False))
            out["changed"] = sorted(json.loads(tiny.dvc(repo, "status", "--json").stdout or "{}"))
        finally:
            path.write_text(original)
        out["report_key"] = key
    return out


# --------------------------------------------------------------------------- report
def _verdict(lo: float, hi: float, goal: float) -> str:
    """Goal met (the whole interval at or below it), missed (wholly above) or undecided."""
    return "yes" if hi <= goal else "no" if lo > goal else "undecided"


def _interval(r: StepResult) -> str:
    iv = r.interval
    return "n/a (too few steps)" if iv is None else f"{iv[0]:.3f}-{iv[1]:.3f}"


def render(steps: list[StepResult], floor: StepResult, aa: StepResult, timing_shape: tuple[int, int, int],
           matmul: float, data: dict[str, float], data_n: int, dvc: dict | None, timing: dict | None, mode: str,
           params: Params) -> str:
    g, batch = params.geometry, params.train.recipe.batch_size
    fits, n_steps, skip = timing_shape
    lines = [
        "# Performance (level 3: measured on this machine)",
        "",
        f"Written by `python -m bench{' --small' if mode == 'small' else ''}` (bench/__main__.py). Measured, "
        "not counted: wall-clock times on a shared machine vary by tens of percent between runs; a figure is "
        "the best of its repeats unless it says otherwise, on one torch thread (as every training process runs).",
        "",
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
                     f"{_interval(s)} | {verdict} | {'yes' if s.identical else 'NO'} | {achieved / 1e9:.2f} | "
                     f"{achieved / matmul:.1%} |")
    same = all(s.identical for s in steps)
    extra = ", ".join(f"{s.arch} {(s.lightning_s - s.plain_s) * 1e3:.2f} ms of {s.plain_s * 1e3:.2f}" for s in steps)
    lines += [
        "",
        ("*Same final weights*: in every fit the two copies ended bit-identical, so both sides computed the same "
         "training." if same else "*Same final weights*: NO for some arch: the two sides did not compute the "
         "same training there, and its ratio compares different work."),
        "",
        f"Control (A/A): two plain copies of the {aa.arch} alternating step by step in a plain loop, the same "
        f"fits: ratio {aa.ratio:.3f} ({_interval(aa)}), where the truth is 1; a harness that favoured one side of "
        "a pair would show here.",
        "",
        f"Lightning's loop alone: on a one-layer linear classifier (next to no compute) a Lightning step takes "
        f"{floor.lightning_s * 1e3:.2f} ms and a plain one {floor.plain_s * 1e3:.2f} ms, "
        f"{(floor.lightning_s - floor.plain_s) * 1e3:.2f} ms more (ratio interval {_interval(floor)}). "
        "That loop runs Lightning's per-step hooks, the closure around the optimizer step, the scheduler and "
        "clipping calls and `Classifier.training_step`'s finite-loss check; the step feeds `self.log_dict` only "
        f"on the steps a logger writes. The extra per step with the models: {extra}.",
    ]
    lines += [
        "",
        f"Matmul reference: fp32 512x512 @ 512x512 on one thread, {matmul / 1e9:.1f} GFLOP/s. Achieved = counted "
        "training FLOPs per step (pipeline.budget: 3 x forward, 2 FLOPs per multiply-add) / Lightning step time.",
        "",
        f"## Data generation ({data_n:,} images of {g.image_size}x{g.image_size}, bench/data_speed.py)",
        "",
        "| task | images/s |",
        "|---|---|",
        *[f"| {task} | {rate:,.0f} |" for task, rate in data.items()],
        "",
        "## DVC",
        "",
    ]
    if dvc is None:
        lines.append("Not measured in this run (small mode without `--repo`).")
    elif "error" in dvc:
        lines.append(f"Not measured: {dvc['error']}.")
    else:
        lines.append(f"- No-op `dvc repro` in `{dvc['repo']}`: {dvc['noop_s']:.2f} s (goal <= {NOOP_GOAL_S:.0f} s: "
                     f"{'met' if dvc['noop_s'] <= NOOP_GOAL_S else 'not met'}); stages run: "
                     f"{'some (not a no-op!)' if dvc['noop_ran'] else 'none'}.")
        if dvc["report_key"] is None:
            lines.append("- Report-only param edit: not measured (dvc.yaml has no param that only a `report` "
                         "stage reads).")
        else:
            retrain = [s for s in dvc["changed"] if not s.startswith("report")]
            lines.append(f"- Report-only param edit (`{dvc['report_key']}`): `dvc status` lists "
                         f"{', '.join(dvc['changed']) or 'nothing'}; non-report stages changed: "
                         f"{', '.join(retrain) or 'none'}.")
    lines += ["", "## Full default `dvc repro`, wall time by stage", ""]
    if timing:
        stages = {k: v for k, v in timing.items() if k not in ("total", "training")}
        total = timing.get("total", sum(stages.values()))  # bench.repro_timing's wall total, DVC's own time in
        lines += ["From `reports/repro_timing.json`, written by `python -m bench.repro_breakdown` (a fresh-clone "
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
    else:
        lines.append("Not measured in this run (no `reports/repro_timing.json`; expected format "
                     "`{\"<stage>\": seconds}`).")
    return "\n".join(lines) + "\n"


QUICK = "reports/quick/repro_timing.json"


def machine_ratios(machine: dict | None) -> dict[str, float]:
    """Per arch: a repro machine's training-step time over the reference machine's (``machine``: the
    ``machine_steps_s`` that ``bench.repro_breakdown --phases`` stored beside that repro's timing)."""
    if not machine:
        return {}
    ref, n = REFERENCE_STEPS["s"], REFERENCE_STEPS["steps"]
    return {a: machine["s"][a] / machine["steps"] / (ref[a] / n) for a in ref if a in machine["s"]}


def verdict_changes(default: pd.DataFrame, quick: pd.DataFrame) -> list[str]:
    """How the quick profile's ledger rows compare with the same rows at the default (``ledger.csv`` tables)."""
    both = default.set_index("id")[["verdict"]].join(
        quick.set_index("id")[["verdict"]].rename(columns={"verdict": "verdict_quick"}), how="inner")
    same = both.verdict == both.verdict_quick
    decided = {"held", "failed", "equivalent"}
    lost = both[~same & both.verdict.isin(decided) & ~both.verdict_quick.isin(decided)]
    flipped = both[~same & both.verdict.isin(decided) & both.verdict_quick.isin(decided)]
    gained = both[~same & ~both.verdict.isin(decided) & both.verdict_quick.isin(decided)]
    lines = [f"Of its {len(quick)} ledger rows, {len(both)} are also the default's ({len(default)} rows): "
             f"{int(same.sum())} with the same verdict; {len(lost)} decided at the default and not here "
             f"({', '.join(lost.index) or 'none'}); {len(flipped)} decided both ways with another verdict "
             f"({', '.join(f'{i}: {r.verdict} -> {r.verdict_quick}' for i, r in flipped.iterrows()) or 'none'}); "
             f"{len(gained)} undecided at the default and decided here "
             f"({', '.join(f'{i}: {r.verdict_quick}' for i, r in gained.iterrows()) or 'none'})."]
    return lines


def render_quick(quick: dict | None, default: dict | None, quick_summary: dict | None, summary: dict | None,
                 ledgers: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> list[str]:
    """The 30-minute profile's fresh-clone repro (bench.repro_breakdown --out reports/quick), estimated on the
    default repro's machine; nothing without one. ``default``: the default repro's ``repro_timing.json``."""
    if not quick:
        return []
    total, t = quick["total"], quick.get("training", {})
    stages = {k: v for k, v in quick.items() if k not in ("total", "training", "machine_steps_s")}
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
    ratios = machine_ratios(quick.get("machine_steps_s"))
    # the stages whose work is the same in both profiles (no training, no report): their own time ratio
    common = [k for k in stages if k.split("@")[0] in ("interface", "data", "slice", "shortcuts")
              and default and k in default]
    lines.append(f"Measured: **{total / 60:.1f} min** on the machine that ran it.")
    if ratios and common and t:
        other = total - t["wall_s"]
        other_ratio = sum(stages[k] for k in common) / sum(default[k] for k in common)
        def minutes(step_ratio: float) -> float:
            return (t["wall_s"] / step_ratio + other / other_ratio) / 60

        mid = minutes(sum(ratios.values()) / len(ratios))
        lo, hi = minutes(max(ratios.values())), minutes(min(ratios.values()))
        ref = ", ".join(f"{a} {v:.2f} s" for a, v in REFERENCE_STEPS["s"].items())
        lines.append(
            "Estimated (not measured) on the machine of the default repro: that machine's training steps were "
            f"{', '.join(f'{a} {r:.2f}x' for a, r in ratios.items())} faster (`python -m bench phases`, "
            f"{REFERENCE_STEPS['steps']} steps, on the machine that ran this profile right after it, against {ref} "
            f"quoted from performance.md at {REFERENCE_STEPS['commit']}), and the stages both profiles share "
            f"({', '.join(sorted({k.split('@')[0] for k in common}))}) ran {other_ratio:.2f}x faster there. Training "
            f"stages scaled by the step ratios, the rest by the shared stages': **about {mid:.0f} min** "
            f"({lo:.1f}-{hi:.1f} over the per-arch ratios), against the goal of {STUDY_GOAL_MIN} min: "
            f"{'within it, as an estimate' if hi <= STUDY_GOAL_MIN else 'not shown to fit'}.")
    else:
        lines.append("Not scaled to another machine (no `machine_steps_s` in its timing, or no default timing).")
    if quick_summary and summary:
        def counts(s: dict) -> str:
            return ", ".join(f"{k} {v}" for k, v in s.get("ledger", {}).items())

        lines += ["", f"What it decides: ledger verdicts at this profile: {counts(quick_summary)}; at the default "
                  f"(`reports/summary.json`): {counts(summary)}. Fewer seeds and no extra axes leave more "
                  "contrasts underpowered or not run; the default study is the one that decides (a verdict this "
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


def render_startup(rows: list[dict], exit_rows: list[dict]) -> list[str]:
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
    return lines


def render_changes(workers: list[dict], starts: list[dict], exits: list[dict], cuda: dict,
                   phases: list[dict]) -> list[str]:
    """One table: each kept speed change and what it bought (this run's figures first); nothing in small mode."""
    if not workers or not starts:
        return []
    by = {r["mode"]: r for r in starts}
    ex = {r["mode"]: r["exit_s"] for r in exits}
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
    torch.set_num_threads(1)
    params = Params.model_validate(yaml.safe_load((tiny.ROOT / "params.yaml").read_text()))
    small = args.small
    fits, steps, skip = (1, 8, 3) if small else (5, 200, 20)
    data_n = 1000 if small else 20_000

    results = []
    for arch in args.archs:
        results.append(training_step(arch, params, steps, skip, fits))
        r = results[-1]
        print(f"{arch}: Lightning {r.lightning_s * 1e3:.2f} ms/step, plain {r.plain_s * 1e3:.2f} ms/step, "
              f"ratio {r.ratio:.3f} ({_interval(r)})", flush=True)
    floor = loop_floor(params, steps, skip, fits)
    aa = aa_control(args.archs[0], params, steps, skip, fits)
    print(f"Lightning's loop on a linear model: {(floor.lightning_s - floor.plain_s) * 1e3:.2f} ms/step extra; "
          f"A/A control {aa.ratio:.3f} ({_interval(aa)})", flush=True)
    matmul = matmul_flops_per_s(repeats=5 if small else 20)
    print(f"fp32 matmul: {matmul / 1e9:.1f} GFLOP/s (1 thread)")
    repeats_data = 1 if small else 3
    data = {t: data_speed.throughput(t, data_n, params.geometry, repeats_data, params) for t in data_speed.SYNTHETIC}
    print("data images/s: " + ", ".join(f"{t} {v:,.0f}" for t, v in data.items()))

    dvc = None
    if args.repo is not None or not small:
        repo = args.repo
        if repo is None:
            repo = tiny.make_repo(Path(tempfile.mkdtemp(prefix="bench-")) / "repo")
            print(f"reproducing a tiny copy in {repo} ...", flush=True)
            tiny.dvc(repo, "repro", timeout=1800)
        dvc = {"repo": "tiny copy" if args.repo is None else str(repo), **dvc_figures(repo)}
        print(f"dvc: {dvc}")
    timing_path = tiny.ROOT / "reports/repro_timing.json"
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else None

    from pipeline.io import write_text

    phases = []
    for arch in args.archs[:1] if small else args.archs:  # small (CI): one arch keeps the test short
        phases.append(overheads.breakdown(arch, 20 if small else params.train.recipe.steps, repeat=1))
        print(f"{arch}: steps {phases[-1]['step_share']:.1%} of a run's wall time", flush=True)
    # fresh processes (with Dask clusters): not in CI's small mode
    workers = [] if small else worker_env.measure(args.archs, 200)
    starts, exits = ([], []) if small else (startup.measure(5), startup.measure_exit(5))
    cuda = {} if small else worker_env.cuda_check()
    text = render(results, floor, aa, (fits, steps, skip), matmul, data, data_n, dvc, timing,
                  "small" if small else "full", params)
    quick_path, root = tiny.ROOT / QUICK, tiny.ROOT / "reports"
    quick = json.loads(quick_path.read_text()) if quick_path.exists() else None
    summaries = [json.loads(p.read_text()) if p.exists() else None
                 for p in (root / "quick/summary.json", root / "summary.json")]
    csvs = (root / "tables/ledger.csv", root / "quick/ledger.csv")
    ledgers = tuple(pd.read_csv(p) for p in csvs) if all(p.exists() for p in csvs) else None
    sections = (render_phases(phases) + render_quick(quick, timing, *summaries, ledgers) + render_worker_env(workers)
                + render_startup(starts, exits) + render_changes(workers, starts, exits, cuda, phases))
    write_text(args.out, text + "\n".join(sections) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
