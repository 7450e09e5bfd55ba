"""Generation throughput per synthetic task: ``python -m bench.data_speed [--size 32] [--n 20000]``.

Times ``generate`` (best of ``--repeats``) at the default task params on one core (numpy is
single-threaded here) and prints images per second. Goal: >= 100,000 32 x 32 images/s per task.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pipeline.config import Geometry, Params, load_params
from pipeline.tasks import TASKS

SYNTHETIC = [name for name in TASKS if name != "natural"]  # CIFAR-10 is read, not generated


def throughput(task: str, n: int, geometry: Geometry, repeats: int, params: Params) -> float:
    """Images per second of one ``generate`` call (best of ``repeats``) at ``params``' task settings."""
    cfg = getattr(params.tasks, task)
    best = float("inf")
    for r in range(repeats):
        start = time.perf_counter()
        TASKS[task].generate(n, r, geometry, cfg)
        best = min(best, time.perf_counter() - start)
    return n / best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=32, help="image size in px (patch size stays 4)")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    geometry = Geometry(image_size=args.size, patch_size=4, channels=3)
    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    print(f"{'task':<12} {'images/s':>12}   ({args.n} images of {args.size}x{args.size}, best of {args.repeats})")
    for task in SYNTHETIC:
        print(f"{task:<12} {throughput(task, args.n, geometry, args.repeats, params):>12,.0f}")


if __name__ == "__main__":
    main()
