"""Nested, class-balanced training subsets, fixed validation/test splits, and per-factor evaluation slices.

Conventions (every task):
- ``val`` and every ``train_<n>`` come from the pool's ``fit`` rows, ``test`` from its ``eval`` rows, so a
  task with a training range (alignment offsets, scale sizes) tests on the full range;
- ``train_<n>`` are nested: per class, one random order of the fit rows left after ``val``, and
  ``train_<n>`` takes its first ``n // K`` (+1 for the first ``n % K`` classes) from each class, so every
  smaller subset is a subset of every larger one and class counts differ by at most one;
- ``slice/<factor>=<value>`` are subsets of ``test`` (one per value found there), plus ``slice/id`` and
  ``slice/ood`` where the test split holds samples outside the training distribution;
- in a task with twins (a ``twins`` factor column naming each sample's pair, one sample of each class per
  pair: relation, arrangement) the draws above are made over whole pairs, so a pair never straddles
  train/val/test, ``test`` and every slice hold complete pairs, and every size must be even;
- ``pool`` holds every fit row outside ``val`` (whole twin pairs, each pair's K samples adjacent): what a run
  draws its own training subset from (``train.draw: per_seed``, :func:`pipeline.split.seed_draw`);
- every index array is int64, sorted ascending (``pool`` of a twin task: by pair), into the task's
  ``images.npy``/``labels.npy``;
- given the images' content digests, a pixel-identical copy of an earlier image is never drawn, so no image
  appears in two of train/val/test/transfer (generators draw at random and may repeat a small image).
"""

from __future__ import annotations

import hashlib
import zlib
from itertools import pairwise

import numpy as np
import pandas as pd

from pipeline.config import Slicing
from pipeline.errors import ConfigError, StageError
from pipeline.io import index_sha256
from pipeline.tasks.common import ROLE_EVAL, ROLE_FIT, ROLE_TRANSFER


def per_class_counts(n: int, k: int) -> np.ndarray:
    """(k,) counts summing to n, each n // k or n // k + 1; monotone in n, so nested draws stay nested."""
    return n // k + (np.arange(k) < n % k)


def _class_orders(rng: np.random.Generator, labels: np.ndarray, rows: np.ndarray, k: int) -> list[np.ndarray]:
    """Per class, the candidate rows in one random order."""
    return [rng.permutation(rows[labels[rows] == c]) for c in range(k)]


def _take(orders: list[np.ndarray], counts: np.ndarray, key: str, task: str) -> np.ndarray:
    short = [c for c, (o, m) in enumerate(zip(orders, counts, strict=True)) if len(o) < m]
    if short:
        c = short[0]
        raise ConfigError(f"{key}: needs {counts[c]} samples of class {c} in {task}, "
                          f"the pool has {len(orders[c])}")
    return np.sort(np.concatenate([o[:m] for o, m in zip(orders, counts, strict=True)])).astype(np.int64)


def twin_table(pairs: np.ndarray, labels: np.ndarray, num_classes: int, task: str) -> np.ndarray:
    """(N,) pair id per sample -> (N / K, K) int64: row j holds pair j's sample of class 0, 1, ..., K-1.

    Raises StageError unless every pair holds exactly one sample of each class (what makes a pair-drawn
    subset exactly class-balanced)."""
    order = np.lexsort((labels, pairs))
    table = order.reshape(-1, num_classes) if len(order) % num_classes == 0 else None
    if table is None or not ((pairs[table] == pairs[table[:, :1]]).all()
                             and (labels[table] == np.arange(num_classes)).all()):
        raise StageError(f"{task}: twins: every pair must hold exactly one sample of each of {num_classes} classes")
    return table


def _pair_orders(rng: np.random.Generator, table: np.ndarray, rows: np.ndarray) -> list[np.ndarray]:
    """The pairs whose samples all lie in ``rows``, in one random order, as one 'class' of pair indices."""
    return [rng.permutation(np.flatnonzero(np.isin(table, rows).all(axis=1)))]


