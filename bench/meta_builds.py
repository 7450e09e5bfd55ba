"""What skipping weight init on the meta device saves: every architecture built on the meta device at its solved
width, with its weight init and under :class:`pipeline.meta_device.SkipMetaWrites` (as the width search builds),
on a params file (the default's, unless given).

    python -m bench.meta_builds [--params params.yaml] [--repeat 3]

Prints each way's seconds for one build of every architecture and whether their parameter shapes agree.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from pipeline.archs import ARCHS
from pipeline.config import load_params
from pipeline.meta_device import SkipMetaWrites
from pipeline.models import build_model, solve_width


def build_all(params, widths: dict[str, int], skip: bool) -> tuple[float, list]:
    t0, shapes = time.perf_counter(), []
    with torch.device("meta"), (SkipMetaWrites() if skip else contextlib.nullcontext()):
        for arch, width in widths.items():
            model = build_model(arch, params, params.models.reference_classes, width)
            shapes.append([(n, tuple(p.shape)) for n, p in model.named_parameters()])
    return time.perf_counter() - t0, shapes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    params = load_params(args.params)
    torch.set_num_threads(1)
    widths = {arch: solve_width(arch, params, params.models.reference_classes) for arch in ARCHS}
    plain = [build_all(params, widths, skip=False) for _ in range(args.repeat)]
    skipped = [build_all(params, widths, skip=True) for _ in range(args.repeat)]
    a, b = min(t for t, _ in plain), min(t for t, _ in skipped)
    same = plain[0][1] == skipped[0][1]
    print(f"{args.params}: one meta build of each of {len(widths)} architectures (best of {args.repeat}): "
          f"{a:.2f} s with weight init, {b:.2f} s without ({a / b:.1f}x); parameter shapes "
          f"{'identical' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
