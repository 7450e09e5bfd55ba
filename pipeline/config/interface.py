"""``interface``: the level-1 checks (null space, permutations, attention pair counts, reachability)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from pipeline.sections import Count, PosFloat, PosInt, Section


class PairCounts(Section):
    image_size: PosInt
    patch_sizes: list[PosInt]
    window: PosInt
    extra_image_sizes: list[PosInt]  # at extra_patch_size
    extra_patch_size: PosInt

    @model_validator(mode="after")
    def _grids(self) -> PairCounts:
        if not self.patch_sizes:
            raise ValueError("patch_sizes: must list at least one patch size")
        for p in self.patch_sizes:
            if self.image_size % p:
                raise ValueError(f"patch_sizes: {p} does not divide image_size {self.image_size}")
        for h in self.extra_image_sizes:
            if h % self.extra_patch_size:
                raise ValueError(f"extra_image_sizes: {h} is not a multiple of extra_patch_size "
                                 f"{self.extra_patch_size}")
        return self


class Interface(Section):
    patch_size: PosInt  # P of the null-space study: D = P * P * channels
    widths: list[PosInt]  # embedding widths d
    collision_width: PosInt  # d < D for the collision pair (and a full-width control at d >= D)
    embed_dim: PosInt  # width of the attention/ViT modules in the permutation checks
    num_heads: PosInt
    small_tokens: Annotated[int, Field(gt=1, le=7)]  # every permutation (n! of them)
    large_tokens: PosInt
    random_permutations: Annotated[int, Field(gt=0, le=10_000)]  # one forward pass each
    atol: PosFloat  # float32 tolerance for "equal"
    exact_tol: PosFloat  # float64 tolerance for "equal" (the exact identities)
    image_size: PosInt  # images of the whole-ViT collision and permutation checks
    depth: Count  # blocks of those whole ViTs
    probes: PosInt  # reachability: random inputs whose Jacobian sparsity is united (ReLU gates)
    jacobian_cut: Annotated[float, Field(gt=0, lt=1)]  # |dy/dx| below cut * max counts as 0
    pair_counts: PairCounts

    @model_validator(mode="after")
    def _heads(self) -> Interface:
        if self.embed_dim % self.num_heads:
            raise ValueError(f"num_heads: {self.num_heads} does not divide embed_dim {self.embed_dim}")
        if self.collision_width % self.num_heads:
            raise ValueError(
                f"collision_width: {self.collision_width} is not divisible by num_heads {self.num_heads}"
            )
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size: {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if not self.widths:
            raise ValueError("widths: must list at least one embedding width")
        return self
