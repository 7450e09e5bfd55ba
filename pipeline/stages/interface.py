"""DVC stage ``interface``: the level-1 exact checks (null space, patchify, permutation, pairs, reachability).

Thin: load params, build the configured architectures, run :func:`pipeline.interface.study.run_all`,
write tables/figures atomically, log to MLflow, and fail (exit 2) if any check did not hold.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pandas as pd
import torch

from pipeline import io
from pipeline.errors import StageError
from pipeline.interface import report, study
from pipeline.interface.checks import summary
from pipeline.models import ARCHS, build_model
from pipeline.stages.common import parse_stage, stage_main
from pipeline.tracking import stage_run

FIGURES = {"nullity": "nullity.png", "permutation": "permutation.png", "pairs": "pairs.png",
           "reachability": "reachability.png"}
REPORT_COPIES = ("reachability.csv", "reachability.json")  # the prediction, beside the report


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="directory for machine-readable results")
    ap.add_argument("--report", required=True, help="directory for interface.md and figures")
    return ap


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv)
    torch.set_num_threads(1)  # after imports (docs/design.md §8); also keeps float sums bit-reproducible
    out, rep = Path(args.out), Path(args.report)

    models = {}
    for arch in ARCHS:
        torch.manual_seed(params.seed)  # initial weights: same params -> same files
        models[arch] = build_model(arch, params, study.HEAD_CLASSES)
    res = study.run_all(params, models)
    key = study.key_numbers(res)
    counts = summary(res.checks)

    io.write_with(out / "checks.csv", lambda p: pd.DataFrame([c.row() for c in res.checks]).to_csv(p, index=False))
    for name, table in res.tables.items():
        io.write_with(out / f"{name}.csv", lambda p, t=table: t.to_csv(p, index=False))
    io.write_json(out / "reachability.json", study.reachability_json(res, params))
    io.write_json(out / "summary.json", {"checks": counts, "key_numbers": key})
    for name in REPORT_COPIES:
        io.write_with(rep / name, lambda p, src=out / name: shutil.copyfile(src, p))

    tables = res.tables
    io.save_figure(report.nullity_figure(tables["nullity"]), rep / FIGURES["nullity"])
    io.save_figure(report.permutation_figure(tables["permutation"], tables["vit_permutation"]),
                   rep / FIGURES["permutation"])
    io.save_figure(report.pairs_figure(tables["pairs"]), rep / FIGURES["pairs"])
    io.save_figure(report.reachability_figure(tables["reachability"]), rep / FIGURES["reachability"])
    io.write_text(rep / "interface.md", report.markdown(tables, res.checks, key, FIGURES))

    logged = {k: v for k, v in params.model_dump().items() if k in ("interface", "geometry", "models")}
    with stage_run(params, "interface", "interface") as run:
        run.log(params=logged, metrics={**{f"checks.{k}": v for k, v in counts.items()}, **key})
        run.artifact(out, folder="data")
        run.artifact(rep, folder="report")

    failed = [c for c in res.checks if not c.held]
    if failed:
        first = failed[0]
        raise StageError(f"{len(failed)} of {len(res.checks)} interface checks failed; first: "
                         f"{first.group}: {first.name}: expected {first.expected}, got {first.actual:g}")


if __name__ == "__main__":
    raise SystemExit(main())
