"""What a profile for an accelerator (profiles/natural.yaml) should cost on one GPU, before it has run on one.

    python -m bench.gpu_estimate [--params profiles/natural.yaml] [--tflops 40] [--step-ms 8]

Counts each run's work with the pipeline's own grid and FLOP convention (``pipeline.budget``: training = 3 x forward
per image, the analytic family formulas): training FLOPs = 3 x forward x batch x steps, plus the validations
(forward x ``slice.val_size`` every ``val_every_steps``). On the GPU a run takes the larger of its FLOPs over an
*achieved* throughput (``--tflops``: what models of a few million parameters sustain in bf16, far below the chip's
peak) and its steps times a per-step floor (``--step-ms``: kernel launches and the optimizer bound a small model's
step whatever its FLOPs). Both are assumptions, printed beside the result: no GPU was measured.

After ``fit`` Lightning hands the model back on the CPU, where the evaluations run (the test split, the subgroup
conditions and every resolution of a main-grid run): those FLOPs are priced at this machine's measured CPU rate
(one ViT forward pass, timed here) times ``train.runtime.threads``. Runs share the machine ``train.runtime.workers``
at a time. Prints per stage: runs, training and evaluation PFLOPs, GPU and CPU hours, and the wall-clock estimate.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bench.estimate import forward_flops
from pipeline import profiles
from pipeline.errors import ConfigError
from pipeline.grid import Folders, at_main_budget, teacher_specs, train_specs, tune_specs


def eval_passes(params, spec) -> float:
    """Test-split forward passes of one run after fit, in units of the training-size image: the test split, and on
    a main-grid natural run the subgroup conditions and each resolution (its pixels over the training size's)."""
    if not at_main_budget(spec, params) or spec.key.task != "natural":
        return 1.0
    ev, p, size = params.evaluation, params.geometry.patch_size, params.geometry.image_size
    subgroups = p * p + 1 + (len(ev.subgroups.zoom) - 1)  # every sub-patch shift, the shuffle, the zooms
    resolution = sum((s / size) ** 2 for s in ev.resolution.sizes) if "natural" in ev.resolution.tasks else 0.0
    return subgroups + resolution


def run_table(params) -> pd.DataFrame:
    """One row per run: stage, arch, steps, training FLOPs (with validations) and evaluation FLOPs."""
    r, rt, at = params.train.recipe, params.train.runtime, Folders(*[Path(".")] * 5)
    stages = (("tune", tune_specs(params, at)), ("teacher", teacher_specs(params, at)),
              ("train", train_specs(params, at)))
    fwd = forward_flops(params, sorted({s.model for _, specs in stages for s in specs}))
    rows = []
    for stage, specs in stages:
        for s in specs:
            f, steps = float(fwd[s.model]), s.key.steps
            val = f * params.slice.val_size * (steps // rt.val_every_steps)
            rows.append({"stage": stage, "arch": s.key.arch, "steps": steps,
                         "train_flops": 3 * f * r.batch_size * steps + val,
                         "eval_flops": f * params.slice.test_size * eval_passes(params, s)})
    return pd.DataFrame(rows)


def cpu_flops_per_s(params, images: int = 256) -> float:
    """This machine's forward FLOP/s on one thread: a ViT of the profile on ``images`` images, timed."""
    from pipeline.models import build_model

    torch.set_num_threads(1)
    model = build_model("vit", params, 10).eval()
    fwd = float(forward_flops(params, ["vit"])["vit"])
    size = params.geometry.image_size
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((images, 3, size, size), dtype=np.float32))
    with torch.inference_mode():
        model(x[:8])  # warm-up
        t0 = time.perf_counter()
        model(x)
        return fwd * images / (time.perf_counter() - t0)


def estimate(params, tflops: float, step_ms: float, cpu_rate: float) -> pd.DataFrame:
    """Per stage: runs, PFLOPs, GPU and CPU hours, and wall hours with ``workers`` runs side by side."""
    runs = run_table(params)
    rt = params.train.runtime
    runs["gpu_s"] = np.maximum(runs.train_flops / (tflops * 1e12), runs.steps * step_ms / 1e3)
    runs["cpu_s"] = runs.eval_flops / (cpu_rate * rt.threads)
    table = runs.groupby("stage", sort=False).agg(
        runs=("arch", "size"), train_pflops=("train_flops", "sum"), eval_pflops=("eval_flops", "sum"),
        gpu_h=("gpu_s", "sum"), cpu_h=("cpu_s", "sum"))
    table[["train_pflops", "eval_pflops"]] /= 1e15
    table[["gpu_h", "cpu_h"]] /= 3600
    table["wall_h"] = (table.gpu_h + table.cpu_h) / rt.workers
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=Path, default=Path("profiles/natural.yaml"),
                    help="a profile's overlay (composed onto params.yaml) or a full params file")
    ap.add_argument("--tflops", type=float, default=40.0,
                    help="achieved bf16 TFLOP/s of one run on the GPU (an assumption; default 40)")
    ap.add_argument("--step-ms", type=float, default=8.0,
                    help="the least time one optimizer step takes on the GPU, ms (an assumption; default 8)")
    args = ap.parse_args(argv)
    try:
        params = profiles.load(args.params)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    cpu_rate = cpu_flops_per_s(params)
    table = estimate(params, args.tflops, args.step_ms, cpu_rate)
    total = table.sum(numeric_only=True)
    print(f"{args.params}: about {total.wall_h:.1f} h on one GPU with {params.train.runtime.workers} runs side by side "
          f"({total.gpu_h:.1f} GPU-h of training at {args.tflops:g} TFLOP/s achieved or {args.step_ms:g} ms per step, "
          f"whichever is slower; {total.cpu_h:.1f} CPU-h of evaluation at this machine's {cpu_rate / 1e9:.1f} "
          f"GFLOP/s per thread x {params.train.runtime.threads} threads). Assumed, not measured: no GPU ran it.")
    print(table.to_markdown(floatfmt=".2f"))
    per_run = math.ceil(params.train.recipe.steps * args.step_ms / 1e3)
    print(f"One main-grid run: {params.train.recipe.steps} steps, at least {per_run} s of GPU at the step floor.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
