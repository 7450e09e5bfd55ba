"""What every task shares: the :class:`TaskData` container and small vectorised drawing helpers.

Conventions (all tasks):
- images are ``uint8`` arrays ``(N, H, W, C)``, channels last, built with integer arithmetic only, so one seed
  gives identical bytes on every machine (no float rounding in the pixel path);
- randomness comes from ``numpy.random.Generator(PCG64)`` seeded by ``(seed, task id)``, so tasks draw
  independent streams from the one global seed;
- ``factors`` has one row per sample; the columns ``role`` and ``id`` are shared by every task:
  ``role`` is ``"fit"`` (a training/validation candidate), ``"eval"`` (reserved for the test split) or
  ``"transfer"`` (a distillation transfer set outside the training range, where a task draws one), and
  ``id`` says whether the sample lies inside the training distribution (a task with a train range draws its
  ``fit`` rows inside it and its ``eval`` rows over the full range, so ``id`` is False only on eval rows).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import pandas as pd
from pydantic import Field

from pipeline.sections import NonNegInt, PosInt, TaskSection


class SyntheticParams(TaskSection):
    """What every controlled task shares: its pool and the generic difficulty knobs."""

    n: PosInt  # pool size: fit rows (train + val) and eval rows (test)
    eval_fraction: Annotated[float, Field(gt=0, lt=1)]  # share of the pool reserved for the test split
    noise: Annotated[int, Field(ge=0, le=255)]  # uniform integer noise in [-noise, noise] per pixel
    clutter: NonNegInt  # distractors: random pixels (alignment, scale), marks/glyphs (relation, arrangement)


class PairsParams(SyntheticParams):
    """A task that can draw the pairs object (:func:`paint_pairs`): its dots' size and palette."""

    dot: Annotated[int, Field(ge=1)] = 1  # pairs: px side of each dot
    colours: Annotated[int, Field(ge=2, le=8)] = 4  # pairs: the dots' two colours come from this many
    # pairs: px kept free of dots at each edge. A k x k window can sit only inside the image, so it records the
    # distance to the edge of a dot nearer than k - 1 px, and a colour's two dots share it (the border leak,
    # docs/design.md §2): a margin of k - 1 hides it from windows up to k px.
    margin: NonNegInt = 0

    def check_box(self, key: str, side: int) -> None:
        """Refuse a box whose side (params key ``key``) leaves no gap between two dots of one of its sides."""
        if side <= 2 * self.dot:
            raise ValueError(f"{key}: {side} px leaves no gap between two {self.dot} px dots (need more than "
                             f"{2 * self.dot})")


PAIRS = ["rows", "columns"]  # the pairs' classes: which way each colour's two dots lie
DARK = 64  # the pairs' background: each channel uniform below this (the palette's colours are bright)


# Content colours of the marks and dots (distinct hues, none of them grey, so none equals a grey frame).
PALETTE = np.array([[230, 25, 75], [60, 180, 75], [0, 130, 200], [255, 225, 25],
                    [245, 130, 48], [145, 30, 180], [70, 240, 240], [240, 50, 230]], dtype=np.uint8)

ROLE_FIT, ROLE_EVAL = "fit", "eval"
# Transfer rows (alignment's ``transfer_n``): at factor values no fit row has, never trained on with their labels;
# distillation students with ``transfer: true`` see them with a teacher's targets only.
ROLE_TRANSFER = "transfer"


@dataclass(frozen=True)
class TaskData:
    """One generated (or imported) task pool.

    images: uint8 (N, H, W, C); labels: int64 (N,) in 0..K-1; factors: DataFrame with N rows (always the
    columns ``role`` and ``id``); class_names: K names, index = label.
    """

    images: np.ndarray
    labels: np.ndarray
    factors: pd.DataFrame
    class_names: list[str]

    def __post_init__(self) -> None:
        n = len(self.labels)
        if self.images.dtype != np.uint8 or self.images.ndim != 4 or len(self.images) != n:
            raise ValueError(f"images: expected uint8 (N={n}, H, W, C), got {self.images.dtype} "
                             f"{self.images.shape}")
        if self.labels.dtype != np.int64 or len(self.factors) != n:
            raise ValueError(f"labels/factors: expected int64 ({n},) and {n} rows, got {self.labels.dtype} "
                             f"and {len(self.factors)} rows")
        if not {"role", "id"} <= set(self.factors.columns):
            raise ValueError("factors: the columns 'role' and 'id' are required")


