"""Candidate query-key pairs: the analytic count, and the same count read off timm's Swin masks.

A *candidate pair* is an ordered (query, key) pair of real tokens whose attention weight the layer can
make non-zero. Global attention: every pair, ``N^2``. Windowed attention (``w x w`` windows tiling an
``G x G`` grid, ``N = G^2``): each query sees its window, ``N * min(N, w^2)``. A *shifted* window keeps the
same ``N * w^2`` computed entries, but timm masks (with -100 before the softmax, i.e. a weight of
``e^-100``) the pairs that the cyclic roll brought together from opposite borders; the unmasked pairs are
fewer. Along one axis the rolled grid splits into ``G/w - 1`` whole windows and one window holding two
segments of ``w - s`` and ``s`` tokens, so ``unmasked_1d = (G/w - 1) w^2 + (w - s)^2 + s^2`` and, because
a pair is unmasked iff it is unmasked along both axes, ``unmasked = unmasked_1d^2``.
"""

from __future__ import annotations

import pandas as pd
from timm.models.swin_transformer import SwinTransformerBlock

from pipeline.families.swin import window_connectivity


def global_pairs(n_tokens: int) -> int:
    return n_tokens * n_tokens


def window_pairs(n_tokens: int, window: int) -> int:
    """``N * min(N, w^2)``: computed pairs of (non-shifted) windowed attention."""
    return n_tokens * min(n_tokens, window * window)


def shifted_unmasked_pairs(grid: int, window: int, shift: int) -> int:
    """Unmasked pairs of a shifted-window layer on a ``grid x grid`` token map (``grid % window == 0``)."""
    if window >= grid or shift == 0:
        return window_pairs(grid * grid, window)
    one_axis = (grid // window - 1) * window**2 + (window - shift) ** 2 + shift**2
    return one_axis**2


def pair_count_table(image_size: int, patch_sizes: list[int], window: int, extra_image_sizes: list[int],
                     extra_patch_size: int) -> pd.DataFrame:
    """Analytic counts for ``image_size`` at every patch size, plus ``extra_image_sizes`` at one patch size."""
    configs = [(image_size, p) for p in patch_sizes] + [(h, extra_patch_size) for h in extra_image_sizes]
    rows = []
    for h, p in configs:
        grid = h // p
        n = grid * grid
        rows.append({
            "image_size": h, "patch_size": p, "grid": grid, "tokens": n, "window": window,
            "global_pairs": global_pairs(n), "window_pairs": window_pairs(n, window),
            "ratio": global_pairs(n) / window_pairs(n, window),
            "tiles": grid % window == 0 or window >= grid,  # the formula assumes windows tile the grid
        })
    return pd.DataFrame(rows)


def make_swin_block(grid: int, window: int, shifted: bool, dim: int = 4, num_heads: int = 1
                    ) -> SwinTransformerBlock:
    """A timm Swin block on a ``grid x grid`` token map (timm shrinks the window / drops the shift itself)."""
    return SwinTransformerBlock(dim=dim, input_resolution=(grid, grid), num_heads=num_heads,
                                window_size=window, shift_size=window // 2 if shifted else 0)


def timm_pair_counts(block: SwinTransformerBlock) -> dict[str, int]:
    """``computed``: attention entries evaluated (padding included); ``unmasked``: real-token pairs allowed."""
    wh, ww = block.window_size
    h, w = block.input_resolution
    n_windows = -(-h // wh) * -(-w // ww)
    return {"computed": n_windows * (wh * ww) ** 2, "unmasked": int(window_connectivity(block).sum()),
            "window_used": wh, "shift_used": block.shift_size[0]}


def timm_pair_table(table: pd.DataFrame) -> pd.DataFrame:
    """Add timm's counts (unshifted and shifted blocks) to each row of :func:`pair_count_table`."""
    rows = []
    for r in table.itertuples():
        plain = timm_pair_counts(make_swin_block(r.grid, r.window, shifted=False))
        shifted = timm_pair_counts(make_swin_block(r.grid, r.window, shifted=True))
        formula_shift = (shifted_unmasked_pairs(r.grid, shifted["window_used"], shifted["shift_used"])
                         if r.tiles else None)
        rows.append({
            "timm_window": plain["window_used"], "timm_computed": plain["computed"],
            "timm_unmasked": plain["unmasked"], "timm_shift": shifted["shift_used"],
            "timm_shifted_computed": shifted["computed"], "timm_shifted_unmasked": shifted["unmasked"],
            "shifted_unmasked_formula": formula_shift,
        })
    return pd.concat([table.reset_index(drop=True), pd.DataFrame(rows)], axis=1)
