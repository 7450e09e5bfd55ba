"""Reachability: after how many layers can one token depend on two given input pixels?

Measured, not assumed. Each layer of a real timm model (random weights, float64, eval mode) is probed by
autograd: for every output token ``t`` one backward pass of ``<r_t, y_t>`` (random ``r_t``) gives
``d y_t / d x``; an input token ``s`` is a dependency of ``t`` where that gradient is non-zero. This yields
a boolean connectivity matrix ``D_l`` (``(N_out, N_in)``) per layer. Composing them,
``R_l = D_l ... D_1 D_0`` (boolean products) says which input pixels each layer-``l`` token can see, and two
pixels ``a, b`` *meet* at the first ``l`` where some token sees both (``R_l^T R_l``): the earliest layer at
which any function of the pair, e.g. a same/different relation, is representable.

Layer 0 is the embedding (patch projection + position and prefix tokens, or the ResNet stem); layer
``k >= 1`` is the output of the ``k``-th block (a Swin patch merging is folded into the block after it).
Pixels meeting at layer 0 share a patch (or a stem kernel): a *linear* meeting; any relation needs a block.

"Non-zero" is relative: timm's Swin masks with -100 before the softmax, so a masked pair still carries an
``e^-100 ~ 4e-44`` weight. Entries below ``rel_tol`` times the layer's largest entry are zero; the gap
between the largest dropped and the smallest kept entry is reported so that the cut is seen to be clean.
ReLU and max-pool zero some gradients at a given input, so the dependency is the union over ``probes``
random inputs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from pipeline.families import family_of_model
from pipeline.families.common import Layer

UNREACHABLE = -1


def _tokens(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``(B, ...)`` -> ``(B, N, C)`` with tokens row-major over the spatial grid."""
    if layout == "nchw":
        return t.flatten(2).transpose(1, 2)
    if layout == "nhwc":
        return t.flatten(1, 2)
    return t


def layer_chain(model: nn.Module, image_size: int) -> list[Layer]:
    """The token graph of ``model``, as its family (:mod:`pipeline.families`) defines it."""
    return family_of_model(model).chain(model, image_size)


@dataclass(frozen=True)
class Dependency:
    """Measured connectivity of one layer and how cleanly it separates zero from non-zero."""

    matrix: np.ndarray  # (N_out, N_in) bool
    smallest_kept: float  # relative to the layer's largest |dy/dx| entry
    largest_dropped: float  # 0.0 when no entry was below the cut


def token_dependency(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, layout_in: str,
                     layout_out: str, rel_tol: float = 1e-20, seed: int = 0) -> Dependency:
    """Which input tokens each output token of ``fn`` depends on, at the ``B`` probe inputs ``x``.

    ``x``: ``(B, ...)`` in ``layout_in``; the examples are independent (eval mode), so one backward pass
    per output token serves all of them, and the result is the union over the batch.
    """
    x = x.detach().clone().requires_grad_(True)
    y = _tokens(fn(x), layout_out)  # (B, N_out, C_out)
    gen = torch.Generator().manual_seed(seed)
    n_out, n_in = y.shape[1], _tokens(x, layout_in).shape[1]
    jac = torch.zeros(n_out, n_in, dtype=torch.float64)
    for t in range(n_out):
        r = torch.randn(y.shape[0], y.shape[2], generator=gen, dtype=y.dtype)
        (g,) = torch.autograd.grad(y[:, t], x, r, retain_graph=True, allow_unused=True)
        if g is not None:  # None: no input reaches this token (a class token at the embedding)
            jac[t] = _tokens(g, layout_in).abs().amax(dim=(0, 2))
    scale = float(jac.max()) or 1.0
    rel = jac / scale
    keep = rel > rel_tol
    dropped = rel[~keep & (rel > 0)]
    return Dependency(keep.numpy(), float(rel[keep].min()) if keep.any() else 0.0,
                      float(dropped.max()) if dropped.numel() else 0.0)


def measure_chain(chain: list[Layer], images: torch.Tensor, rel_tol: float = 1e-20, seed: int = 0
                  ) -> list[Dependency]:
    """Measure every layer of ``chain`` at its real input: ``images`` ``(B, C, H, W)`` propagated forward."""
    deps, x = [], images
    for i, layer in enumerate(chain):
        deps.append(token_dependency(layer.fn, x, layer.layout_in, layer.layout_out, rel_tol, seed + i))
        with torch.no_grad():
            x = layer.fn(x)
    return deps


