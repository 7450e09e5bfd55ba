"""Stage ``shortcuts``: one task's shortcut floors (pipeline/shortcuts.py), fitted on ``train_<train.size>``,
scored on ``test``.

Reads the task's pool (``<data>``) and its splits (``<slices>/indices.npz``); writes ``<out>/floors.json``
(``task, factor, chance, baselines {name: {acc, n, ci, uses, uses_factor, slices}}, floor, floor_baseline,
floor_slices``; slices: ``slice/id`` and ``slice/ood`` where the task has them) or
nothing, and a short Markdown table at ``--report``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipeline.config import load_params
from pipeline.errors import ConfigError, StageError
from pipeline.io import checked_arrays, sha256_bytes, write_json, write_text
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


def load_optional(slices: Path, names: list[str]) -> dict[str, np.ndarray]:
    """Those of ``names`` the splits hold (the in/out-of-distribution slices exist only for some tasks)."""
    with np.load(checked_arrays(slices / "indices.npz"), allow_pickle=False) as z:
        return {n: z[n] for n in names if n in z.files}


def markdown(record: dict) -> str:
    lines = [f"# Shortcut floors: {record['task']}", "",
             f"Factor: {record['factor']}. Chance {record['chance']:.3f}; floor **{record['floor']:.3f}** "
             f"({record['floor_baseline']}). Baselines that see the factor are listed but not counted.",
             *[f"Floor on {name}: {acc:.3f}." for name, acc in record["floor_slices"].items()], "",
             "| baseline | acc | 95% Wilson CI | n | sees | counted |", "|---|---|---|---|---|---|"]
    for name, b in record["baselines"].items():
        lines.append(f"| {name} | {b['acc']:.3f} | [{b['ci'][0]:.3f}, {b['ci'][1]:.3f}] | {b['n']} | {b['uses']} | "
                     f"{'no (sees the factor)' if b['uses_factor'] else 'yes'} |")
    return "\n".join(lines) + "\n"


@stage_main
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    params = load_params(args.params)
    if args.task not in params.tasks.names or args.task not in OBJECTS:
        raise ConfigError(f"{args.params}: tasks.names: {args.task!r} is not an enabled task {params.tasks.names}")
    data = Path(args.data)
    labels, factors, meta = load_task(data)
    train, test = load_split(Path(args.slices), [f"train_{params.train.size}", "test"])
    slices = load_optional(Path(args.slices), ["slice/id", "slice/ood"])
    try:
        images = np.load(checked_arrays(data / "images.npy"), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise StageError(f"{data / 'images.npy'}: cannot read ({err})") from None
    if images.dtype != np.uint8 or images.ndim != 4 or len(images) != len(labels):
        raise StageError(f"{data / 'images.npy'}: expected uint8 (N,H,W,C) matching labels, got {images.dtype} "
                         f"{images.shape} vs {labels.shape}")
    if sha256_bytes(np.ascontiguousarray(images).tobytes()) != meta["sha256"]["images"]:
        raise StageError(f"{data / 'images.npy'}: sha256 differs from meta.json (modified after generation?)")
    for name, idx in {"train": train, "test": test, **slices}.items():
        if len(idx) and (idx.min() < 0 or idx.max() >= len(labels)):
            raise StageError(f"{Path(args.slices) / 'indices.npz'}: {name} has indices outside the pool of "
                             f"{len(labels)} images")
    record = floors(args.task, images, labels, factors, train, test, meta["num_classes"],
                    params.geometry.patch_size, params.seed, slices)
    with atomic_dir(args.out) as tmp:
        write_json(tmp / "floors.json", record)
    if args.report:
        write_text(args.report, markdown(record))
    print(f"{args.task}: floor {record['floor']:.3f} ({record['floor_baseline']}), chance {record['chance']:.3f} "
          f"-> {args.out}")


if __name__ == "__main__":
    raise SystemExit(main())