def _take_pairs(orders: list[np.ndarray], n: int, table: np.ndarray, key: str, task: str) -> np.ndarray:
    k = table.shape[1]
    if n % k:
        raise ConfigError(f"{key}: {n} is not a multiple of {k} ({task} is drawn in whole twin pairs)")
    if len(orders[0]) < n // k:
        raise ConfigError(f"{key}: needs {n // k} twin pairs in {task}, the pool has {len(orders[0])}")
    pairs = orders[0][: n // k]
    return np.sort(table[pairs].reshape(-1)).astype(np.int64)


def image_digests(images: np.ndarray) -> np.ndarray:
    """(N,) 8-byte content digests of (N, ...) images: equal pixels, equal digest (blake2b, so unequal pixels
    collide with probability ~N^2 / 2^64)."""
    flat = np.ascontiguousarray(images).reshape(len(images), -1)
    return np.array([int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little")
                     for row in flat], dtype=np.uint64)


def first_copies(digests: np.ndarray) -> np.ndarray:
    """(N,) bool: the row is the first (in pool order) of the rows with its content digest."""
    keep = np.zeros(len(digests), dtype=bool)
    keep[np.unique(digests, return_index=True)[1]] = True
    return keep


def make_splits(labels: np.ndarray, factors: pd.DataFrame, num_classes: int, slice_factors: list[str],
                cfg: Slicing, seed: int, task: str, twins: str | None = None,
                digests: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """All index arrays for one task: ``train_<n>``, ``val``, ``test``, ``slice/<factor>=<value>``, and
    ``transfer`` (the rows of role ``transfer``) where the task draws them.

    labels: (N,) int64; factors: N rows with ``role``, ``id``, the ``slice_factors`` and ``twins`` columns;
    twins: the column naming each sample's twin pair (draws are then made over whole pairs), or None;
    digests: (N,) content digests (:func:`image_digests`): only the first copy of an image is ever drawn.
    Raises ConfigError (naming the ``slice.*`` key) when the pool is too small for a requested size.
    """
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(f"slice/{task}".encode())])))
    role = factors["role"].to_numpy()
    usable = np.ones(len(role), dtype=bool) if digests is None else first_copies(digests)
    fit, ev = np.flatnonzero((role == ROLE_FIT) & usable), np.flatnonzero((role == ROLE_EVAL) & usable)
    if twins is None:
        k = num_classes

        def orders(rows: np.ndarray) -> list[np.ndarray]:
            return _class_orders(rng, labels, rows, k)

        def take(order: list[np.ndarray], n: int, key: str) -> np.ndarray:
            return _take(order, per_class_counts(n, k), key, task)
    else:
        table = twin_table(factors[twins].to_numpy(), labels, num_classes, task)

        def orders(rows: np.ndarray) -> list[np.ndarray]:
            return _pair_orders(rng, table, rows)

        def take(order: list[np.ndarray], n: int, key: str) -> np.ndarray:
            return _take_pairs(order, n, table, key, task)
    out = {"test": take(orders(ev), cfg.test_size, "slice.test_size")}
    out["val"] = take(orders(fit), cfg.val_size, "slice.val_size")
    rest = np.setdiff1d(fit, out["val"])
    train_order = orders(rest)
    for n in cfg.train_sizes:
        out[f"train_{n}"] = take(train_order, n, "slice.train_sizes")
    # the draw pool: twins as whole pairs, K adjacent samples each (a draw takes pairs, never half of one)
    out["pool"] = rest if twins is None else table[np.isin(table, rest).all(axis=1)].reshape(-1).astype(np.int64)
    if (transfer := np.flatnonzero((role == ROLE_TRANSFER) & usable)).size:  # every transfer row, in pool order
        out["transfer"] = transfer.astype(np.int64)
    _add_slices(out, factors, slice_factors)
    check_splits(out, digests)
    if twins is not None:
        check_twins(out, factors[twins].to_numpy())
    return out


def _add_slices(out: dict[str, np.ndarray], factors: pd.DataFrame, slice_factors: list[str]) -> None:
    """``slice/<factor>=<value>`` (and ``slice/id``/``slice/ood``) as subsets of ``out['test']``, in place."""
    test_factors = factors.iloc[out["test"]]
    for col in slice_factors:
        for value, rows in test_factors.groupby(col, sort=True).groups.items():
            out[f"slice/{col}={_fmt(value)}"] = np.sort(np.asarray(rows, dtype=np.int64))
    in_dist = test_factors["id"].to_numpy(dtype=bool)
    if not in_dist.all():
        out["slice/id"] = out["test"][in_dist]
        out["slice/ood"] = out["test"][~in_dist]


def _fmt(value: object) -> str:
    if isinstance(value, bool | np.bool_):
        return str(bool(value)).lower()
    return str(value)


