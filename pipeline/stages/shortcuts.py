"""Stage ``shortcuts``: one task's shortcut floors (pipeline/shortcuts.py), fitted on ``train_<train.size>``,
scored on ``test`` and each of its slices (regularisation chosen on ``val``).

Reads the task's pool (``<data>``) and its splits (``<slices>/indices.npz``); writes ``<out>/floors.json``
(``task, factor, chance, baselines {name: {acc, n, ci, uses, ignores, uses_factor, beside, slices}}, floor,
floor_baseline, floor_slices, floor_slice_baselines``, and ``beside_floor, beside_baseline, beside_slices``
where a stronger reference is shown beside the floor; slices: every ``slice/...`` of the splits) or
nothing, and a short Markdown table at ``--report``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipeline.config import load_params
from pipeline.errors import ConfigError, StageError
from pipeline.io import checked_arrays, write_json, write_text
from pipeline.shortcuts import OBJECTS, floors
from pipeline.stages.common import stage_main
from pipeline.stages.generate import atomic_dir
from pipeline.stages.slice import load_task


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--task", required=True)
    ap.add_argument("--data", required=True, help="the task's folder from the data stage")
    ap.add_argument("--slices", required=True, help="the task's folder from the slice stage")
    ap.add_argument("--out", required=True, help="folder for floors.json")
    ap.add_argument("--report", help="Markdown table of the floors")
    return ap.parse_args(argv)


def load_split(slices: Path, names: list[str]) -> list[np.ndarray]:
    path = slices / "indices.npz"
    try:
        with np.load(checked_arrays(path), allow_pickle=False) as z:
            arrays = {n: z[n] for n in names if n in z.files}
    except (OSError, ValueError, EOFError) as err:
        raise StageError(f"{path}: cannot read the splits ({err or type(err).__name__})") from None
    missing = [n for n in names if n not in arrays]
    if missing:
        raise ConfigError(f"train.size: {path} has no {missing[0]} (not in slice.train_sizes?)")
    return [arrays[n] for n in names]


def load_slices(slices: Path) -> dict[str, np.ndarray]:
    """Every slice of test the splits hold (``slice/...``: a row may decide on any of them)."""
    with np.load(checked_arrays(slices / "indices.npz"), allow_pickle=False) as z:
        return {n: z[n] for n in z.files if n.startswith("slice/")}


# Slices whose floors the page tabulates per baseline (the ones the ledger's rows decide or learn on).
PAGE_SLICES = ("slice/id", "slice/ood", "slice/window=same", "slice/window=cross")


def markdown(record: dict) -> str:
    shown = [s for s in PAGE_SLICES if s in record["floor_slices"]]
    beside = record.get("beside_slices")
    lines = [f"# Shortcut floors: {record['task']}", "",
             f"Factor: {record['factor']}. Chance {record['chance']:.3f}; floor on test **{record['floor']:.3f}** "
             f"({record['floor_baseline']}). Baselines that see the factor are listed but not counted. A row "
             "decides on a slice only when its winning arm clears that slice's floor (docs/methods.md)."
             + (f" Shown beside, not counted: {record['beside_baseline']} **{record['beside_floor']:.3f}** "
                "(coarse layout; the report says where an arm sits below it)." if "beside_floor" in record
                else ""), "",
             "| slice | n | floor | baseline | it ignores |" + (" beside (not counted) |" if beside else ""),
             "|---|---|---|---|---|" + ("---|" if beside else ""),
             f"| test | {record['baselines'][record['floor_baseline']]['n']} | {record['floor']:.3f} | "
             f"{record['floor_baseline']} | {record['baselines'][record['floor_baseline']].get('ignores', '')} |"
             + (f" {record['beside_floor']:.3f} {record['beside_baseline']} |" if beside else "")]
    for name, acc in record["floor_slices"].items():
        b = record["baselines"][record["floor_slice_baselines"][name]]
        lines.append(f"| {name} | {b['slices'][name]['n']} | {acc:.3f} | {record['floor_slice_baselines'][name]} | "
                     f"{b.get('ignores', '')} |" + (" {:.3f} {} |".format(*beside[name]) if beside else ""))
    lines += ["", f"| baseline | test | 95% Wilson CI | {' | '.join(shown)}{' | ' if shown else ''}sees | ignores | "
              "counted |", "|---|---|---|" + "---|" * len(shown) + "---|---|---|"]
    for name, b in record["baselines"].items():
        per = "".join(f"{b['slices'][s]['acc']:.3f} | " for s in shown)
        lines.append(f"| {name} | {b['acc']:.3f} | [{b['ci'][0]:.3f}, {b['ci'][1]:.3f}] | {per}{b['uses']} | "
                     f"{b.get('ignores', '')} | {_counted(b)} |")
    return "\n".join(lines) + "\n"


def _counted(baseline: dict) -> str:
    if baseline["uses_factor"]:
        return "no (sees the factor)"
    return "beside (coarse layout)" if baseline.get("beside") else "yes"


@stage_main
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    params = load_params(args.params)
    if args.task not in params.tasks.names or args.task not in OBJECTS:
        raise ConfigError(f"{args.params}: tasks.names: {args.task!r} is not an enabled task {params.tasks.names}")
    params = params.for_task(args.task)  # its patch grid at its zoom
    data = Path(args.data)
    images, labels, factors, meta = load_task(data)
    train, val, test = load_split(Path(args.slices), [f"train_{params.train.size}", "val", "test"])
    slices = load_slices(Path(args.slices))
    for name, idx in {"train": train, "val": val, "test": test, **slices}.items():
        if len(idx) and (idx.min() < 0 or idx.max() >= len(labels)):
            raise StageError(f"{Path(args.slices) / 'indices.npz'}: {name} has indices outside the pool of "
                             f"{len(labels)} images")
    record = floors(args.task, images, labels, factors, train, test, meta["num_classes"],
                    params.geometry.patch_size, params.seed, slices, val)
    with atomic_dir(args.out) as tmp:
        write_json(tmp / "floors.json", record)
    if args.report:
        write_text(args.report, markdown(record))
    print(f"{args.task}: floor {record['floor']:.3f} ({record['floor_baseline']}), chance {record['chance']:.3f} "
          f"-> {args.out}")


if __name__ == "__main__":
    raise SystemExit(main())
