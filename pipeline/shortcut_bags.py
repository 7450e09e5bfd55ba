"""Position-free shortcut features and the exact additive readout (the floor battery of pipeline/shortcuts.py).

- **bags of local patterns**: every k x k window of an image reduced to one code (binarised: foreground or not;
  quantised: grey level in ``QUANT_LEVELS`` bins; colour: each channel bright or not, so red and green differ where
  their grey levels match), counted over the image (``global``) or per image quadrant (``pooled``, 2 x 2): what a
  readout sees that knows which small patterns occur but not where, nor how they combine beyond k px. A vocabulary
  of the ``BAG_VOCAB`` commonest codes is learned on the training rows.
- **bag of patches**: k-means dictionary (MiniBatchKMeans on a capped sample of training patches) of contrast-
  normalised, ZCA-whitened k x k colour patches, triangle-coded and summed over the image or per quadrant (Coates &
  Ng 2011's recipe, whitening included: without it a referee's natural-image bag read 0.06 lower).
- **exact additive readout**: the best rule ``u(group 1) + v(group 2) > 0`` over a task's named factors,
  found by enumeration (no fitted model that could miss the optimum): a binary label's positive cells form a
  staircase under some ordering of one group's values, so every ordering of the smaller group is tried, each
  row of the other group taking its best threshold.
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from sklearn.cluster import MiniBatchKMeans

BAG_VOCAB = 1024  # commonest training codes kept per bag (the rest share one "other" bin)
QUANT_LEVELS = 3  # grey levels of a quantised pattern
FOREGROUND = 48  # grey levels from the image's median colour that count as foreground (binarised pattern)
KMEANS_ATOMS = 400  # dictionary size of the bag of patches
KMEANS_SAMPLE = 10_000  # training patches the dictionary is fitted on (caps the k-means work)
WHITEN_EPS = 0.1  # ZCA regulariser for contrast-normalised patches (each dimension's variance is about 1)
ENUMERATE_MAX = 8  # the smaller group of an exact additive readout: at most this many values (8! orders)
# Temporaries of at most this many float32 (16 MB): the allocator reuses blocks of this size, while each larger one
# is fresh pages from the kernel; blocks of 1,000 images spent 85% of the bag of patches' time in page faults.
CHUNK_FLOATS = 1 << 22


# --------------------------------------------------------------------------- bags of local patterns
def pixel_codes(images: np.ndarray, mode: str) -> tuple[np.ndarray, int]:
    """(N, H, W, C) uint8 -> ((N, H, W) int64 code of each pixel, number of codes): ``b`` binarised against the
    image's median colour, ``q`` grey quantised to ``QUANT_LEVELS``, ``c`` each channel bright (> 127) or not."""
    x = images.astype(np.int16)
    if mode == "b":
        median = np.median(x.reshape(len(x), -1, x.shape[-1]), axis=1)[:, None, None, :]
        return (np.abs(x - median).max(-1) > FOREGROUND).astype(np.int64), 2
    if mode == "q":
        return (x.mean(-1) * QUANT_LEVELS // 256).astype(np.int64), QUANT_LEVELS
    if mode == "c":
        return ((x > 127) * 2 ** np.arange(x.shape[-1])).sum(-1).astype(np.int64), 2 ** x.shape[-1]
    raise ValueError(f"pattern mode {mode!r}: expected b, q or c")


def pattern_codes(images: np.ndarray, k: int, mode: str) -> np.ndarray:
    """(N, H, W, C) uint8 -> (N, H-k+1, W-k+1) int64: each k x k window's code over its pixels' codes
    (:func:`pixel_codes`)."""
    q, levels = pixel_codes(images, mode)
    g = q.shape[1] - k + 1
    codes = np.zeros((len(q), g, g), dtype=np.int64)
    for i, (dy, dx) in enumerate(itertools.product(range(k), range(k))):  # a window's pixel i has weight levels**i
        codes += q[:, dy:dy + g, dx:dx + g] * levels**i  # (no N x g x g x k*k copy: 60,000 images fit)
    return codes


def quadrant(g: int) -> np.ndarray:
    """(g, g) -> quadrant 0..3 of each window position (by its top-left corner's half of the grid)."""
    half = (np.arange(g) >= g / 2).astype(np.int64)
    return 2 * half[:, None] + half[None, :]


def bag(codes: np.ndarray, vocab: np.ndarray, pooled: bool) -> np.ndarray:
    """(N, g, g) codes -> (N, R * (V + 1)) float32 counts of each vocabulary code (the last bin: any other),
    over the whole image (R = 1) or per quadrant (R = 4, ``pooled``)."""
    n, g, _ = codes.shape
    at = np.searchsorted(vocab, codes)
    known = (at < len(vocab)) & (vocab[np.minimum(at, len(vocab) - 1)] == codes)
    idx = np.where(known, at, len(vocab))
    size = len(vocab) + 1
    if pooled:
        idx = idx + size * quadrant(g)[None]
    bins = size * (4 if pooled else 1)
    flat = (idx.reshape(n, -1) + bins * np.arange(n)[:, None]).reshape(-1)
    return np.bincount(flat, minlength=n * bins).reshape(n, bins).astype(np.float32)


def pattern_bag(images: np.ndarray, n_fit: int, k: int, mode: str, pooled: bool) -> np.ndarray:
    """Bag of k x k local patterns (``mode``: :func:`pixel_codes`) of every image; the vocabulary is the
    ``BAG_VOCAB`` commonest codes of the first ``n_fit`` images (the training rows)."""
    codes = pattern_codes(images, k, mode)
    values, counts = np.unique(codes[:n_fit], return_counts=True)
    vocab = np.sort(values[np.argsort(-counts, kind="stable")[:BAG_VOCAB]])
    return bag(codes, vocab, pooled)


# --------------------------------------------------------------------------- bag of learned patches
def _normalised(x: np.ndarray) -> np.ndarray:
    """Patches (..., D) in [0, 1] -> contrast-normalised (mean 0, unit RMS, regularised)."""
    x = x - x.mean(-1, keepdims=True)
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + 0.01)


