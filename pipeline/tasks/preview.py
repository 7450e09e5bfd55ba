"""A sample grid per task: a few examples per class across the task's main factor, patch grid drawn in."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.tasks.common import TaskData


def pick_examples(labels: np.ndarray, factors: pd.DataFrame, factor: str, num_classes: int,
                  per_class: int) -> np.ndarray:
    """(K, per_class) row indices: per class, one sample per distinct ``factor`` value (sorted), topped up
    with further samples when a class has fewer values than columns. Deterministic (first occurrences)."""
    out = np.zeros((num_classes, per_class), dtype=np.int64)
    for c in range(num_classes):
        rows = factors.index[labels == c]
        col = factors.loc[rows, factor]
        firsts = col.drop_duplicates().sort_values(kind="stable").index
        rest = rows.difference(firsts)
        out[c] = np.concatenate([firsts[:per_class], rest[: max(0, per_class - len(firsts))]])[:per_class]
    return out


def montage(images: np.ndarray, patch: int, scale: int, gap: int = 2) -> np.ndarray:
    """(R, K, H, W, C) uint8 -> one (R*(H*s+gap), K*(W*s+gap), C) uint8 picture: nearest-neighbour
    upscaling by ``scale``, patch boundaries lightened by a third toward white, white gaps between tiles."""
    r, k, h, w, c = images.shape
    big = images.repeat(scale, axis=2).repeat(scale, axis=3).astype(np.int16)  # (R, K, Hs, Ws, C)
    lines = (np.arange(h * scale) % (patch * scale) == 0)
    big[:, :, lines] = (2 * big[:, :, lines] + 255) // 3
    big[:, :, :, lines] = (2 * big[:, :, :, lines] + 255) // 3
    big = np.pad(big, ((0, 0), (0, 0), (0, gap), (0, gap), (0, 0)), constant_values=255)
    return big.transpose(0, 2, 1, 3, 4).reshape(r * (h * scale + gap), k * (w * scale + gap), c).astype(np.uint8)


def sample_grid(data: TaskData, factor: str, patch: int, title: str, per_class: int = 8, scale: int = 6):
    """A matplotlib Figure: rows = classes, columns = examples, each labelled ``factor=value``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(data.class_names)
    idx = pick_examples(data.labels, data.factors, factor, k, per_class)
    pic = montage(data.images[idx], patch, scale)
    h = data.images.shape[1] * scale + 2
    fig, ax = plt.subplots(figsize=(pic.shape[1] / 60, pic.shape[0] / 60 + 0.6))
    ax.imshow(pic.squeeze(-1) if pic.shape[-1] == 1 else pic, interpolation="nearest", cmap="gray")
    ax.set_yticks((np.arange(k) + 0.5) * h, data.class_names, fontsize=7)
    ax.set_xticks([])
    for r in range(k):
        for j in range(per_class):
            value = data.factors[factor].iloc[idx[r, j]]
            ax.text(j * h + 1, r * h + 1, f"{factor}={value}", fontsize=4.5, va="top", color="white",
                    bbox={"facecolor": "black", "alpha": 0.5, "pad": 0.5, "linewidth": 0})
    ax.set_title(title, fontsize=8)
    return fig
