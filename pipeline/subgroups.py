"""Pre-specified subgroups of a natural-image test set: each controlled factor becomes a slice.

Declared in ``params.yaml`` (``evaluation.subgroups``) before any run, evaluated on every model alike:

- **alignment**: the test image translated by (dy, dx) px, each in 0..P-1 (P = ``geometry.patch_size``),
  content moving down/right against the fixed patch grid; the vacated border is filled by ``border``
  (``edge``: replicate the last row/column; ``constant``: black; ``wrap``: cyclic). Reported: accuracy,
  and *consistency* = share of predictions equal to those on the untranslated copy (offset 0,0).
- **arrangement**: whole P x P patches permuted, one seeded random permutation per image
  (``shuffle_seed``); the multiset of patches is unchanged. Reported: accuracy, and the share of
  predictions unchanged against the original.
- **scale**: zoomed around the image centre by each factor in ``zoom`` (< 1 out, > 1 in), bilinear
  sampling at pixel centres, outside pixels by ``border``, rounded half up. Factor 1 is the identity.
- **class**: accuracy per true class on the original images (consistency undefined: null).

Everything is a pure function of uint8 ``(N, H, W, C)`` arrays; ``predict`` is the caller's model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from pipeline.config import Params
from pipeline.tasks.common import cells_to_image, image_to_cells, task_rng

Predict = Callable[[np.ndarray], np.ndarray]  # uint8 (N, H, W, C) -> logits (N, K)


# --------------------------------------------------------------------------- transforms
def _fold(idx: np.ndarray, n: int, border: str) -> tuple[np.ndarray, np.ndarray]:
    """Integer source indices -> (indices inside 0..n-1, valid mask) under the border policy."""
    if border == "edge":
        return np.clip(idx, 0, n - 1), np.ones(idx.shape, bool)
    if border == "wrap":
        return np.mod(idx, n), np.ones(idx.shape, bool)
    if border == "constant":
        return np.clip(idx, 0, n - 1), (idx >= 0) & (idx < n)
    raise ValueError(f"border: unknown policy {border!r} (edge | constant | wrap)")


def _sample(images: np.ndarray, ys: np.ndarray, xs: np.ndarray, border: str) -> np.ndarray:
    """Bilinear read of uint8 (N, H, W, C) at float source rows ``ys`` (H',) and columns ``xs`` (W',).

    Integer coordinates read pixels exactly (zero weight on the neighbour); the result is rounded half up.
    """
    _, h, w, _ = images.shape
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    fy, fx = (ys - y0)[None, :, None, None], (xs - x0)[None, None, :, None]
    out = np.zeros((images.shape[0], len(ys), len(xs), images.shape[3]))
    for dy, wy in ((0, 1 - fy), (1, fy)):
        rows, vr = _fold(y0 + dy, h, border)
        for dx, wx in ((0, 1 - fx), (1, fx)):
            cols, vc = _fold(x0 + dx, w, border)
            valid = (vr[:, None] & vc[None, :])[None, :, :, None]
            out += wy * wx * np.where(valid, images[:, rows][:, :, cols], 0)
    return np.floor(out + 0.5).clip(0, 255).astype(np.uint8)


def translate(images: np.ndarray, dy: int, dx: int, border: str) -> np.ndarray:
    """Content moved ``dy`` px down and ``dx`` px right (uint8 N, H, W, C); the border filled by policy."""
    _, h, w, _ = images.shape
    return _sample(images, np.arange(h, dtype=float) - dy, np.arange(w, dtype=float) - dx, border)


def zoom(images: np.ndarray, factor: float, border: str) -> np.ndarray:
    """Zoom around the centre: output pixel centre u reads source ``(u - c) / factor + c`` (c = centre)."""
    _, h, w, _ = images.shape

    def coords(n: int) -> np.ndarray:
        return (np.arange(n) + 0.5 - n / 2) / factor + n / 2 - 0.5

    return _sample(images, coords(h), coords(w), border)


def shuffle_patches(images: np.ndarray, patch: int, seed: int) -> np.ndarray:
    """Whole ``patch`` x ``patch`` cells permuted, one seeded permutation per image (uint8 N, H, W, C)."""
    cells = image_to_cells(images, patch)  # (N, G, G, P, P, C)
    n, g = cells.shape[:2]
    rng = task_rng(seed, "subgroups.arrangement")
    order = np.argsort(rng.random((n, g * g)), axis=1)  # (N, G*G): a uniform random permutation per row
    flat = cells.reshape(n, g * g, *cells.shape[3:])
    return cells_to_image(flat[np.arange(n)[:, None], order].reshape(cells.shape))


# --------------------------------------------------------------------------- evaluation
def _score(pred: np.ndarray, labels: np.ndarray, reference: np.ndarray | None) -> dict:
    return {"acc": float((pred == labels).mean()),
            "consistency": None if reference is None else float((pred == reference).mean()),
            "n": int(len(labels))}


def per_class(pred: np.ndarray, labels: np.ndarray, class_names: Sequence[str]) -> dict[str, dict]:
    """Accuracy per true class (classes absent from ``labels`` are left out)."""
    return {class_names[c]: _score(pred[labels == c], labels[labels == c], None)
            for c in np.unique(labels)}


def evaluate_subgroups(predict: Predict, images: np.ndarray, labels: np.ndarray, params: Params,
                       class_names: Sequence[str] | None = None) -> dict[str, dict[str, dict]]:
    """``{subgroup: {condition: {acc, consistency, n}}}`` for alignment, arrangement, scale and class.

    images uint8 (N, H, W, C) at the training size, labels int (N,). Conditions: alignment ``"dy,dx"``;
    arrangement ``original``/``shuffled``; scale ``"x<factor>"``; class the class names (or label numbers).
    """
    cfg, p = params.evaluation.subgroups, params.geometry.patch_size
    labels = np.asarray(labels)

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(predict(x)).argmax(axis=1)

    base = run(images)
    out: dict[str, dict[str, dict]] = {"alignment": {}, "arrangement": {}, "scale": {}}
    for dy in range(p):
        for dx in range(p):
            moved = base if dy == dx == 0 else run(translate(images, dy, dx, cfg.border))
            out["alignment"][f"{dy},{dx}"] = _score(moved, labels, base)
    out["arrangement"] = {"original": _score(base, labels, base),
                          "shuffled": _score(run(shuffle_patches(images, p, cfg.shuffle_seed)), labels, base)}
    for f in cfg.zoom:  # factor 1 reads every pixel exactly: the original images, already predicted
        out["scale"][f"x{f:g}"] = _score(base if f == 1 else run(zoom(images, f, cfg.border)), labels, base)
    names = list(class_names) if class_names is not None else [str(c) for c in range(int(labels.max()) + 1)]
    out["class"] = per_class(base, labels, names)
    return out
