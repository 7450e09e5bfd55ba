"""``scale``: class = shape; its size runs from below one patch to several patches.

Shapes are integer inequalities on doubled, centred pixel coordinates ``a = 2u + 1 - s``, ``b = 2v + 1 - s``
(``u, v`` in ``0..s-1`` inside an ``s x s`` box, so ``a, b`` are odd/even symmetric around 0): no floats, so
every machine draws the same pixels. ``fit`` rows draw sizes from ``train_sizes``; ``eval`` rows from
``min_size..max_size`` (``id`` = size inside the training range), so unseen sizes are tested.

Factors: size (px), size_rel (size / P), size_bin (``sub``: s < P, ``patch``: P <= s < 2P, ``multi``:
s >= 2P), x/y (top-left), straddles (the box crosses a patch boundary in x or y).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from pipeline.config import Geometry, ScaleParams
from pipeline.tasks.common import (
    TaskData,
    balanced_labels,
    finish,
    paint,
    random_colours,
    roles,
    scatter_pixels,
    split_counts,
    task_rng,
)

SLICE_FACTORS = ["size", "size_bin", "straddles"]

# (a, b, s) -> inside-shape mask; a, b, s broadcast. All shapes fill their s x s bounding box's extent.
SHAPES: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "square": lambda a, b, s: np.ones(np.broadcast_shapes(a.shape, b.shape), dtype=bool),
    "frame": lambda a, b, s: (np.abs(a) == s - 1) | (np.abs(b) == s - 1),
    "triangle": lambda a, b, s: 2 * np.abs(b) <= a + s + 1,  # apex row is 1-2 px: fills its box
    "plus": lambda a, b, s: 3 * np.minimum(np.abs(a), np.abs(b)) <= s,
    "disc": lambda a, b, s: a * a + b * b <= s * s,
    "diamond": lambda a, b, s: np.abs(a) + np.abs(b) <= s,
}


def shape_mask(name: str, size: int) -> np.ndarray:
    """One shape drawn in its own (size, size) box, bool."""
    u = np.arange(size)
    a, b = 2 * u[:, None] + 1 - size, 2 * u[None, :] + 1 - size
    return SHAPES[name](a, b, np.int64(size))


def coinciding_shapes(shapes: list[str], min_size: int, max_size: int) -> str | None:
    """A message if two of ``shapes`` draw the same pixels at some size (that class would be void), else None.

    Used by the params validator (``tasks.scale.min_size``): tiny boxes leave too few pixels to tell
    some shapes apart (a 3 px disc is a plus).
    """
    for s in range(min_size, max_size + 1):
        drawn = [shape_mask(name, s).tobytes() for name in shapes]
        same = [name for name, d in zip(shapes, drawn, strict=True) if drawn.count(d) > 1]
        if same:
            return f"shapes {same} are identical at {s} px"
    return None


def generate(n: int, seed: int, geometry: Geometry, cfg: ScaleParams) -> TaskData:
    rng = task_rng(seed, "scale")
    p, h, k = geometry.patch_size, geometry.image_size, len(cfg.shapes)
    n_eval, n_fit = split_counts(n, cfg.eval_fraction)
    labels = np.concatenate([balanced_labels(rng, n_eval, k), balanced_labels(rng, n_fit, k)])
    lo, hi = cfg.train_sizes
    size = np.concatenate([rng.integers(cfg.min_size, cfg.max_size + 1, n_eval),
                           rng.integers(lo, hi + 1, n_fit)])
    y0 = rng.integers(0, h - size + 1)
    x0 = rng.integers(0, h - size + 1)

    # (N, H, W) box-local coordinates, then doubled and centred; int32 keeps squares exact.
    s3 = size[:, None, None].astype(np.int32)
    u = np.arange(h, dtype=np.int32)[None, :, None] - y0[:, None, None].astype(np.int32)
    v = np.arange(h, dtype=np.int32)[None, None, :] - x0[:, None, None].astype(np.int32)
    inside = (u >= 0) & (u < s3) & (v >= 0) & (v < s3)
    a, b = 2 * u + 1 - s3, 2 * v + 1 - s3
    mask = np.zeros((n, h, h), dtype=bool)
    for c, name in enumerate(cfg.shapes):  # a loop over K classes, each step vectorised over its samples
        sel = labels == c
        mask[sel] = inside[sel] & SHAPES[name](a[sel], b[sel], s3[sel])

    fg, bg = random_colours(rng, n, geometry.channels)
    images = paint(mask, fg, bg)
    scatter_pixels(images, rng, cfg.clutter, fg)
    images = finish(images, rng, cfg.noise)

    straddles = (y0 // p != (y0 + size - 1) // p) | (x0 // p != (x0 + size - 1) // p)
    factors = pd.DataFrame({
        "size": size,
        "size_rel": size / p,
        "size_bin": np.where(size < p, "sub", np.where(size < 2 * p, "patch", "multi")),
        "x": x0, "y": y0,
        "straddles": straddles,
        "id": (size >= lo) & (size <= hi),
        "role": roles(n_eval, n_fit),
    })
    return TaskData(images, labels, factors, list(cfg.shapes))
