"""Null space of a linear patch embedding, collision pairs, and patchify == convolution.

Convention: a patch of ``P x P`` pixels and ``C`` channels is the vector of ``D = C*P*P`` values in
(channel, row, column) order, the order in which timm's ``PatchEmbed.proj`` (a ``Conv2d``) stores its
weight ``(d, C, P, P)``; flattening that weight gives the ``(d, D)`` matrix ``W`` with
``token = W @ patch + b``. Any ``v`` with ``W v = 0`` can be added to a patch without changing its token:
``rank(W) <= min(d, D)``, so ``nullity = D - rank >= max(0, D - d)``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pandas as pd
import torch
from timm.layers import PatchEmbed
from torch import nn


def make_patch_embed(patch_size: int, channels: int, width: int, seed: int,
                     image_size: int | None = None) -> PatchEmbed:
    """A timm ``PatchEmbed`` (random init, seeded, float64) for ``image_size`` images (default: one patch)."""
    torch.manual_seed(seed)
    return PatchEmbed(img_size=image_size or patch_size, patch_size=patch_size, in_chans=channels,
                      embed_dim=width).double()


def flat_weight(embed: PatchEmbed) -> torch.Tensor:
    """The projection as a matrix: ``(d, D)``, columns in (channel, row, column) order."""
    return embed.proj.weight.detach().flatten(1)


def cut_patches(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut ``(B, C, H, W)`` images into ``(B, N, D)`` patch vectors, ``N = (H/P)(W/P)`` row-major."""
    b, c, h, w = x.shape
    p = patch_size
    x = x.reshape(b, c, h // p, p, w // p, p)  # (B, C, gh, P, gw, P)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)


def nullity(weight: torch.Tensor) -> dict[str, int]:
    """Rank, nullity and the lower bound ``max(0, D - d)`` of a ``(d, D)`` projection (float64 SVD rank)."""
    d, big_d = weight.shape
    rank = int(torch.linalg.matrix_rank(weight.double()))
    return {"d": d, "D": big_d, "rank": rank, "nullity": big_d - rank, "bound": max(0, big_d - d)}


def nullity_table(widths: list[int], patch_size: int, channels: int, seed: int) -> pd.DataFrame:
    """One row per embedding width ``d``, measured on a real randomly initialised timm ``PatchEmbed``."""
    rows = [nullity(flat_weight(make_patch_embed(patch_size, channels, d, seed))) for d in widths]
    return pd.DataFrame(rows, columns=["d", "D", "rank", "nullity", "bound"])


def weakest_direction(weight: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Unit ``v`` (``(D,)``) minimising ``||W v||``, and that minimum (exactly 0 when ``d < D``).

    The last right-singular vector of the full SVD: for ``d < D`` it lies in the null space.
    """
    d, big_d = weight.shape
    _, s, vh = torch.linalg.svd(weight.double(), full_matrices=True)
    sigma = float(s[-1]) if d >= big_d else 0.0
    return vh[-1], sigma


def perturb_patch(x: torch.Tensor, patch_size: int, direction: torch.Tensor, patch_index: int = 0
                  ) -> tuple[torch.Tensor, float]:
    """Add ``alpha * direction`` to one patch of ``x`` (``(1, C, H, W)`` in [0, 1]).

    ``alpha`` is the largest step that keeps every pixel of the patch inside [0, 1], so the second image
    is as different as a plausible image can be along ``direction``. Returns ``(x2, alpha)``.
    """
    _, c, h, w = x.shape
    p, gw = patch_size, w // patch_size
    r, q = divmod(patch_index, gw)
    window = (slice(None), slice(None), slice(r * p, (r + 1) * p), slice(q * p, (q + 1) * p))
    patch = x[window].reshape(-1)
    v = direction.to(x.dtype)
    # headroom along +v for each pixel: up to 1 where v > 0, down to 0 where v < 0
    room = torch.where(v > 0, (1 - patch) / v, torch.where(v < 0, patch / -v, torch.full_like(v, torch.inf)))
    alpha = float(room.min())
    x2 = x.clone()
    x2[window] = (patch + alpha * v).reshape(1, c, p, p)
    return x2, alpha


@dataclass(frozen=True)
class Collision:
    """Two images that differ in one patch, and how much the module's outputs differ."""

    d: int
    D: int
    nullity: int
    sigma_min: float  # min ||W v|| over unit v: 0 means an exact collision direction exists
    alpha: float
    input_max_diff: float  # max |x2 - x| over pixels
    pixel_min: float  # range of the perturbed image (stays inside [0, 1])
    pixel_max: float
    output_max_diff_f64: float
    output_max_diff_f32: float
    output_scale: float  # max |f(x)|, so the differences can be read relatively


def collision(module: nn.Module, embed: PatchEmbed, x: torch.Tensor, patch_size: int,
              patch_index: int = 0) -> Collision:
    """Build the pair from ``embed``'s weakest direction and compare ``module`` on both images.

    ``module`` is the patch embedding itself or a whole model that starts with it (e.g. a timm ViT);
    ``x``: ``(1, C, H, W)`` float64 in [0, 1]. Evaluated in float64 (exactness) and in a float32 copy.
    """
    weight = flat_weight(embed)
    stats = nullity(weight)
    v, sigma = weakest_direction(weight)
    x2, alpha = perturb_patch(x.double(), patch_size, v, patch_index)
    m64 = copy.deepcopy(module).double().eval()
    m32 = copy.deepcopy(module).float().eval()
    with torch.no_grad():
        y64, y64b = m64(x.double()), m64(x2)
        y32, y32b = m32(x.float()), m32(x2.float())
    return Collision(
        d=stats["d"], D=stats["D"], nullity=stats["nullity"], sigma_min=sigma, alpha=alpha,
        input_max_diff=float((x2 - x).abs().max()), pixel_min=float(x2.min()), pixel_max=float(x2.max()),
        output_max_diff_f64=float((y64 - y64b).abs().max()),
        output_max_diff_f32=float((y32 - y32b).abs().max()),
        output_scale=float(y64.abs().max()),
    )


def patchify_vs_conv(embed: PatchEmbed, x: torch.Tensor) -> float:
    """Max |cut-and-project - timm's stride-P convolution| on ``x`` (``(B, C, H, W)``), in float64.

    Cut-and-project: ``cut_patches(x) @ W.T + b``; timm: ``embed(x)`` = ``Conv2d(kernel=P, stride=P)``
    then flatten to ``(B, N, d)`` tokens. The two are the same linear map, so the result is rounding only.
    """
    embed = copy.deepcopy(embed).double()
    p = embed.patch_size[0]
    with torch.no_grad():
        cut = cut_patches(x.double(), p) @ flat_weight(embed).T + embed.proj.bias
        conv = embed(x.double())
    return float((cut - conv).abs().max())
