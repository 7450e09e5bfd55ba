"""``arrangement``: the same multiset of patches in both classes; only their layout decides the label.

Glyph A and glyph B sit in two patch cells in different columns (``same_row``: also in one row), each
inside its cell (jittered, never touching a grid line), with ``clutter`` distractor glyphs of other
identities in further cells. Label 0 (``A_left``): A's column < B's column; label 1 (``B_left``).
Samples come in twins: the second is the first with cells A and B exchanged whole (background and noise
included), which flips the label. So per twin the two images are exact permutations of the same P x P
patches: a model that sees a bag of patch contents (no position, permutation-invariant readout) is at
chance by construction.

Shortcuts (pipeline/shortcuts.py): global counts and a bag of patches are at chance by the twin
construction; but one glyph's cell alone gives the label ~0.85 of the time (a glyph in the first column is
always left) and the two cells added, with no interaction, 1.0: the task measures position information,
not an interaction between A and B.

Difficulty knobs: ``glyph_size``, ``glyph_flips`` (similarity of A, B and the distractors), ``clutter``,
``distractor_types``, ``noise``, ``same_row``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import model_validator

from pipeline.sections import Geometry, NonNegInt, PosInt
from pipeline.tasks import common
from pipeline.tasks.common import SyntheticParams, TaskData

SLICE_FACTORS = ["dcol", "drow", "same_row"]


class ArrangementParams(SyntheticParams):
    glyph_size: PosInt  # must fit strictly inside a patch cell
    glyph_flips: PosInt
    distractor_types: NonNegInt  # glyph identities other than A and B, used by the clutter glyphs
    same_row: bool  # A and B always in one row

    @model_validator(mode="after")
    def _glyphs(self) -> ArrangementParams:
        if self.n % 2:
            raise ValueError(f"n: {self.n} must be even (layout-swapped twins)")
        k = 2 + self.distractor_types
        if k * self.glyph_flips > self.glyph_size**2 - 1:
            raise ValueError(f"glyph_flips: {k} glyphs x {self.glyph_flips} flips exceed the "
                             f"{self.glyph_size ** 2 - 1} flippable pixels of a {self.glyph_size} px glyph")
        if self.clutter and not self.distractor_types:
            raise ValueError("distractor_types: clutter glyphs need at least one distractor type")
        return self


def fits(params) -> list[tuple[bool, str, str]]:
    """(bad, key, why): what does not fit the geometry (checked after every section is valid)."""
    g, ar = params.geometry, params.tasks.arrangement
    p = g.patch_size
    return [(ar.glyph_size > p, "tasks.arrangement.glyph_size", f"{ar.glyph_size} px exceeds the {p} px cell"),
            (2 + ar.clutter > g.grid**2, "tasks.arrangement.clutter",
             f"2 glyphs + {ar.clutter} distractors exceed the {g.grid ** 2} patch cells")]


def generate(n: int, seed: int, geometry: Geometry, cfg: ArrangementParams) -> TaskData:
    if n % 2:
        raise ValueError(f"arrangement: n must be even (samples come in layout-swapped twins), got {n}")
    rng = common.task_rng(seed, "arrangement")
    p, g, c, gs = geometry.patch_size, geometry.grid, geometry.channels, cfg.glyph_size
    m = n // 2
    n_eval, _ = common.split_counts(n, cfg.eval_fraction)
    n_eval -= n_eval % 2
    ar = np.arange(m)
    glyphs = common.glyph_bank(rng, 2 + cfg.distractor_types, gs, cfg.glyph_flips)  # 0 = A, 1 = B, rest distractors

    row_a, col_a = rng.integers(0, g, m), rng.integers(0, g, m)
    col_b = (col_a + rng.integers(1, g, m)) % g  # any other column
    row_b = row_a if cfg.same_row else rng.integers(0, g, m)
    ca, cb = row_a * g + col_a, row_b * g + col_b
    keys = rng.random((m, g * g))
    keys[ar, ca] = keys[ar, cb] = 2.0
    dcells = np.argsort(keys, axis=1)[:, : cfg.clutter]

    ident = np.full((m, g * g), -1)  # glyph identity per cell, -1 = empty
    ident[ar, ca], ident[ar, cb] = 0, 1
    if cfg.clutter:
        ident[ar[:, None], dcells] = 2 + rng.integers(0, cfg.distractor_types, (m, cfg.clutter))

    # (m, G^2, P, P) glyph masks: each glyph at a jitter that keeps it strictly inside its cell.
    occupied = np.flatnonzero(ident >= 0)
    jit = rng.integers(0, p - gs + 1, (len(occupied), 2))
    mask = np.zeros((m * g * g, p, p), dtype=bool)
    rows = jit[:, 0, None, None] + np.arange(gs)[None, :, None]
    cols = jit[:, 1, None, None] + np.arange(gs)[None, None, :]
    mask[occupied[:, None, None], rows, cols] = glyphs[ident.reshape(-1)[occupied]]
    mask = mask.reshape(m, g * g, p, p)

    fg, bg = common.random_colours(rng, m, c)
    cells = common.paint(mask.reshape(m, g * g * p, p), fg, bg).reshape(m, g * g, p, p, c)
    cells = common.finish(cells, rng, cfg.noise)  # (m, G^2, P, P, C); the noise travels with its cell
    swapped = cells.copy()
    swapped[ar, ca], swapped[ar, cb] = cells[ar, cb], cells[ar, ca]
    both = np.stack([cells, swapped], axis=1).reshape(n, g, g, p, p, c)  # twins adjacent
    images = common.cells_to_image(both)

    label0 = (col_b < col_a).astype(np.int64)  # first twin: 0 if A is left of B
    labels = np.stack([label0, 1 - label0], axis=1).reshape(n)
    # The second twin has A at cb and B at ca.
    ra = np.stack([row_a, row_b], axis=1).reshape(n)
    cola = np.stack([col_a, col_b], axis=1).reshape(n)
    rb = np.stack([row_b, row_a], axis=1).reshape(n)
    colb = np.stack([col_b, col_a], axis=1).reshape(n)
    factors = pd.DataFrame({
        "row_a": ra, "col_a": cola, "row_b": rb, "col_b": colb,
        "dcol": np.abs(cola - colb), "drow": np.abs(ra - rb), "same_row": ra == rb,
        "pair": np.repeat(ar, 2),
        "id": True,
        "role": common.roles(n_eval, n - n_eval),
    })
    return TaskData(images, labels, factors, ["A_left", "B_left"])
