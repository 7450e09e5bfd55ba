"""The ``scale`` task's shapes as a pure table, so params validation can check them without the task module.

Shapes are integer inequalities on doubled, centred pixel coordinates ``a = 2u + 1 - s``, ``b = 2v + 1 - s``
(``u, v`` in ``0..s-1`` inside an ``s x s`` box): no floats, so every machine draws the same pixels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _third(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """-1 / 0 / +1: the first, middle or last third of the box along one doubled, centred coordinate."""
    return np.where(3 * x < -s, -1, np.where(3 * x > s, 1, 0))


def _zed(a: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The Z pentomino on a 3 x 3 grid of thirds: top-left, centre column, bottom-right."""
    r, c = _third(a, s), _third(b, s)
    return ((r == -1) & (c <= 0)) | ((r == 0) & (c == 0)) | ((r == 1) & (c >= 0))


# (a, b, s) -> inside-shape mask; a, b, s broadcast. All shapes fill their s x s bounding box's extent.
# zed and ess are mirror images: same area, same corners and bar ends one by one; turned by a random quarter
# turn (tasks.scale.rotate) no single local part tells them apart, only how the parts are arranged.
SHAPES: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "square": lambda a, b, s: np.ones(np.broadcast_shapes(a.shape, b.shape), dtype=bool),
    "frame": lambda a, b, s: (np.abs(a) == s - 1) | (np.abs(b) == s - 1),
    "triangle": lambda a, b, s: 2 * np.abs(b) <= a + s + 1,  # apex row is 1-2 px: fills its box
    "plus": lambda a, b, s: 3 * np.minimum(np.abs(a), np.abs(b)) <= s,
    "disc": lambda a, b, s: a * a + b * b <= s * s,
    "diamond": lambda a, b, s: np.abs(a) + np.abs(b) <= s,
    "zed": _zed,
    "ess": lambda a, b, s: _zed(a, -b, s),
}


def quarter_turns(a: np.ndarray, b: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Box coordinates turned by ``k`` quarter turns (broadcast): one turn maps (a, b) to (b, -a)."""
    for i in range(3):
        turn = k % 4 > i
        a, b = np.where(turn, b, a), np.where(turn, -a, b)
    return a, b


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
