"""Permutation equivariance of content-only attention, and how an absolute position signal breaks it.

Tokens are ``X`` of shape ``(1, N, d)``; a permutation ``perm`` (a sequence of N indices) acts as
``(P X)[i] = X[perm[i]]``. For a content-only token mixer ``f`` (timm ``Attention``, a ViT ``Block``):
``f(P X) = P f(X)`` and a mean-pooled readout is invariant. With an un-permuted absolute position signal
``E`` the identity fails, ``f(P X + E) != P f(X + E)``, and permuting content and positions together,
``f(P (X + E)) = P f(X + E)``, restores it. Every defect is relative: ``||a - b|| / ||b||``.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Sequence

import pandas as pd
import torch
from timm.models.vision_transformer import VisionTransformer

Perm = tuple[int, ...]


def all_permutations(n: int) -> list[Perm]:
    """All ``n!`` permutations of ``range(n)`` (identity first)."""
    return list(itertools.permutations(range(n)))


def random_permutations(n: int, k: int, seed: int) -> list[Perm]:
    """``k`` seeded random permutations of ``range(n)``."""
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randperm(n, generator=gen).tolist()) for _ in range(k)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def token_defects(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, pos: torch.Tensor,
                  perm: Perm) -> dict[str, float]:
    """The four relative defects of ``f`` (``(1, N, d) -> (1, N, d)``) under one permutation.

    ``equivariance``: f(PX) vs P f(X); ``mean_pool``: mean_i f(PX) vs mean_i f(X);
    ``position_break``: f(PX + E) vs P f(X + E) (large unless ``perm`` is the identity);
    ``joint``: f(P(X + E)) vs P f(X + E). ``pos`` is ``E``, ``(1, N, d)``.
    """
    p = torch.as_tensor(perm)
    with torch.no_grad():
        fx, fxe = f(x), f(x + pos)
        f_px = f(x[:, p])
        return {
            "equivariance": _rel(f_px, fx[:, p]),
            "mean_pool": _rel(f_px.mean(1), fx.mean(1)),
            "position_break": _rel(f(x[:, p] + pos), fxe[:, p]),
            "joint": _rel(f((x + pos)[:, p]), fxe[:, p]),
        }


def defect_table(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, pos: torch.Tensor,
                 perms: Iterable[Perm]) -> pd.DataFrame:
    """One row per permutation: ``perm`` (as text), ``identity`` flag and the four defects."""
    rows = []
    for perm in perms:
        identity = tuple(perm) == tuple(range(len(perm)))
        rows.append({"perm": " ".join(map(str, perm)), "identity": identity,
                     **token_defects(f, x, pos, perm)})
    return pd.DataFrame(rows)


def permute_image_patches(x: torch.Tensor, patch_size: int, perm: Sequence[int]) -> torch.Tensor:
    """Rearrange the ``P x P`` patches of ``(B, C, H, W)`` images so patch ``i`` of the result is patch
    ``perm[i]`` of ``x`` (row-major patch order: the token order of timm's ``PatchEmbed``)."""
    b, c, h, w = x.shape
    p, gh, gw = patch_size, h // patch_size, w // patch_size
    patches = x.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c, p, p)
    patches = patches[:, torch.as_tensor(perm)]
    return patches.reshape(b, gh, gw, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def with_permuted_positions(model: VisionTransformer, perm: Sequence[int]) -> VisionTransformer:
    """A copy of ``model`` whose patch position embeddings follow the content: row ``i`` <- row ``perm[i]``.

    Prefix tokens (class/distillation) keep their embedding when ``pos_embed`` covers them.
    """
    model = copy.deepcopy(model)
    if model.pos_embed is None:
        return model
    start = 0 if model.no_embed_class else model.num_prefix_tokens
    idx = torch.cat([torch.arange(start), start + torch.as_tensor(perm)])
    with torch.no_grad():
        model.pos_embed.copy_(model.pos_embed[:, idx])
    return model


def vit_defects(model: VisionTransformer, x: torch.Tensor, patch_size: int, perm: Perm) -> dict[str, float]:
    """Relative logit change of a whole timm ViT when the image's patches are permuted.

    ``logits``: model(P x) vs model(x): 0 without position embedding (pooled readout over permuted
    tokens, or a class token that sees them all alike), large with one. ``joint``: the same with the
    position embedding permuted along (see :func:`with_permuted_positions`): 0 again.
    """
    model = model.eval()
    xp = permute_image_patches(x, patch_size, perm)
    with torch.no_grad():
        ref = model(x)
        return {"logits": _rel(model(xp), ref),
                "joint": _rel(with_permuted_positions(model, perm).eval()(xp), ref)}
