"""``scale``: class = a configuration; its size runs over seen and unseen sizes (issue 52).

Two kinds of object (``objects``):

- ``pairs`` (the default): four identical ``dot`` px squares at the corners of a ``size`` px box, two in one
  colour and two in another; class ``rows``: each colour holds one row of the box (top two, bottom two),
  ``columns``: one column. Both classes show the same four dots at the same four places in the same two
  colours, and a window that sees one dot sees nothing of the class: only how the colours are arranged across
  the box tells them apart, at every size. A readout that ignores where the dots lie is left with the image
  border: a window there shows its dot's distance to the edge, which a row's two dots share. Read linearly, a
  bag of windows stays at chance with 1 px dots; read by trees it reads the class (0.94, reports/shortcuts/scale.md),
  so this 16 px design fails its floors (docs/history.md). Quarter turns would swap the classes (``rotate``
  must be false).
- ``shapes``: class = shape (:mod:`pipeline.shapes`), from below one patch to several. Bags of 3x3 local
  patterns solve it at every size, unseen ones included (reports/shortcuts/), so no row can decide on it.

Objects are exact integer masks, so every machine draws the same pixels. ``fit`` rows
draw sizes from ``train_sizes``; ``eval`` rows from ``min_size..max_size`` (``id`` = size inside the training
range), so unseen sizes are tested. ``transfer_n`` rows more, from their own random stream, have unseen sizes
only: the distillation transfer set (docs/methods.md).

Factors: size (px), size_rel (size / P), size_bin (``sub``: s < P, ``patch``: P <= s < 2P, ``multi``:
s >= 2P), x/y (top-left), straddles (the box crosses a patch boundary in x or y), rotation (degrees; with
``rotate`` each shape is turned by a random quarter turn, so mirror-image shapes such as ``zed``/``ess`` differ
in how their parts are arranged, never in one part alone).
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from pipeline.sections import Geometry, NonNegInt, PosInt, Range, check_range
from pipeline.shapes import SHAPES, coinciding_shapes, quarter_turns
from pipeline.tasks import common
from pipeline.tasks.common import PAIRS, PairsParams, TaskData

SLICE_FACTORS = ["size", "size_bin", "straddles"]


class ScaleParams(PairsParams):
    objects: Literal["pairs", "shapes"] = "pairs"
    # shapes: the classes (unused with pairs)
    shapes: list[Literal["square", "frame", "triangle", "plus", "disc", "diamond", "zed", "ess"]] = []
    rotate: bool  # each shape turned by a random quarter turn (factor `rotation`)
    min_size: Annotated[int, Field(ge=2)]  # px, over all (eval) rows
    max_size: PosInt
    train_sizes: Range  # fit rows draw sizes here; eval rows from min_size..max_size
    # transfer rows: unseen sizes only, never trained on with their labels (distill.students with transfer: true
    # learn them from a teacher's targets); 0: none
    transfer_n: NonNegInt = 0

    @model_validator(mode="after")
    def _sizes(self) -> ScaleParams:
        check_range("train_sizes", self.train_sizes, self.min_size, self.max_size)
        if self.min_size > self.max_size:
            raise ValueError(f"max_size: {self.max_size} is below min_size {self.min_size}")
        if self.objects == "pairs":
            self.check_box("min_size", self.min_size)
            if self.rotate:
                raise ValueError("rotate: a quarter turn swaps the pairs' classes (rows <-> columns); set it false")
        else:
            if len(set(self.shapes)) != len(self.shapes) or len(self.shapes) < 2:
                raise ValueError(f"shapes: need at least two distinct shapes, got {self.shapes}")
            if problem := coinciding_shapes(list(self.shapes), self.min_size, self.max_size):
                raise ValueError(f"min_size: {problem}")
        if self.transfer_n and self.train_sizes == [self.min_size, self.max_size]:
            raise ValueError("transfer_n: every size is a training size, so there is no unseen size to draw from")
        return self


def fits(params) -> list[tuple[bool, str, str]]:
    """(bad, key, why): what does not fit the geometry (checked after every section is valid)."""
    sc, h = params.tasks.scale, params.geometry.image_size
    return [(sc.max_size + 2 * sc.margin > h, "tasks.scale.max_size",
             f"{sc.max_size} px does not fit a {h} px image" + (f" with a {sc.margin} px margin" if sc.margin else ""))]

def generate(n: int, seed: int, geometry: Geometry, cfg: ScaleParams) -> TaskData:
    rng = common.task_rng(seed, "scale")
    k = len(class_names(cfg))
    n_eval, n_fit = common.split_counts(n, cfg.eval_fraction)
    labels = np.concatenate([common.balanced_labels(rng, n_eval, k), common.balanced_labels(rng, n_fit, k)])
    lo, hi = cfg.train_sizes
    size = np.concatenate([rng.integers(cfg.min_size, cfg.max_size + 1, n_eval),
                           rng.integers(lo, hi + 1, n_fit)])
    pool = _draw(rng, labels, size, common.roles(n_eval, n_fit), geometry, cfg)
    if not cfg.transfer_n:
        return pool
    # The transfer rows come from their own stream, after the pool: adding them leaves every pool image as it was.
    t_rng = common.task_rng(seed, "scale/transfer")
    unseen = np.array([s for s in range(cfg.min_size, cfg.max_size + 1) if not lo <= s <= hi])
    t_labels = common.balanced_labels(t_rng, cfg.transfer_n, k)
    t_size = unseen[t_rng.integers(0, len(unseen), cfg.transfer_n)]
    transfer = _draw(t_rng, t_labels, t_size, np.array([common.ROLE_TRANSFER] * cfg.transfer_n, dtype=object),
                     geometry, cfg)
    return TaskData(np.concatenate([pool.images, transfer.images]), np.concatenate([pool.labels, transfer.labels]),
                    pd.concat([pool.factors, transfer.factors], ignore_index=True), pool.class_names)


def class_names(cfg: ScaleParams) -> list[str]:
    return PAIRS if cfg.objects == "pairs" else list(cfg.shapes)


def _draw(rng: np.random.Generator, labels: np.ndarray, size: np.ndarray, role: np.ndarray, geometry: Geometry,
          cfg: ScaleParams) -> TaskData:
    """Images of ``labels``' objects at ``size`` px in random places (and quarter turns), colours, clutter, noise."""
    n, p, h = len(labels), geometry.patch_size, geometry.image_size
    lo, hi = cfg.train_sizes
    m = cfg.margin
    y0 = rng.integers(m, h - size - m + 1)
    x0 = rng.integers(m, h - size - m + 1)
    turns = rng.integers(0, 4, n) if cfg.rotate else np.zeros(n, dtype=np.int64)
    if cfg.objects == "pairs":
        images = common.paint_pairs(rng, labels, size, y0, x0, h, geometry.channels, cfg)
    else:
        images = _shapes(rng, labels, size, y0, x0, turns, h, geometry.channels, cfg)

    straddles = (y0 // p != (y0 + size - 1) // p) | (x0 // p != (x0 + size - 1) // p)
    factors = pd.DataFrame({
        "size": size,
        "size_rel": size / p,
        "size_bin": np.where(size < p, "sub", np.where(size < 2 * p, "patch", "multi")),
        "x": x0, "y": y0,
        "straddles": straddles,
        "rotation": 90 * turns,  # degrees, counter-clockwise
        "id": (size >= lo) & (size <= hi),
        "role": role,
    })
    return TaskData(images, labels, factors, class_names(cfg))


def _shapes(rng: np.random.Generator, labels: np.ndarray, size: np.ndarray, y0: np.ndarray, x0: np.ndarray,
            turns: np.ndarray, h: int, channels: int, cfg: ScaleParams) -> np.ndarray:
    """Each label's shape (and quarter turn) in one colour on a background, clutter, noise."""
    n = len(labels)
    # (N, H, W) box-local coordinates, then doubled and centred; int32 keeps squares exact.
    s3 = size[:, None, None].astype(np.int32)
    u = np.arange(h, dtype=np.int32)[None, :, None] - y0[:, None, None].astype(np.int32)
    v = np.arange(h, dtype=np.int32)[None, None, :] - x0[:, None, None].astype(np.int32)
    inside = (u >= 0) & (u < s3) & (v >= 0) & (v < s3)
    a, b = quarter_turns(2 * u + 1 - s3, 2 * v + 1 - s3, turns[:, None, None])
    mask = np.zeros((n, h, h), dtype=bool)
    for c, name in enumerate(cfg.shapes):  # a loop over K classes, each step vectorised over its samples
        sel = labels == c
        mask[sel] = inside[sel] & SHAPES[name](a[sel], b[sel], s3[sel])
    fg, bg = common.random_colours(rng, n, channels)
    images = common.paint(mask, fg, bg)
    common.scatter_pixels(images, rng, cfg.clutter, fg)
    return common.finish(images, rng, cfg.noise)
