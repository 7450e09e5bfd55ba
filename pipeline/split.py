"""A task's arrays as a run reads them: the pool, the slice stage's indices, and the images a run trains on.

Data code, apart from the orchestration in :mod:`pipeline.experiment` and the Lightning code in
:mod:`pipeline.learner`: every missing, unreadable or altered file is a one-line :class:`StageError` naming it.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.config import Params
from pipeline.errors import StageError
from pipeline.grid import RunSpec
from pipeline.io import checked_arrays, index_sha256, read_json, sha256_bytes
from pipeline.schemas import SLICE_MANIFEST, TASK_META


@dataclass(frozen=True)
class Split:
    """Arrays of one task, cut by the slice stage's indices."""

    images: np.ndarray  # (N, H, W, C) uint8
    labels: np.ndarray  # (N,) int64
    indices: dict[str, np.ndarray]  # "train_<n>", "val", "test", "pool", "slice/<factor>=<value>"
    num_classes: int
    group: int = 1  # K for a twin task (its pool holds whole pairs of K adjacent samples), else 1


def load_split(spec: RunSpec, verify: bool = False) -> tuple[Split, dict]:
    """``(arrays + indices, the slice manifest)`` for a task; every missing or inconsistent file is a one-line
    :class:`StageError`. ``verify``: also check every array against the hash its stage recorded and every index
    against the pool's length (:func:`verify_split`; the stages do it once, before any worker starts)."""
    files = {k: spec.data_dir / f for k, f in
             {"images": "images.npy", "labels": "labels.npy", "meta": "meta.json"}.items()}
    files["indices"] = spec.slices_dir / "indices.npz"
    files["manifest"] = spec.slices_dir / "manifest.json"
    for path in files.values():
        if not path.exists():
            raise StageError(f"{path}: missing (run the data and slice stages: dvc repro)")
    current = files["images"]  # the file being read, named in the error
    try:
        images = np.load(checked_arrays(current), allow_pickle=False)
        labels = np.load(checked_arrays(current := files["labels"]), allow_pickle=False)
        with np.load(checked_arrays(current := files["indices"]), allow_pickle=False) as z:
            indices = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise StageError(f"{current}: unreadable ({type(err).__name__}: {err})") from None
    meta, manifest = read_json(files["meta"], TASK_META), read_json(files["manifest"], SLICE_MANIFEST)
    if images.ndim != 4 or images.dtype != np.uint8 or len(images) != len(labels):
        raise StageError(f"{files['images']}: expected uint8 (N,H,W,C) matching labels, got "
                         f"{images.dtype} {images.shape} vs {labels.shape}")
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise StageError(f"{files['labels']}: expected integer class labels of shape (N,), got {labels.dtype} "
                         f"{labels.shape}; rerun the data stage: dvc repro")
    if missing := [k for k in ("val", "test") if k not in indices]:
        raise StageError(f"{files['indices']}: no {' or '.join(missing)} array (a run validates and tests on "
                         "them); rerun the slice stage: dvc repro")
    if bad := [k for k, v in indices.items() if v.ndim != 1 or not np.issubdtype(v.dtype, np.integer)]:
        raise StageError(f"{files['indices']}: {bad[0]} is not a 1-D integer index array")
    if manifest["source"]["images_sha256"] != meta["sha256"]["images"]:
        # valid files, but the slices describe another generation of the pool (data regenerated after slicing)
        raise StageError(f"{files['indices']}: sliced from other images than {files['images']} "
                         f"(manifest.json source.images_sha256 differs from meta.json); rerun the slice stage")
    if verify:
        verify_split(images, labels, indices, meta, manifest, files)
    split = Split(images=images, labels=labels.astype(np.int64), indices=indices,
                  num_classes=int(meta["num_classes"]),
                  group=int(meta["num_classes"]) if manifest.get("twin_aware") else 1)
    return split, manifest


