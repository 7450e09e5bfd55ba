"""``relation`` (long range): the label is an ordered relation between two designated marks' colours.

Every mark is a ``mark_size`` px square of a palette colour inside a 1 px frame, placed in its own patch
cell. Mark A has a white frame, mark B a mid-grey one, ``clutter`` distractor marks a dark-grey one.
Label 1 (``B_follows_A``): colour(B) = colour(A) + 1 (mod K); label 0 (``B_precedes_A``): colour(A) - 1.

Why not same/different colour: if the image's colour histogram is independent of the label, the expected
number of equal-colour mark pairs is too, and that number is [A == B] + (terms involving distractors), so
a distractor must correlate with A or B: some other pair of marks then gives the label away (a probe's
same/different task was also solvable from the histogram alone). An ordered relation has no such identity:
both classes show an unordered pair of cyclically adjacent colours {c, c + 1}. Samples come in twins that
share everything (positions, distractors, noise) except that A's and B's colours are exchanged, which flips
the label: per twin the colour histogram is identical, and each mark's colour is uniform in both classes.

The designated pair is drawn at a controlled Chebyshev distance in patch cells (uniform over the possible
distances ``1..G-1``, then uniform over the cell pairs at that distance), except a ``near_fraction`` share
of pairs drawn inside one aligned ``near_block`` x ``near_block`` block of cells (one Swin window: a model
whose windows never meet sees the relation there, and only there); marks jitter inside their cell when
``mark_size + 2 < P``. Window membership depends on the model (Swin window in px), so it is derived
at slice time by :func:`window_factors`.

Shortcuts (pipeline/shortcuts.py): global counts are exactly at chance on whole twin pairs, and so is each
mark's colour alone. A sum of per-mark contributions (no interaction) could still separate up to
``1 - 1/(2K)`` of the (A, B) colour configurations, but not under the cross-entropy loss: the data are
invariant to rotating the palette, so the loss-optimal additive readout is constant (chance). Measured
floor at n = 4000: 0.53.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from pipeline.sections import Geometry, NonNegInt, PosInt
from pipeline.tasks.common import PALETTE, SyntheticParams, TaskData, roles, split_counts, task_rng

SLICE_FACTORS = ["distance_tokens", "window", "shifted_window"]


class RelationParams(SyntheticParams):
    num_colours: Annotated[int, Field(ge=3, le=8)]  # K; the relation is colour(B) = colour(A) +- 1 mod K
    mark_size: PosInt  # px of colour inside a 1 px frame: a mark is mark_size + 2 px wide
    clutter: NonNegInt  # distractor marks (dark-grey frames, random colours)
    # share of twin pairs whose two marks lie in one aligned near_block x near_block block of patch cells
    # (one Swin window: checked against models.swin); the rest at a uniform distance as before
    near_fraction: Annotated[float, Field(ge=0, le=1)]
    near_block: Annotated[int, Field(ge=2)]  # patch cells per block side

    @model_validator(mode="after")
    def _even(self) -> RelationParams:
        if self.n % 2:
            raise ValueError(f"n: {self.n} must be even (label-swapped twins)")
        return self


def fits(params) -> list[tuple[bool, str, str]]:
    """(bad, key, why): what does not fit the geometry (checked after every section is valid)."""
    g, r = params.geometry, params.tasks.relation
    p, h = g.patch_size, g.image_size
    return [(r.mark_size + 2 > p, "tasks.relation.mark_size",
             f"{r.mark_size} px + a 1 px frame on each side does not fit a {p} px patch cell"),
            (r.near_fraction > 0 and g.grid % r.near_block > 0, "tasks.relation.near_block",
             f"{r.near_block} cells do not divide the {g.grid} x {g.grid} cell grid"),
            (2 + r.clutter > g.grid**2, "tasks.relation.clutter",
             f"2 marks + {r.clutter} distractors exceed the {g.grid ** 2} patch cells"),
            (g.grid < 2, "geometry.image_size", f"relation/arrangement need at least 2x2 patch cells, got {h}/{p}")]


def check_windows(params) -> None:
    """A 'near' pair lies in one Swin window (after the models' own checks: a bad window is reported as such)."""
    g, r, s = params.geometry, params.tasks.relation, params.models.swin
    window_px = s.patch_size * s.window_size
    if r.near_fraction and r.near_block * g.patch_size != window_px:
        fix = (f"set it to {window_px // g.patch_size} (or near_fraction to 0)"
               if window_px % g.patch_size == 0 and window_px // g.patch_size >= 2
               else f"set near_fraction to 0 (a {window_px} px window holds no block of 2 x 2 cells)")
        raise ValueError(
            f"tasks.relation.near_block: {r.near_block} cells of {g.patch_size} px are not one Swin window "
            f"({s.window_size} x {s.patch_size} px), so 'near' would not mean 'in one window': {fix}"
        )


FRAME_A, FRAME_B, FRAME_DISTRACTOR = 255, 128, 64  # grey levels, identical in every class


def chebyshev(a: np.ndarray, b: np.ndarray, grid: int) -> np.ndarray:
    """Chebyshev distance in cells between cell indices a and b (row * grid + column)."""
    return np.maximum(np.abs(a // grid - b // grid), np.abs(a % grid - b % grid))


def cell_pairs(grid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All ordered pairs of distinct cells (i, j) in a grid x grid layout, sorted by Chebyshev distance.

    Returns (i, j, distance), each (G^2 (G^2 - 1),) int64; cell index = row * G + column.
    """
    i, j = np.meshgrid(np.arange(grid * grid), np.arange(grid * grid), indexing="ij")
    i, j = i[i != j], j[i != j]
    dist = chebyshev(i, j, grid)
    order = np.argsort(dist, kind="stable")
    return i[order], j[order], dist[order]


def near_pairs(grid: int, block: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n ordered pairs of distinct cells inside one aligned block x block block of a grid x grid layout,
    uniform over blocks and over the ordered pairs in a block. Returns (a, b), each (n,) cell indices."""
    per_side, k = grid // block, block * block
    which = rng.integers(0, per_side * per_side, n)
    a = rng.integers(0, k, n)
    b = (a + 1 + rng.integers(0, k - 1, n)) % k  # any other cell of the block

    def cell(i: np.ndarray) -> np.ndarray:
        return ((which // per_side) * block + i // block) * grid + (which % per_side) * block + i % block

    return cell(a), cell(b)


def _paint(has: np.ndarray, frame: np.ndarray, content: np.ndarray, jit: np.ndarray, p: int, g: int, mark: int,
           noise: int, rng: np.random.Generator) -> np.ndarray:
    """Twin-pair images (n, H, W, 3), twins adjacent: each marked cell gets a frame ring of its ``frame`` grey
    and a core of its ``content`` colour (per twin), at its jitter ``jit`` (m, G^2, 2)."""
    m = has.shape[0]
    u = np.arange(p)[None, None, :, None] - jit[..., 0, None, None]
    v = np.arange(p)[None, None, None, :] - jit[..., 1, None, None]
    inside = has[..., None, None] & (u >= 0) & (u < mark) & (v >= 0) & (v < mark)
    ring = inside & ((u == 0) | (u == mark - 1) | (v == 0) | (v == mark - 1))
    core = inside & ~ring
    # ring and core are disjoint 0/1 masks on a black background, so a sum of products paints exactly;
    # per channel on whole planes (numpy is slow on a 3-long innermost axis), channels moved last once.
    ring_px = ring.view(np.uint8) * frame[..., None, None]  # (m, G^2, P, P)
    cells = np.empty((2, m, 3, g * g, p, p), dtype=np.uint8)
    for c in range(3):
        np.multiply(core.view(np.uint8)[None], content[..., c, None, None], out=cells[:, :, c])
        cells[:, :, c] += ring_px[None]
    if noise:  # one noise field per twin pair: the twins differ only in A's and B's colours
        field = rng.integers(-noise, noise + 1, cells.shape[1:], dtype=np.int16)[None]
        cells = np.clip(cells + field, 0, 255).astype(np.uint8)
    # (2, m, C, G, G, P, P) -> (m, 2, G, P, G, P, C) = (n, H, W, C), twins adjacent
    return cells.reshape(2, m, 3, g, g, p, p).transpose(1, 0, 3, 5, 4, 6, 2).reshape(2 * m, g * p, g * p, 3)


def generate(n: int, seed: int, geometry: Geometry, cfg: RelationParams) -> TaskData:
    if n % 2:
        raise ValueError(f"relation: n must be even (samples come in label-swapped twins), got {n}")
    rng = task_rng(seed, "relation")
    p, g, k = geometry.patch_size, geometry.grid, cfg.num_colours
    mark = cfg.mark_size + 2
    m = n // 2  # twin pairs
    n_eval, n_fit = split_counts(n, cfg.eval_fraction)
    n_eval -= n_eval % 2  # keep both twins in one role
    n_fit = n - n_eval
    ar = np.arange(m)

    # Designated cells at a controlled distance: a distance uniformly, then a pair at that distance.
    pi, pj, pd_ = cell_pairs(g)
    dvals, starts, counts = np.unique(pd_, return_index=True, return_counts=True)
    pick = rng.integers(0, len(dvals), m)
    chosen = starts[pick] + rng.integers(0, counts[pick])
    ca, cb = pi[chosen], pj[chosen]
    if cfg.near_fraction:  # some pairs inside one block (no extra draws at 0: the same pool as before)
        near = rng.random(m) < cfg.near_fraction
        na, nb = near_pairs(g, cfg.near_block, int(near.sum()), rng)
        ca[near], cb[near] = na, nb
    dist = chebyshev(ca, cb, g)
    keys = rng.random((m, g * g))
    keys[ar, ca] = keys[ar, cb] = 2.0  # never pick the designated cells for distractors
    dcells = np.argsort(keys, axis=1)[:, : cfg.clutter]  # (m, clutter)

    x = rng.integers(0, k, m)  # colour of A in the first twin; B gets x + 1
    has = np.zeros((m, g * g), dtype=bool)
    frame = np.zeros((m, g * g), dtype=np.uint8)
    content = np.zeros((2, m, g * g, 3), dtype=np.uint8)  # [twin]
    has[ar, ca] = has[ar, cb] = True
    has[ar[:, None], dcells] = True
    frame[ar, ca], frame[ar, cb] = FRAME_A, FRAME_B
    frame[ar[:, None], dcells] = FRAME_DISTRACTOR
    content[:, ar[:, None], dcells] = PALETTE[rng.integers(0, k, (m, cfg.clutter))]
    content[0, ar, ca], content[0, ar, cb] = PALETTE[x], PALETTE[(x + 1) % k]
    content[1, ar, ca], content[1, ar, cb] = PALETTE[(x + 1) % k], PALETTE[x]

    # Pixels of every cell (m, G^2, P, P): frame ring and core of an M x M mark at its jitter.
    jit = rng.integers(0, p - mark + 1, (m, g * g, 2))
    images = _paint(has, frame, content, jit, p, g, mark, cfg.noise, rng)

    ya, xa = (ca // g) * p + jit[ar, ca, 0], (ca % g) * p + jit[ar, ca, 1]
    yb, xb = (cb // g) * p + jit[ar, cb, 0], (cb % g) * p + jit[ar, cb, 1]
    twin = _per_sample
    labels = np.tile(np.array([1, 0], dtype=np.int64), m)
    colour_a = np.stack([x, (x + 1) % k], axis=1).reshape(n)
    colour_b = np.stack([(x + 1) % k, x], axis=1).reshape(n)
    factors = pd.DataFrame({
        "distance_tokens": twin(dist),
        "distance_px": np.round(np.hypot(twin(ya - yb), twin(xa - xb)), 3),
        "ya": twin(ya), "xa": twin(xa), "yb": twin(yb), "xb": twin(xb),
        "mark_px": mark,
        "colour_a": colour_a, "colour_b": colour_b,
        "pair": twin(ar),
        "id": True,
        "role": roles(n_eval, n_fit),
    })
    return TaskData(images, labels, factors, ["B_precedes_A", "B_follows_A"])


def _per_sample(a: np.ndarray) -> np.ndarray:
    """(m,) per twin pair -> (2m,) per sample."""
    return np.repeat(a, 2)


def window_factors(factors: pd.DataFrame, window_px: int, image_size: int) -> pd.DataFrame:
    """Whether both marks lie inside one attention window, plain and shifted (Swin's cyclic shift by w/2).

    factors: the relation factors (ya, xa, yb, xb, mark_px); window_px = swin patch_size * window_size (the
    first stage's window in pixels). A pixel p is in window ((p - shift) mod H) // w, as after Swin's
    ``roll(-shift)``. Returns columns ``window`` and ``shifted_window``, each ``"same"`` or ``"cross"``.
    """
    out = {}
    last = factors["mark_px"].to_numpy() - 1
    for name, shift in (("window", 0), ("shifted_window", window_px // 2)):
        def wid(px: pd.Series, shift: int = shift) -> np.ndarray:
            return ((px.to_numpy() - shift) % image_size) // window_px

        same = np.ones(len(factors), dtype=bool)
        for ya, yb in (("ya", "yb"), ("xa", "xb")):
            ids = [wid(factors[ya]), wid(factors[ya] + last), wid(factors[yb]), wid(factors[yb] + last)]
            same &= (ids[0] == ids[1]) & (ids[0] == ids[2]) & (ids[0] == ids[3])
        out[name] = np.where(same, "same", "cross")
    return pd.DataFrame(out, index=factors.index)
