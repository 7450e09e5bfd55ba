"""What skipping weight init on the meta device saves: every architecture's width search, plain and under
:class:`pipeline.meta_device.SkipMetaWrites`, on a params file (the default's, unless given).

    python -m bench.meta_builds [--params params.yaml]

Prints each way's seconds for :func:`pipeline.models.budget_table` (every architecture solved and counted) and
whether the two tables agree.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from pipeline.config import load_params
from pipeline.meta_device import SkipMetaWrites
from pipeline.models import budget_table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    params = load_params(args.params)
    torch.set_num_threads(1)
    tables, seconds = [], []
    for mode in (contextlib.nullcontext, SkipMetaWrites):  # with weight init, then without
        t0 = time.perf_counter()
        with mode():
            tables.append(budget_table(params, params.models.reference_classes))
        seconds.append(time.perf_counter() - t0)
    same = tables[0][["arch", "width", "params"]].equals(tables[1][["arch", "width", "params"]])
    print(f"{args.params}: {len(tables[0])} architectures solved and counted: {seconds[0]:.2f} s with weight init, "
          f"{seconds[1]:.2f} s without ({seconds[0] / seconds[1]:.1f}x); widths and counts "
          f"{'identical' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