def verify_split(images: np.ndarray, labels: np.ndarray, indices: dict, meta: dict, manifest: dict,
                 files: dict[str, Path]) -> None:
    """The arrays are the ones the data and slice stages wrote: images and labels hash to ``meta.json``'s
    sha256, every index array to ``manifest.json``'s, and every index lies inside the pool. A mismatch names
    the file (tampered labels or a negative index would otherwise train silently)."""
    for name, arr in (("images", images), ("labels", labels)):
        if sha256_bytes(np.ascontiguousarray(arr).tobytes()) != meta["sha256"][name]:
            raise StageError(f"{files[name]}: sha256 differs from {files['meta']} (modified after the data stage?); "
                             f"rerun it: dvc repro")
    k = meta["num_classes"]
    if len(labels) and (labels.min() < 0 or labels.max() >= k):
        raise StageError(f"{files['labels']}: labels outside 0..{k - 1} ({files['meta']} num_classes {k})")
    arrays = manifest["arrays"]
    for name, idx in indices.items():
        if index_sha256(idx) != (arrays.get(name) or {}).get("sha256"):
            raise StageError(f"{files['indices']}: {name} does not hash to {files['manifest']}'s record "
                             f"(modified after the slice stage?); rerun it: dvc repro")
        if len(idx) and (idx.min() < 0 or idx.max() >= len(labels)):
            raise StageError(f"{files['indices']}: {name} has indices outside the pool of {len(labels)} images")
        if len(np.unique(idx)) != len(idx):
            raise StageError(f"{files['indices']}: {name} lists an image twice")
    check_disjoint_nested(indices, files["indices"])


def check_disjoint_nested(indices: dict[str, np.ndarray], where: Path) -> None:
    """Training subsets share no image with val, test or the transfer set (nor the transfer set with val or test),
    and each lies inside the next larger one (the data-size
    curve adds images, never swaps them); a draw that breaks either is one line naming the arrays."""
    sizes = sorted((int(k.removeprefix("train_")), k) for k in indices if k.startswith("train_"))
    held = {k: indices[k] for k in ("val", "test", "transfer") if k in indices}
    for _, name in sizes:
        for other, idx in held.items():
            if np.intersect1d(indices[name], idx).size:
                raise StageError(f"{where}: {name} shares images with {other}")
    for (_, small), (_, large) in zip(sizes, sizes[1:], strict=False):
        if np.setdiff1d(indices[small], indices[large]).size:
            raise StageError(f"{where}: {small} is not inside {large} (the training subsets are nested)")
    for a, b in (("val", "test"), ("transfer", "val"), ("transfer", "test")):
        if a in held and b in held and np.intersect1d(held[a], held[b]).size:
            raise StageError(f"{where}: {a} shares images with {b}")


def subset(indices: dict, size: int, where: Path) -> np.ndarray:
    """The nested training subset ``train_<size>``; a one-line error listing the sizes there are."""
    key = f"train_{size}"
    if key not in indices:
        sizes = sorted(int(k.removeprefix("train_")) for k in indices if k.startswith("train_"))
        raise StageError(f"{where}: no training subset of size {size} (have {sizes})")
    return indices[key]


def transfer_set(indices: dict, task: str, where: Path) -> np.ndarray:
    """The task's transfer set (images at the factor's unseen values, no true label ever trained on)."""
    if "transfer" not in indices:
        raise StageError(f"{where}: no transfer set for {task} (tasks.{task}.transfer_n is 0 or the slice stage "
                         "predates it; rerun: dvc repro)")
    return indices["transfer"]


def shaped_relabel(said: np.ndarray, truth: np.ndarray, cells: np.ndarray, stream: tuple[int, ...]) -> np.ndarray:
    """The noise control shaped like a teacher's errors: within each (factor value, true class) cell, the teacher's
    own predictions ``said`` permuted at random. Every cell keeps its confusion counts exactly; which image
    carries an error no longer depends on the image, so no bias of the teacher's travels with it."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(stream)))
    out = said.astype(np.int64).copy()
    keys = pd.MultiIndex.from_arrays([cells, truth]).factorize()[0]
    for key in np.unique(keys):
        members = np.flatnonzero(keys == key)
        out[members] = rng.permutation(out[members])
    return out


def read_factors(data_dir: Path, column: str) -> np.ndarray:
    """One factor column of the task's ``factors.csv`` (rows = pool indices); a one-line error if absent."""
    path = data_dir / "factors.csv"
    try:
        return pd.read_csv(path, usecols=[column])[column].to_numpy()
    except (OSError, ValueError) as err:
        raise StageError(f"{path}: no readable column {column!r} ({type(err).__name__}); rerun the data "
                         "stage") from None


