"""``alignment``: an object at a controlled sub-patch offset to the patch grid; class = what the object shows.

Two kinds of object (``objects``):

- ``pairs`` (the default): the scale task's four 1 px dots at the corners of a ``box`` px box, one colour on a
  row or a column of it (:func:`common.paint_pairs`); with ``box`` = 1 mod P every dot sits at the same pixel of
  its patch, (dx, dy), so an unseen offset puts every dot where the patch projection never saw one. Both classes
  show the same dots at the same places; linear reads stay at chance, but trees on a bag of windows read the
  class from the dots' distances to the image border (0.95, reports/shortcuts/alignment.md).
- ``glyphs``: one of ``num_classes`` small binary glyphs. Bags of 3x3 local patterns name them at every offset,
  unseen ones included (reports/shortcuts/), so no row can decide on it.

Each object is placed with its top-left corner at ``(cell_y * P + dy, cell_x * P + dx)``: the *cell* is a
whole-patch position (moving it is a whole-scene shift by a multiple of P, a pure token translation for a
ViT), the *offset* ``(dx, dy)`` in ``0..P-1`` is the alignment to the grid (changing it changes what every
patch contains). The two are drawn independently and recorded apart, so a reader can separate a shift of the
scene from a change of alignment. ``fit`` rows draw both offsets from ``train_offsets``; ``eval`` rows from
all of ``0..P-1`` (``id`` = both offsets inside the training range). ``transfer_n`` rows more, from their own
random stream, have offsets outside the training range only: the distillation transfer set (docs/methods.md).

Difficulty knobs (glyphs): ``num_classes``, ``glyph_size``, ``glyph_flips`` (two glyphs differ in exactly
``2 * glyph_flips`` pixels: small = similar), ``clutter`` (random foreground pixels), ``noise``.
params.yaml draws ``noise: 0``, ``clutter: 0`` and trains on offsets 0..2, so offset 3 is the unseen one: at
offsets 0..1 every patch-based arm sat at or below chance on the unseen offsets and the rows comparing them
decided nothing (issue 27; docs/design.md section 2 has the probes).

Shortcut fix (glyphs; pipeline/shortcuts.py): every glyph has the same pixel count (``glyph_bank``), because the
foreground area alone told the 4 glyphs apart at 0.50 (chance 0.25); with equal areas it is at chance.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from pipeline.sections import Geometry, NonNegInt, PosInt, Range, check_range
from pipeline.tasks import common
from pipeline.tasks.common import PAIRS, PairsParams, TaskData

SLICE_FACTORS = ["offset", "dx", "dy", "position"]


class AlignmentParams(PairsParams):
    objects: Literal["pairs", "glyphs"] = "pairs"
    box: Annotated[int, Field(ge=3)] = 9  # pairs: px side of the box whose corners hold the dots
    # glyphs: the classes (unused with pairs)
    num_classes: Annotated[int, Field(ge=2)] = 4
    glyph_size: PosInt = 3  # px; glyphs differ in exactly 2 * glyph_flips pixels (similarity knob)
    glyph_flips: PosInt = 2
    train_offsets: Range  # fit rows: dx, dy in this range; eval rows: all of 0..P-1
    # transfer rows: offsets outside train_offsets only, never trained on with their labels (distill.students
    # with transfer: true learn them from a teacher's targets); 0: none
    transfer_n: NonNegInt = 0

    @model_validator(mode="after")
    def _glyphs(self) -> AlignmentParams:
        check_range("train_offsets", self.train_offsets)
        if self.objects == "pairs":
            self.check_box("box", self.box)
        if self.objects == "glyphs" and self.num_classes * self.glyph_flips > self.glyph_size**2 - 1:
            raise ValueError(f"glyph_flips: {self.num_classes} classes x {self.glyph_flips} flips exceed the "
                             f"{self.glyph_size ** 2 - 1} flippable pixels of a {self.glyph_size} px glyph")
        return self


def fits(params) -> list[tuple[bool, str, str]]:
    """(bad, key, why): what does not fit the geometry (checked after every section is valid)."""
    a, p, h = params.tasks.alignment, params.geometry.patch_size, params.geometry.image_size
    key = "tasks.alignment.box" if a.objects == "pairs" else "tasks.alignment.glyph_size"
    return [(a.train_offsets[1] > p - 1, "tasks.alignment.train_offsets",
             f"{a.train_offsets} leaves the offsets 0..{p - 1} of a {p} px patch"),
            (cells(params.geometry, a)[1] < 1, key, f"{extent(a)} px at offset {p - 1} does not fit a {h} px image"
             + (f" with a {a.margin} px margin" if a.margin else ""))]


def extent(cfg: AlignmentParams) -> int:
    """The object's side in px: the pairs' box or a glyph."""
    return cfg.box if cfg.objects == "pairs" else cfg.glyph_size


def cells(geometry: Geometry, cfg: AlignmentParams) -> tuple[int, int]:
    """(first, count): the cells per axis where the object fits at every offset, ``margin`` px from each edge:
    margin <= cell * P and cell * P + (P - 1) + side <= H - margin."""
    p, h, m = geometry.patch_size, geometry.image_size, cfg.margin
    first = -(-m // p)
    return first, (h - m - extent(cfg) - p + 1) // p + 1 - first


def generate(n: int, seed: int, geometry: Geometry, cfg: AlignmentParams) -> TaskData:
    rng = common.task_rng(seed, "alignment")
    p, k = geometry.patch_size, len(class_names(cfg))
    n_eval, n_fit = common.split_counts(n, cfg.eval_fraction)
    labels = np.concatenate([common.balanced_labels(rng, n_eval, k), common.balanced_labels(rng, n_fit, k)])
    glyphs = common.glyph_bank(rng, k, cfg.glyph_size, cfg.glyph_flips) if cfg.objects == "glyphs" else None
    lo, hi = cfg.train_offsets
    dxy = np.concatenate([rng.integers(0, p, (n_eval, 2)), rng.integers(lo, hi + 1, (n_fit, 2))])
    pool = _draw(rng, labels, dxy, glyphs, common.roles(n_eval, n_fit), geometry, cfg)
    if not cfg.transfer_n:
        return pool
    # The transfer rows come from their own stream, after the pool: adding them leaves every pool image as it was.
    t_rng = common.task_rng(seed, "alignment/transfer")
    unseen = np.array([(x, y) for y in range(p) for x in range(p) if not (lo <= x <= hi and lo <= y <= hi)])
    t_labels = common.balanced_labels(t_rng, cfg.transfer_n, k)
    t_dxy = unseen[t_rng.integers(0, len(unseen), cfg.transfer_n)]
    transfer = _draw(t_rng, t_labels, t_dxy, glyphs,
                     np.array([common.ROLE_TRANSFER] * cfg.transfer_n, dtype=object), geometry, cfg)
    return TaskData(np.concatenate([pool.images, transfer.images]), np.concatenate([pool.labels, transfer.labels]),
                    pd.concat([pool.factors, transfer.factors], ignore_index=True), pool.class_names)


def class_names(cfg: AlignmentParams) -> list[str]:
    return PAIRS if cfg.objects == "pairs" else [f"glyph{i}" for i in range(cfg.num_classes)]


def _draw(rng: np.random.Generator, labels: np.ndarray, dxy: np.ndarray, glyphs: np.ndarray | None,
          role: np.ndarray, geometry: Geometry, cfg: AlignmentParams) -> TaskData:
    """Images of ``labels``' objects at offsets ``dxy`` in random cells, colours, clutter and noise."""
    n, p, h = len(labels), geometry.patch_size, geometry.image_size
    lo, hi = cfg.train_offsets
    first, count = cells(geometry, cfg)
    cell = first + rng.integers(0, count, (n, 2))
    ys, xs = cell[:, 0] * p + dxy[:, 1], cell[:, 1] * p + dxy[:, 0]

    if glyphs is None:
        images = common.paint_pairs(rng, labels, np.full(n, cfg.box), ys, xs, h, geometry.channels, cfg)
    else:
        mask = np.zeros((n, h, h), dtype=bool)
        common.stamp(mask, glyphs[labels], ys, xs)
        fg, bg = common.random_colours(rng, n, geometry.channels)
        images = common.paint(mask, fg, bg)
        common.scatter_pixels(images, rng, cfg.clutter, fg)
        images = common.finish(images, rng, cfg.noise)

    dx, dy = dxy[:, 0], dxy[:, 1]
    factors = pd.DataFrame({
        "dx": dx, "dy": dy,
        "offset": common.pair_labels(dx, dy),
        "cell_x": cell[:, 1], "cell_y": cell[:, 0],
        "position": common.pair_labels(cell[:, 1], cell[:, 0]),
        "x": xs, "y": ys,
        "id": (dx >= lo) & (dx <= hi) & (dy >= lo) & (dy <= hi),
        "role": role,
    })
    return TaskData(images, labels, factors, class_names(cfg))