def task_rng(seed: int, task: str) -> np.random.Generator:
    """An independent PCG64 stream per (seed, task); crc32 keeps the task id stable across runs and machines."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(task.encode())])))


def split_counts(n: int, eval_fraction: float) -> tuple[int, int]:
    """(n_eval, n_fit): the first n_eval samples of a pool are eval rows, the rest fit rows."""
    n_eval = int(round(n * eval_fraction))
    return n_eval, n - n_eval


def balanced_labels(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """(n,) int64 labels with every class count within one of n / k, in random order."""
    return rng.permutation(np.arange(n, dtype=np.int64) % k)


def roles(n_eval: int, n_fit: int) -> np.ndarray:
    return np.array([ROLE_EVAL] * n_eval + [ROLE_FIT] * n_fit, dtype=object)


def glyph_bank(rng: np.random.Generator, k: int, size: int, flips: int) -> np.ndarray:
    """k distinct binary glyphs (k, size, size) at a controlled similarity, all with the same pixel count.

    Each glyph is one shared random base with its own ``flips`` pixels inverted; the flipped sets are
    disjoint, so any two glyphs differ in exactly ``2 * flips`` pixels (the similarity knob). Every glyph
    turns ``ceil(flips / 2)`` base pixels off and ``flips // 2`` on, so all glyphs have equal area: a pixel
    count (foreground area) cannot tell them apart (it did before: the alignment task's area floor was 0.50
    with 4 classes). Pixel (0, 0) is always on and never flipped, so a glyph's bounding box starts at its
    origin (tests read the offset back from the pixels). Needs ``k * flips <= size * size - 1``.
    """
    rest = size * size - 1  # pixels other than the origin
    turn_off = flips - flips // 2
    n_on = k * turn_off + int(rng.integers(0, rest - k * flips + 1))  # base pixels on besides the origin
    order = 1 + rng.permutation(rest)
    on_px, off_px = order[:n_on], order[n_on:]
    base = np.zeros(size * size, dtype=bool)
    base[0] = True
    base[on_px] = True
    chosen = np.concatenate([on_px[: k * turn_off].reshape(k, turn_off),
                             off_px[: k * (flips // 2)].reshape(k, flips // 2)], axis=1)
    masks = np.zeros((k, size * size), dtype=bool)
    masks[np.arange(k)[:, None], chosen] = True
    return (base[None] ^ masks).reshape(k, size, size)


def random_colours(rng: np.random.Generator, n: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-image (foreground, background) uint8 colours (n, C) with a guaranteed contrast.

    Each foreground channel is the background shifted by 128 +- 64 (mod 256), so every channel differs
    by at least 64 grey levels: colour varies freely, yet the object never vanishes.
    """
    bg = rng.integers(0, 256, (n, channels), dtype=np.int16)
    fg = (bg + 128 + rng.integers(-64, 65, (n, channels), dtype=np.int16)) % 256
    return fg.astype(np.uint8), bg.astype(np.uint8)


def paint(mask: np.ndarray, fg: np.ndarray, bg: np.ndarray) -> np.ndarray:
    """mask (N, H, W) bool, fg/bg (N, C) uint8 -> uint8 images (N, H, W, C).

    ``bg + mask * (fg - bg)`` in wrapping uint8 arithmetic is exact (mod 256). It runs per channel on
    whole (N, H, W) planes and transposes once: numpy is slow on a 3-long innermost axis (3x here).
    """
    delta = fg - bg  # uint8, wraps
    out = np.empty((mask.shape[0], fg.shape[1], *mask.shape[1:]), dtype=np.uint8)  # (N, C, H, W)
    m = mask.view(np.uint8)
    for c in range(fg.shape[1]):
        np.multiply(m, delta[:, c, None, None], out=out[:, c])
        out[:, c] += bg[:, c, None, None]
    return np.ascontiguousarray(np.moveaxis(out, 1, -1))