def patches(images: np.ndarray, k: int) -> np.ndarray:
    """(N, H, W, C) -> (N, g, g, k*k*C) float32 contrast-normalised k x k patches (stride 1)."""
    x = sliding_window_view(images.astype(np.float32) / 255.0, (k, k), axis=(1, 2))  # (N, g, g, C, k, k)
    return _normalised(x.reshape(*x.shape[:3], -1))


def patch_dictionary(images: np.ndarray, k: int, seed: int, atoms: int = KMEANS_ATOMS,
                     sample: int = KMEANS_SAMPLE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean (D,), whitening (D, D), centroids (atoms, D))``, D = k*k*C: the ZCA whitening of at most ``sample``
    contrast-normalised patches drawn from ``images`` and their k-means centroids in whitened space (only the
    drawn patches are cut out: every patch of 45,000 images would take gigabytes)."""
    n, g = len(images), images.shape[1] - k + 1
    rng = np.random.default_rng(seed)
    pick = rng.choice(n * g * g, min(sample, n * g * g), replace=False)
    i, y, x = np.unravel_index(pick, (n, g, g))
    windows = sliding_window_view(images, (k, k), axis=(1, 2))  # (N, g, g, C, k, k), a view
    p = _normalised(windows[i, y, x].reshape(len(pick), -1).astype(np.float32) / 255.0)
    mean = p.mean(0)
    values, vectors = np.linalg.eigh(np.cov(p - mean, rowvar=False))
    white = (vectors / np.sqrt(np.maximum(values, 0) + WHITEN_EPS)) @ vectors.T
    km = MiniBatchKMeans(n_clusters=min(atoms, len(p)), batch_size=2048, n_init=1, max_iter=10, random_state=seed)
    centres = km.fit((p - mean) @ white).cluster_centers_
    return mean.astype(np.float32), white.astype(np.float32), centres.astype(np.float32)


def patch_bags(images: np.ndarray, dictionary: tuple[np.ndarray, np.ndarray, np.ndarray],
               k: int) -> tuple[np.ndarray, np.ndarray]:
    """Triangle code of every whitened patch over the ``dictionary`` (:func:`patch_dictionary`: max(0, mean
    distance - distance to each atom); stronger than counting nearest atoms: natural 0.48 vs 0.39) summed over the
    image (N, atoms) and per quadrant (N, 4 * atoms): one encoding, both poolings."""
    mean, white, centres = dictionary
    out = []
    c2 = (centres**2).sum(1)
    g = images.shape[1] - k + 1  # the side of the grid of patch positions
    q = quadrant(g)
    chunk = max(1, CHUNK_FLOATS // (g * g * len(centres)))  # images per block of distances
    for start in range(0, len(images), chunk):
        p = patches(images[start: start + chunk], k)
        flat = (p.reshape(-1, p.shape[-1]) - mean) @ white
        d = np.sqrt(np.maximum((flat**2).sum(1, keepdims=True) - 2 * flat @ centres.T + c2, 0))
        z = np.maximum(d.mean(1, keepdims=True) - d, 0).reshape(len(p), g, g, -1)
        out.append(np.concatenate([z[:, q == r].sum(1) for r in range(4)], axis=1))
    pooled = np.concatenate(out).astype(np.float32)
    glob = pooled.reshape(len(pooled), 4, -1).sum(1)
    return np.sqrt(glob), np.sqrt(pooled)  # power-normalised: better conditioned for the linear read


def kmeans_bags(images: np.ndarray, n_fit: int, k: int, seed: int,
                atoms: int = KMEANS_ATOMS) -> tuple[np.ndarray, np.ndarray]:
    """Bags (global, pooled) of k x k patches over a dictionary learned on the first ``n_fit`` images (the
    training rows)."""
    return patch_bags(images, patch_dictionary(images[:n_fit], k, seed, atoms), k)


# --------------------------------------------------------------------------- exact additive readout
def staircase_fit(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, int]:
    """The best 0/1 table ``[u(r) + v(c) > 0]`` for counts ``pos``/``neg`` (R, C) of label 1 / 0 per cell:
    every ordering of the C columns, each row predicting 1 on its best prefix of that ordering. Returns the
    table (R, C) and the training rows it gets right (the exact optimum)."""
    r, c = pos.shape
    perms = np.array(list(itertools.permutations(range(c))))  # (P, C)
    p, q = pos[:, perms], neg[:, perms]  # (R, P, C)
    # right answers of row r under ordering o predicting 1 on the first t columns: cum pos + rest of neg
    zero = np.zeros((r, len(perms), 1))
    gain = np.concatenate([zero, np.cumsum(p, -1)], -1) + np.concatenate([np.cumsum(q[..., ::-1], -1)[..., ::-1],
                                                                           zero], -1)
    best_t = gain.argmax(-1)  # (R, P)
    total = gain.max(-1).sum(0)  # (P,)
    o = int(total.argmax())
    table = np.zeros((r, c), dtype=np.int64)
    for row in range(r):
        table[row, perms[o, : best_t[row, o]]] = 1
    return table, int(total[o])


def exact_additive(train: list[np.ndarray], y_train: np.ndarray, test: list[np.ndarray]) -> np.ndarray | None:
    """Predictions on ``test`` of the best additive readout of the training rows over one or two groups of
    factor values (each an (N,) array of hashable codes): one group, the majority label of each value; two
    groups and a binary label, :func:`staircase_fit`. A value unseen in training predicts the majority label.
    None where no exact search is in reach (more groups or classes, or both groups over ``ENUMERATE_MAX``)."""
    majority = int(np.bincount(y_train).argmax())
    if len(train) == 1:
        keys, inv = np.unique(train[0], return_inverse=True)
        counts = np.zeros((len(keys), int(y_train.max()) + 1))
        np.add.at(counts, (inv, y_train), 1)
        lookup = dict(zip(keys.tolist(), counts.argmax(1).tolist(), strict=True))
        return np.array([lookup.get(v, majority) for v in test[0].tolist()])
    if len(train) != 2 or y_train.max() > 1:
        return None
    (a, b), (ta, tb) = train, test
    ka, kb = np.unique(a), np.unique(b)
    if min(len(ka), len(kb)) > ENUMERATE_MAX:
        return None
    flip = len(ka) < len(kb)  # enumerate orderings of the smaller group (the columns)
    rows, cols, trows, tcols = (b, a, tb, ta) if flip else (a, b, ta, tb)
    kr, kc = (kb, ka) if flip else (ka, kb)
    ir, ic = np.searchsorted(kr, rows), np.searchsorted(kc, cols)
    pos, neg = np.zeros((len(kr), len(kc))), np.zeros((len(kr), len(kc)))
    np.add.at(pos, (ir, ic), y_train == 1)
    np.add.at(neg, (ir, ic), y_train == 0)
    table, _ = staircase_fit(pos, neg)
    jr, jc = np.searchsorted(kr, trows).clip(0, len(kr) - 1), np.searchsorted(kc, tcols).clip(0, len(kc) - 1)
    seen = (kr[jr] == trows) & (kc[jc] == tcols)
    return np.where(seen, table[jr, jc], majority)