def check_splits(arrays: dict[str, np.ndarray], digests: np.ndarray | None = None) -> None:
    """Invariants (else a StageError naming the array): nothing empty; train/val/test (and transfer) pairwise disjoint,
    by index and (given ``digests``) by content; train subsets nested; slices inside test."""
    for name, idx in arrays.items():
        if len(idx) == 0:
            raise StageError(f"{name}: empty")
        if len(np.unique(idx)) != len(idx):
            raise StageError(f"{name}: repeated indices")
    trains = sorted((n for n in arrays if n.startswith("train_")), key=lambda n: int(n.split("_")[1]))
    for small, big in pairwise(trains):
        if not np.isin(arrays[small], arrays[big]).all():
            raise StageError(f"{small}: not a subset of {big}")
    held = [("val", "test"), (trains[-1], "val"), (trains[-1], "test")]
    held += [("transfer", x) for x in (trains[-1], "val", "test") if "transfer" in arrays]
    if "pool" in arrays:
        held += [("pool", x) for x in ("val", "test", "transfer") if x in arrays]
        if not np.isin(arrays[trains[-1]], arrays["pool"]).all():
            raise StageError(f"{trains[-1]}: not inside pool")
    for a, b in held:
        if np.intersect1d(arrays[a], arrays[b]).size:
            raise StageError(f"{a}: overlaps {b}")
        if digests is not None and np.intersect1d(digests[arrays[a]], digests[arrays[b]]).size:
            raise StageError(f"{a}: holds an image pixel-identical to one in {b}")
    for name in arrays:
        if name.startswith("slice/") and not np.isin(arrays[name], arrays["test"]).all():
            raise StageError(f"{name}: not a subset of test")


def check_twins(arrays: dict[str, np.ndarray], pairs: np.ndarray) -> None:
    """No twin pair straddles two of train (largest)/val/test, ``test``, ``pool`` and every slice hold whole pairs,
    and ``pool`` keeps each pair's samples adjacent (else a StageError naming the array)."""
    trains = [n for n in arrays if n.startswith("train_")]
    seen = {name: np.unique(pairs[arrays[name]]) for name in (*trains, "val", "test")}
    for a, b in (("val", "test"), *((t, "val") for t in trains), *((t, "test") for t in trains)):
        if np.intersect1d(seen[a], seen[b]).size:
            raise StageError(f"{a}: shares a twin pair with {b}")
    for name, idx in arrays.items():
        complete = np.isin(pairs, pairs[idx])  # every sample whose pair is touched by idx
        if complete.sum() != len(idx):
            raise StageError(f"{name}: holds incomplete twin pairs")
    if "pool" in arrays:
        k = len(pairs) // max(len(np.unique(pairs)), 1)
        grouped = pairs[arrays["pool"]].reshape(-1, k) if len(arrays["pool"]) % k == 0 else None
        if grouped is None or not (grouped == grouped[:, :1]).all():
            raise StageError("pool: a twin pair's samples are not adjacent")


def manifest(arrays: dict[str, np.ndarray], labels: np.ndarray, factors: pd.DataFrame,
             class_names: list[str], source: dict[str, str], twins: str | None = None) -> dict:
    """Sizes, class counts, sha256 per array; factor ranges of train (largest)/val/test; the source hashes;
    whether the draws were made over whole twin pairs (``twin_aware``, and the pair column)."""
    largest = max((n for n in arrays if n.startswith("train_")), key=lambda n: int(n.split("_")[1]))
    out = {"source": source, "twin_aware": twins is not None, "twin_column": twins, "arrays": {}}
    for name, idx in arrays.items():
        counts = np.bincount(labels[idx], minlength=len(class_names))
        out["arrays"][name] = {
            "size": len(idx),
            "class_counts": dict(zip(class_names, counts.tolist(), strict=True)),
            "sha256": index_sha256(idx),
        }
    out["factor_ranges"] = {name: factor_ranges(factors.iloc[arrays[name]]) for name in (largest, "val", "test")}
    return out


def factor_ranges(frame: pd.DataFrame, max_values: int = 32) -> dict[str, object]:
    """Per column: [min, max] for numbers, the sorted distinct values for categories (or their count)."""
    out: dict[str, object] = {}
    for col in frame.columns:
        s = frame[col]
        if pd.api.types.is_bool_dtype(s) or not pd.api.types.is_numeric_dtype(s):
            values = sorted(map(_fmt, s.unique()))
            out[col] = values if len(values) <= max_values else f"{len(values)} distinct values"
        else:
            out[col] = [s.min().item(), s.max().item()]
    return out