def scatter_pixels(images: np.ndarray, rng: np.random.Generator, k: int, colour: np.ndarray) -> None:
    """Clutter: set k random pixels per image (N, H, W, C) to that image's ``colour`` (N, C), in place."""
    if k == 0:
        return
    n, h, w, _ = images.shape
    ys = rng.integers(0, h, (n, k))
    xs = rng.integers(0, w, (n, k))
    images[np.arange(n)[:, None], ys, xs] = colour[:, None, :]


def paint_pairs(rng: np.random.Generator, labels: np.ndarray, size: np.ndarray, y0: np.ndarray, x0: np.ndarray,
                h: int, channels: int, cfg: PairsParams) -> np.ndarray:
    """The pairs object: four ``dot`` px dots at the corners of a ``size`` px box with its top-left corner at
    (y0, x0), on a dark background; one colour on the top row (label 0, ``rows``) or the left column (label 1,
    ``columns``), another on the other two, two distinct colours of the palette's first ``colours``. Both
    classes show the same dots at the same places in the same colours: only how the colours pair up differs.
    Returns uint8 (N, h, h, channels), clutter and noise added."""
    n, d = len(labels), cfg.dot
    s3 = size[:, None, None].astype(np.int32)
    u = np.arange(h, dtype=np.int32)[None, :, None] - y0[:, None, None].astype(np.int32)
    v = np.arange(h, dtype=np.int32)[None, None, :] - x0[:, None, None].astype(np.int32)
    top, left = (u >= 0) & (u < d), (v >= 0) & (v < d)
    dot = (top | ((u >= s3 - d) & (u < s3))) & (left | ((v >= s3 - d) & (v < s3)))
    first = np.where(labels[:, None, None] == 0, top, left)  # the top row or the left column
    a = rng.integers(0, cfg.colours, n)
    b = (a + rng.integers(1, cfg.colours, n)) % cfg.colours  # any other palette colour
    palette = PALETTE[:, :channels] if channels == 3 else PALETTE.mean(1, keepdims=True).astype(np.uint8)
    bg = rng.integers(0, DARK, (n, channels), dtype=np.uint8)
    images = np.where((dot & first)[..., None], palette[a][:, None, None],
                      np.where(dot[..., None], palette[b][:, None, None], bg[:, None, None]))
    scatter_pixels(images, rng, cfg.clutter, palette[a])
    return finish(images, rng, cfg.noise)


def finish(images: np.ndarray, rng: np.random.Generator, noise: int) -> np.ndarray:
    """Add uniform integer noise in [-noise, noise] to every pixel of uint8 (N, H, W, C), clipped."""
    if not noise:
        return images
    noisy = images.astype(np.int16) + rng.integers(-noise, noise + 1, images.shape, dtype=np.int16)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def stamp(mask: np.ndarray, glyphs: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> None:
    """OR glyphs (N, g, g) into mask (N, H, W) with top-left corners (ys, xs) (N,), in place, no loop."""
    n, g, _ = glyphs.shape
    rows = ys[:, None, None] + np.arange(g)[None, :, None]  # (N, g, 1)
    cols = xs[:, None, None] + np.arange(g)[None, None, :]  # (N, 1, g)
    idx = np.arange(n)[:, None, None]
    mask[idx, rows, cols] |= glyphs


def pair_labels(a: np.ndarray, b: np.ndarray) -> pd.Series:
    """Two integer factor columns (N,) -> one categorical label ``"a,b"`` per sample (e.g. an offset)."""
    return pd.Series(a).astype(str) + "," + pd.Series(b).astype(str)


def cells_to_image(cells: np.ndarray) -> np.ndarray:
    """(N, G, G, P, P, C) patch cells -> (N, G*P, G*P, C) images (cell [r, c] = patch row r, column c)."""
    n, g, _, p, _, c = cells.shape
    return cells.transpose(0, 1, 3, 2, 4, 5).reshape(n, g * p, g * p, c)


def image_to_cells(images: np.ndarray, p: int) -> np.ndarray:
    """(N, H, W, C) -> (N, H/P, W/P, P, P, C): the ViT's patches, as the arrangement/relation tasks build them."""
    n, h, w, c = images.shape
    return images.reshape(n, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
