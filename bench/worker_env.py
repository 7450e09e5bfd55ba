"""A training step in this process vs inside a Dask worker, with and without Dask's malloc setting.

``python -m bench.worker_env [--archs vit swin resnet] [--steps 200]`` prints JSON. The pipeline's runs execute
in Dask worker processes (:mod:`pipeline.executor`). Dask's nanny starts each worker with
``MALLOC_TRIM_THRESHOLD_=65536``; that also switches off glibc's dynamic mmap threshold, so every activation
buffer above 128 KiB is mmapped and page-faulted afresh at every step. The executor unsets it for its local
cluster. This benchmark measures the three settings on the same plain AdamW step (two workers stepping at once,
as the pipeline runs them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

from pipeline import executor

SETTINGS = ("this process", "dask worker, dask default env", "dask worker, pipeline executor")


def step_ms(arch: str, steps: int, skip: int = 20) -> float:
    """ms per AdamW step of ``arch`` (params.yaml model, 4 classes) on one fixed batch, one torch thread."""
    import torch

    from pipeline.config import load_params
    from pipeline.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    params = load_params(Path(executor.__file__).parents[1] / "params.yaml")
    model = build_model(arch, params, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    size = params.geometry.image_size
    batch = params.train.recipe.batch_size
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 4, (batch,))
    for i in range(skip + steps):
        if i == skip:
            start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - start) / steps * 1e3


def opt_step_ms(nvml_check: bool, steps: int = 500, arch: str = "vit") -> float:
    """ms per fused AdamW ``step()`` (gradients in place) with ``PYTORCH_NVML_BASED_CUDA_CHECK`` as Lightning's
    import leaves it (``nvml_check``) or as :func:`pipeline.executor.cheap_cuda_check` sets it without a GPU."""
    import torch

    from pipeline.config import load_params
    from pipeline.models import build_model

    with mock.patch.dict(os.environ, {executor.NVML_CHECK: "1" if nvml_check else "0"}):
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = build_model(arch, load_params(Path(executor.__file__).parents[1] / "params.yaml"), 4)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
        opt.step()
        start = time.perf_counter()
        for _ in range(steps):
            opt.step()
        return (time.perf_counter() - start) / steps * 1e3


def cuda_check(repeats: int = 5) -> dict:
    """Best of ``repeats`` :func:`opt_step_ms` both ways; empty where a GPU makes the check cached anyway."""
    import torch

    if torch.cuda.device_count() > 0:
        return {}
    return {"nvml": min(opt_step_ms(True) for _ in range(repeats)),
            "runtime": min(opt_step_ms(False) for _ in range(repeats))}


def on_cluster(arch: str, steps: int, dask_default: bool) -> float:
    """Mean ms/step of two workers stepping ``arch`` at once: on a plain Dask LocalCluster (``dask_default``) or
    on the executor's own local cluster."""
    from distributed import Client, LocalCluster

    if dask_default:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host=executor.LOOPBACK,
                               dashboard_address=None)
        with cluster, Client(cluster) as client:
            times = client.gather([client.submit(step_ms, arch, steps, pure=False) for _ in range(2)])
    else:
        with executor.dask_client(2) as client:
            times = client.gather([client.submit(step_ms, arch, steps, pure=False) for _ in range(2)])
    return sum(times) / len(times)


def measure(archs: list[str], steps: int) -> list[dict]:
    rows = []
    for arch in archs:
        row = {"arch": arch, SETTINGS[0]: step_ms(arch, steps),
               SETTINGS[1]: on_cluster(arch, steps, dask_default=True),
               SETTINGS[2]: on_cluster(arch, steps, dask_default=False)}
        row["speed-up"] = row[SETTINGS[1]] / row[SETTINGS[2]]
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="+", default=["vit", "swin", "resnet"])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args(argv)
    measure(args.archs, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