def meet_layers(deps: list[np.ndarray]) -> np.ndarray:
    """``(n_pix, n_pix)`` int: first layer at which some token depends on both pixels, else UNREACHABLE.

    ``deps[0]`` is ``(N_0, n_pix)`` (embedding from pixels), ``deps[l]`` is ``(N_l, N_{l-1})``.
    """
    # 0/1 counts in float64 are exact (far below 2**53) and go through BLAS; numpy's integer matmul does not
    # (at 32 px, 1024 pixels, it took minutes per study)
    reach = deps[0].astype(np.float64)
    meet = np.full((reach.shape[1], reach.shape[1]), UNREACHABLE, dtype=np.int64)
    for layer, dep in enumerate(deps):
        if layer:
            reach = ((dep.astype(np.float64) @ reach) > 0).astype(np.float64)  # (N_l, n_pix)
        both = (reach.T @ reach) > 0
        meet[(meet == UNREACHABLE) & both] = layer
    return meet


def offset_table(meet: np.ndarray, side: int) -> pd.DataFrame:
    """Best and worst meeting layer over all pixel pairs at each offset ``(|dy|, |dx|)`` on a square image.

    Columns: dy, dx, chebyshev, pairs, best, worst (UNREACHABLE if any pair never meets), reachable
    (fraction of pairs that meet within the depth).
    """
    yy, xx = np.divmod(np.arange(side * side), side)
    dy = np.abs(yy[:, None] - yy[None, :])
    dx = np.abs(xx[:, None] - xx[None, :])
    frame = pd.DataFrame({"dy": dy.ravel(), "dx": dx.ravel(), "meet": meet.ravel()})
    return _aggregate(frame, ["dy", "dx"]).assign(chebyshev=lambda d: np.maximum(d.dy, d.dx))


def distance_table(offsets: pd.DataFrame) -> pd.DataFrame:
    """Collapse :func:`offset_table` to the Chebyshev distance ``max(|dy|, |dx|)`` (window-aligned metric)."""
    rows = []
    for dist, grp in offsets.groupby("chebyshev", sort=True):
        reachable = (grp.reachable * grp.pairs).sum() / grp.pairs.sum()
        best = grp.best[grp.best != UNREACHABLE]
        rows.append({"chebyshev": dist, "pairs": int(grp.pairs.sum()),
                     "best": int(best.min()) if len(best) else UNREACHABLE,
                     "worst": UNREACHABLE if (grp.worst == UNREACHABLE).any() else int(grp.worst.max()),
                     "reachable": float(reachable)})
    return pd.DataFrame(rows)


def _aggregate(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    ok = frame.meet != UNREACHABLE
    g = frame.assign(ok=ok, best=frame.meet.where(ok), worst=frame.meet.where(ok)).groupby(keys, sort=True)
    out = g.agg(pairs=("meet", "size"), best=("best", "min"), worst=("worst", "max"), reachable=("ok", "mean"))
    out["best"] = out.best.fillna(UNREACHABLE).astype(int)
    out["worst"] = out.worst.fillna(UNREACHABLE).astype(int).where(out.reachable == 1.0, UNREACHABLE)
    return out.reset_index()


def generic_weights(model: nn.Module, std: float = 0.02, seed: int = 0) -> nn.Module:
    """A float64 eval-mode copy with every parameter jittered by ``N(0, std^2)``.

    Why: an initialisation can hide structure. timm zero-initialises the last BatchNorm scale of every
    ResNet block, so each block is an exact identity at init and its Jacobian shows no spatial mixing;
    the connectivity this module is after is that of generic weights.
    """
    model = copy.deepcopy(model).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(std * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def reachability(model: nn.Module, image_size: int, channels: int, probes: int = 2, seed: int = 0,
                 rel_tol: float = 1e-20) -> tuple[list[Layer], list[Dependency], np.ndarray]:
    """Measure a model's token graph (generic float64 weights) at ``probes`` random images.

    Returns the layer chain, each layer's measured dependency, and :func:`meet_layers`.
    """
    model = generic_weights(model, seed=seed)
    chain = layer_chain(model, image_size)
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(probes, channels, image_size, image_size, generator=gen, dtype=torch.float64)
    if probes == 1:  # torch's eval-mode BatchNorm backward after a convolution on a one-image batch leaks
        images = images.repeat(2, 1, 1, 1)  # gradient across positions (seen on ConvMixer): same image twice
    deps = measure_chain(chain, images, rel_tol, seed)
    return chain, deps, meet_layers([d.matrix for d in deps])