def redraw(pool: np.ndarray, official: np.ndarray, labels: np.ndarray, data_seed: int) -> np.ndarray:
    """Another class-balanced draw of ``len(official)`` training images from ``pool`` (the largest subset).

    Each class keeps its count in the official subset; ``data_seed`` picks which pool images fill it. Val and
    test are untouched, so item-paired comparisons across draws stay valid.
    """
    rng = np.random.default_rng(data_seed)
    counts = np.bincount(labels[official], minlength=int(labels.max()) + 1)
    picked = [rng.permutation(pool[labels[pool] == c])[:n] for c, n in enumerate(counts)]
    return np.sort(np.concatenate(picked)).astype(np.int64)


def teacher_set(split, params: Params, task: str, where: Path) -> np.ndarray:
    """The teachers' training images: ``train_<teacher_size>`` minus the students' ``train_<train.size>``
    (disjoint from every student's images); empty on a task no teacher trains on."""
    d = params.distill
    if not any(task in d.teacher_tasks(t) for t in d.teachers) or f"train_{d.teacher_size}" not in split.indices:
        return np.array([], dtype=np.int64)
    return np.setdiff1d(subset(split.indices, params.distill.teacher_size, where),
                        subset(split.indices, params.train.size, where))


def seed_draw(pool: np.ndarray, labels: np.ndarray, size: int, group: int, stream: tuple[int, ...],
              where: Path) -> np.ndarray:
    """A class-balanced draw of ``size`` images from ``pool``, seeded by ``stream``: per class one random order,
    its first n // K (+1 for the first n % K classes), so one stream's draws are nested over sizes. ``group`` > 1:
    the pool is twin pairs of ``group`` adjacent samples (one per class), drawn whole."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([*stream, zlib.crc32(b"draw")])))
    if group > 1:
        pairs = pool.reshape(-1, group)
        if size % group or size // group > len(pairs):
            raise StageError(f"{where}: pool: {len(pairs)} twin pairs cannot give a draw of {size} images")
        return np.sort(pairs[rng.permutation(len(pairs))[: size // group]].reshape(-1)).astype(np.int64)
    k = int(labels.max()) + 1
    counts = size // k + (np.arange(k) < size % k)
    picked = []
    for c, n in enumerate(counts):
        rows = pool[labels[pool] == c]
        if len(rows) < n:
            raise StageError(f"{where}: pool: {len(rows)} images of class {c} cannot give a draw of {size} "
                             f"(raise the task's n, or set train.draw: fixed)")
        picked.append(rng.permutation(rows)[:n])
    return np.sort(np.concatenate(picked)).astype(np.int64)


def training_indices(spec: RunSpec, split, params: Params) -> np.ndarray:
    """The images a run trains on: (teachers) the teacher set, or a class-balanced draw of it of
    ``distill.teacher_train`` images seeded by the teacher's seed; (train.draw: per_seed) the seed's own draw from the
    pool less the teacher set, stream (seed, data_seed), the same for every arm; (fixed) its subset, or another
    draw of it for data_seed > 0."""
    group = split.group
    where, k = spec.slices_dir / "indices.npz", spec.key
    if spec.kind == "teacher":  # disjoint from the students' images; each teacher seed its own draw of it
        held = teacher_set(split, params, k.task, where)
        if k.train_size >= len(held):
            return held
        return seed_draw(held, split.labels, k.train_size, group, (k.seed, zlib.crc32(b"teacher")), where)
    if params.train.draw == "per_seed":
        if "pool" not in split.indices:
            raise StageError(f"{where}: no pool array (train.draw: per_seed draws from it); rerun the slice stage")
        pool = split.indices["pool"]
        held = teacher_set(split, params, k.task, where)
        if held.size:  # drop the teacher's images (whole pairs: teacher subsets are drawn pair-aware)
            keep = ~np.isin(pool, held)
            pool = pool[keep if group == 1 else keep.reshape(-1, group).all(axis=1).repeat(group)]
        return seed_draw(pool, split.labels, k.train_size, group, (k.seed, k.data_seed), where)
    own = subset(split.indices, k.train_size, where)
    if k.data_seed == 0:
        return own
    largest = max((x for x in split.indices if x.startswith("train_")), key=lambda x: int(x.split("_")[1]))
    return redraw(split.indices[largest], own, split.labels, k.data_seed)


# --------------------------------------------------------------------------- prepare (stage process)
