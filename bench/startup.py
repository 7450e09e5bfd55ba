"""A training stage's start-up: from a fresh stage process to two workers ready to train, cold vs warm.

``python -m bench.startup [--repeats 3]`` prints JSON. Each measurement is a fresh interpreter doing what a
training stage does before its first step (``pipeline.stages.common.run_training``): start the Dask pool, import
what the stage process imports (the run preparation and MLflow), and hand each worker a first task that needs the
training stack. *cold*: the workers import it when that task arrives (the executor before ``worker_pool``);
*warm*: ``worker_pool`` has them import it from the start, alongside the stage process's own imports. Then the
pool closes, and that is timed too. Apart: a process's exit with and without ``gc.freeze()``, and the CPU its
imports take at Python's own GC thresholds and at the raised ones :mod:`pipeline` sets (a process's, not its runs').
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("cold", "warm")
EXITS = ("plain", "frozen")
GCS = ("python", "raised")  # the collector's thresholds while the stack imports: Python's own, or pipeline's


def first_task(_item: int) -> int:
    """A worker's first run: the training stack, imported here if the warm-up has not done it."""
    from pipeline.executor import _import
    from pipeline.stages.common import WORKER_IMPORTS

    _import(WORKER_IMPORTS)
    return 0


def child(mode: str) -> dict:
    """In a fresh process: seconds from here to both workers ready, and for the pool to close."""
    t0 = time.perf_counter()
    from pipeline.executor import worker_pool
    from pipeline.stages.common import WORKER_IMPORTS

    pool_cm = worker_pool(2, None, WORKER_IMPORTS if mode == "warm" else ())
    pool = pool_cm.__enter__()
    import mlflow  # noqa: F401 - the stage process's own imports

    import pipeline.experiment  # noqa: F401
    import pipeline.tracking  # noqa: F401

    workers = list(pool.scheduler_info()["workers"])
    pool.gather([pool.submit(first_task, i, workers=[w], pure=False) for i, w in enumerate(workers)])
    ready = time.perf_counter() - t0
    t1 = time.perf_counter()
    pool_cm.__exit__(None, None, None)
    return {"mode": mode, "ready_s": ready, "close_s": time.perf_counter() - t1}


def exit_child(mode: str) -> dict:
    """In a fresh process: import the stack and report how long that took; the caller times the whole process."""
    import gc

    t0 = time.perf_counter()
    import lightning  # noqa: F401
    import mlflow  # noqa: F401
    import timm  # noqa: F401
    import torch  # noqa: F401

    if mode == "frozen":
        gc.freeze()
    return {"mode": mode, "imports_s": time.perf_counter() - t0}


def import_child(mode: str) -> dict:
    """In a fresh process: the CPU seconds importing torch, timm, Lightning and MLflow takes at Python's own GC
    thresholds or at those :mod:`pipeline` sets for a process (its runs aside)."""
    import gc

    from pipeline import PYTHON_GC, RAISED_GC

    gc.set_threshold(*(PYTHON_GC if mode == "python" else RAISED_GC))
    t0 = time.process_time()
    import lightning  # noqa: F401
    import mlflow  # noqa: F401
    import timm  # noqa: F401
    import torch  # noqa: F401

    return {"mode": mode, "imports_cpu_s": time.process_time() - t0}


def _medians(flag: str, modes: tuple[str, ...], repeats: int, key) -> list[dict]:
    """Per mode, the median row (by ``key``) of ``repeats`` fresh ``python -m bench.startup <flag> <mode>``
    processes run alternately; each row gains ``process_s``, the process's wall time."""
    runs = {m: [] for m in modes}
    for _ in range(repeats):
        for mode in modes:
            start = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "bench.startup", flag, mode], capture_output=True,
                                 text=True, check=True, cwd=ROOT)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            runs[mode].append({**row, "process_s": time.perf_counter() - start})
    rows = []
    for mode in modes:
        ordered = sorted(runs[mode], key=key)
        rows.append({**ordered[len(ordered) // 2], "repeats": repeats})
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()}), flush=True)
    return rows


def measure(repeats: int) -> list[dict]:
    """Cold vs warm start-up: seconds to both workers ready, and to close the pool (median by readiness)."""
    return _medians("--child", MODES, repeats, key=lambda r: r["ready_s"])


def measure_exit(repeats: int) -> list[dict]:
    """Plain vs frozen exit: the process's wall time minus its imports (median)."""
    rows = _medians("--exit", EXITS, repeats, key=lambda r: r["process_s"] - r["imports_s"])
    return [{**r, "exit_s": r["process_s"] - r["imports_s"]} for r in rows]


def measure_imports(repeats: int) -> list[dict]:
    """Python's vs the raised GC thresholds: CPU seconds to import the stack (median)."""
    return _medians("--imports", GCS, repeats, key=lambda r: r["imports_cpu_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--exit", choices=EXITS, help=argparse.SUPPRESS)
    ap.add_argument("--imports", choices=GCS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)), flush=True)
    elif args.exit:
        print(json.dumps(exit_child(args.exit)), flush=True)
    elif args.imports:
        print(json.dumps(import_child(args.imports)), flush=True)
    else:
        measure(args.repeats)
        measure_exit(args.repeats)
        measure_imports(args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
