"""Collisions on trained weights: what a trained patch projection cannot see, checked on real test images.

A ViT's first layer maps each P x P x C patch (D numbers) linearly to d < D numbers, so a (D - d)-dimensional
null space of pixel patterns is invisible to everything after it. The interface stage shows this on fresh
modules; here it is checked on the weights the training stages kept:

- add to every patch of a test image a random pattern from the trained projection's null space: the trained
  ViT's logits must not move (float64: to ``interface.exact_tol``), however large the pixel change;
- the same pixel change must move a trained ResNet's logits (its first convolution overlaps patches and sees
  every direction), and its share of changed predictions is reported;
- how much of the class signal lies in that null space: the share of the per-position class-mean patch
  differences (test images) that the projection discards, beside the share a random subspace of the same
  dimension would take, (D - d) / D.

Pure functions of models and arrays; :mod:`pipeline.stages.report` loads the weights.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import torch

from pipeline.predict import to_tensor

RANK_RTOL = 1e-10  # singular values below this fraction of the largest count as zero


def patchify_projection(model: torch.nn.Module, patch: int) -> torch.Tensor | None:
    """The (d, C, P, P) weight of a plain non-overlapping patch projection, else None (conv stems, overlap)."""
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    if not isinstance(proj, torch.nn.Conv2d) or proj.kernel_size != (patch, patch) or proj.stride != (patch, patch):
        return None
    return proj.weight.detach()


def null_basis(weight: torch.Tensor) -> torch.Tensor:
    """(D, D - rank) float64 orthonormal basis of the kernel of the flattened projection (d, C*P*P)."""
    w = weight.double().reshape(weight.shape[0], -1)
    _, s, vh = torch.linalg.svd(w, full_matrices=True)
    rank = int((s > s.max() * RANK_RTOL).sum())
    return vh[rank:].T.contiguous()


def to_patches(x: torch.Tensor, patch: int) -> torch.Tensor:
    """(N, C, H, W) -> (N, T, C*P*P), each patch flattened in the projection's (C, P, P) order."""
    n, c, h, w = x.shape
    g, k = h // patch, w // patch
    return x.reshape(n, c, g, patch, k, patch).permute(0, 2, 4, 1, 3, 5).reshape(n, g * k, c * patch * patch)


def from_patches(p: torch.Tensor, shape: tuple[int, ...], patch: int) -> torch.Tensor:
    """Inverse of :func:`to_patches`."""
    n, c, h, w = shape
    g, k = h // patch, w // patch
    return p.reshape(n, g, k, c, patch, patch).permute(0, 3, 1, 4, 2, 5).reshape(n, c, h, w)


def null_perturbation(shape: tuple[int, ...], basis: torch.Tensor, patch: int, seed: int) -> torch.Tensor:
    """A random null-space pattern in every patch, float64, scaled to unit RMS per pixel (one normalised unit:
    64 grey levels): far from a small change, yet invisible to the projection."""
    n, c, h, w = shape
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, (h // patch) * (w // patch), basis.shape[1], generator=gen, dtype=torch.float64)
    v = z @ basis.T
    v = v / v.pow(2).mean(-1, keepdim=True).sqrt()
    return from_patches(v, shape, patch)


@torch.no_grad()
def _logit_change(model: torch.nn.Module, x: torch.Tensor, delta: torch.Tensor,
                  dtype: torch.dtype) -> tuple[float, float]:
    """(largest |logit change|, share of predictions changed) when ``delta`` is added, computed in ``dtype``."""
    net = copy.deepcopy(model).to(dtype).eval()
    a, b = net(x.to(dtype)).double(), net((x + delta).to(dtype)).double()
    return float((a - b).abs().max()), float((a.argmax(-1) != b.argmax(-1)).double().mean())


def collision_check(vit: torch.nn.Module, other: torch.nn.Module, images: np.ndarray, patch: int, seed: int,
                    basis: torch.Tensor) -> dict:
    """Logit changes of a trained ViT and another trained model when ``images`` get a null-space pattern
    (``basis``: :func:`null_basis` of the ViT's projection) in every patch (float64, and float32 for the ViT)."""
    x = to_tensor(images).double()
    delta = null_perturbation(tuple(x.shape), basis, patch, seed)
    out = {"D": int(basis.shape[0]), "null_dim": int(basis.shape[1]),
           "pixel_rms_grey_levels": float(delta.pow(2).mean().sqrt() * 64.0)}
    out["vit_max_diff_f64"], out["vit_flips"] = _logit_change(vit, x, delta, torch.float64)
    out["vit_max_diff_f32"] = _logit_change(vit, x, delta, torch.float32)[0]
    out["other_max_diff_f64"], out["other_flips"] = _logit_change(other, x, delta, torch.float64)
    return out


def discriminative_share(images: np.ndarray, labels: np.ndarray, basis: torch.Tensor, patch: int) -> float:
    """Share of the class signal that the projection discards: ||M B||^2 / ||M||^2 for M the per-position
    class-mean patches minus the per-position mean (class-balanced), B the null-space basis."""
    p = to_patches(to_tensor(images).double(), patch)  # (N, T, D)
    y = torch.as_tensor(labels)
    means = torch.stack([p[y == c].mean(0) for c in torch.unique(y)])  # (K, T, D)
    m = (means - means.mean(0, keepdim=True)).reshape(-1, p.shape[-1])
    total = float(m.pow(2).sum())
    return float((m @ basis).pow(2).sum()) / total if total > 0 else float("nan")


def collision_table(pairs: list[dict], seed: int) -> pd.DataFrame:
    """One row per (task, seed): ``pairs`` items hold task, seed, vit, other (models), other_arch, images,
    labels and patch (the task's patch px). Columns: the :func:`collision_check` numbers, ``share_discarded`` and
    ``share_random``."""
    rows = []
    for p in pairs:
        patch = p["patch"]
        weight = patchify_projection(p["vit"], patch)
        if weight is None:
            raise ValueError(f"{p['task']} seed {p['seed']}: the ViT has no plain patchify projection")
        basis = null_basis(weight)
        check = collision_check(p["vit"], p["other"], p["images"], patch, seed, basis)
        rows.append({"task": p["task"], "seed": p["seed"], "other_arch": p["other_arch"], **check,
                     "share_discarded": discriminative_share(p["images"], p["labels"], basis, patch),
                     "share_random": check["null_dim"] / check["D"]})
    return pd.DataFrame(rows)
