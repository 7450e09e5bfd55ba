"""The accelerator path, checked on a real GPU: the pipeline's own fit + evaluate at ``accelerator: gpu``.

    python -m bench.gpu_check --out <folder> [--archs vit swin resnet] [--steps 1000]

Generates the alignment task and its slices in-process (the data and slice stages' own code), then trains each
architecture twice with the same seed through :func:`pipeline.experiment.fit` (Lightning, ``deterministic=True``)
on ``cuda`` and once on the CPU, and prints: ms per optimizer step, test accuracy, whether the two GPU runs are
bit-identical, and the GPU-vs-CPU accuracy difference. No MLflow and no DVC: the stage process's recording is
not what is checked. Needs a CUDA device; writes ``gpu_check.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import yaml


def _params(steps: int, accelerator: str):
    from pipeline.config import Params

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    raw["tasks"]["names"] = ["alignment"]  # every task list narrowed to it (the schema checks they are generated)
    for entry in [*raw["train"]["archs"].values(), *raw["train"]["grids"].values()]:
        entry["tasks"] = ["alignment"]
    raw["distill"]["tasks"] = ["alignment"]
    raw["evaluation"]["resolution"]["tasks"] = []
    raw["train"]["recipe"]["steps"] = steps
    raw["train"]["runtime"].update(accelerator=accelerator, workers=1, threads=4)
    return Params.model_validate(raw)


def _data(root: Path, params_file: Path) -> None:
    from pipeline.stages import generate, slice

    assert generate.main(["--params", str(params_file), "--task", "alignment",
                          "--out", str(root / "tasks/alignment")]) == 0
    assert slice.main(["--params", str(params_file), "--task", "alignment", "--data", str(root / "tasks/alignment"),
                       "--out", str(root / "slices/alignment")]) == 0


def _fit(arch: str, params, root: Path, tag: str) -> dict:
    from pipeline.experiment import Job, fit, identity
    from pipeline.grid import Folders, specs_for, train_keys

    key = next(k for k in train_keys(params, arch) if k.task == "alignment" and k.seed == 0 and k.data_seed == 0)
    at = Folders(root / "tasks", root / "slices", root / f"runs/{tag}", root / f"ckpt/{tag}")
    spec = specs_for("train", [key], at)[0]
    t0 = time.perf_counter()
    result = fit(Job(spec, params, identity(spec, params), None))
    wall = time.perf_counter() - t0
    steps = result["budget"]["optimizer_steps"]
    return {"acc": result["evaluation"]["slices"]["test"]["acc"], "wall_s": wall,
            "ms_per_step": 1e3 * result["measured"]["phases_s"]["steps"] / steps,
            "state": result["state_dict"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--archs", nargs="+", default=["vit", "swin", "resnet"])
    ap.add_argument("--steps", type=int, default=1000)
    args = ap.parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (torch's requirement)
    import torch

    from pipeline.io import write_text

    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device")
    root = args.out / "work"
    gpu, cpu = _params(args.steps, "gpu"), _params(args.steps, "cpu")
    params_file = write_text(root / "params.yaml", yaml.safe_dump(gpu.model_dump(mode="json"), sort_keys=False))
    _data(root / "data", params_file)
    rows = []
    for arch in args.archs:
        try:
            a = _fit(arch, gpu, root / "data", f"{arch}-gpu-a")
        except RuntimeError as err:  # e.g. an op without a deterministic CUDA kernel
            rows.append({"arch": arch, "gpu_error": str(err).splitlines()[0]})
            print(json.dumps(rows[-1]), flush=True)
            continue
        b = _fit(arch, gpu, root / "data", f"{arch}-gpu-b")
        c = _fit(arch, cpu, root / "data", f"{arch}-cpu")
        same = all(torch.equal(a["state"][k].cpu(), b["state"][k].cpu()) for k in a["state"])
        rows.append({"arch": arch, "gpu_ms_per_step": a["ms_per_step"], "cpu_ms_per_step": c["ms_per_step"],
                     "gpu_acc": a["acc"], "gpu_acc_repeat": b["acc"], "cpu_acc": c["acc"],
                     "gpu_runs_bit_identical": same, "device": torch.cuda.get_device_name(0)})
        print(json.dumps(rows[-1]), flush=True)
    write_text(args.out / "gpu_check.json", json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
