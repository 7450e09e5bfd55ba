"""The ``scale`` task's shapes as a pure table, so params validation can check them without the task module.

Shapes are integer inequalities on doubled, centred pixel coordinates ``a = 2u + 1 - s``, ``b = 2v + 1 - s``
(``u, v`` in ``0..s-1`` inside an ``s x s`` box): no floats, so every machine draws the same pixels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

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
