"""Run ``dvc repro`` and record the wall time of every stage it runs.

    python -m bench.repro_timing [--out reports/repro_timing.json] [dvc repro arguments ...]

DVC prints ``Running stage '<name>':`` when a stage starts; a stage lasts until the next one starts (the last
until DVC exits). The output streams through unchanged; the JSON ({stage: seconds, "total": seconds}) is what
``python -m bench`` reads for reports/performance.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from pipeline.io import write_json

STAGE = re.compile(r"Running stage '([^']+)'")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("reports/repro_timing.json"))
    args, dvc_args = ap.parse_known_args(argv)
    start = time.perf_counter()
    timings: dict[str, float] = {}
    current, since = None, start
    proc = subprocess.Popen(["dvc", "repro", *dvc_args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        sys.stdout.write(line)
        if m := STAGE.search(line):
            now = time.perf_counter()
            if current:
                timings[current] = round(now - since, 1)
            current, since = m.group(1), now
    rc = proc.wait()
    end = time.perf_counter()
    if current:
        timings[current] = round(end - since, 1)
    if rc == 0:
        write_json(args.out, {**timings, "total": round(end - start, 1)})
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
