"""The ConvMixer family: timm's ``ConvMixer``, a patchify stem and a convolutional body.

Disjoint P x P patches (the ViT's projection, here a stride-P convolution), then per block a residual
depthwise ``kernel`` x ``kernel`` convolution (local spatial mixing) and a pointwise one (channel mixing),
each followed by GELU and BatchNorm. Against ``vit`` it keeps the patch projection and replaces global
attention with a local, translation-equivariant body; against ``resnet`` it keeps a convolutional body but
starts from patches instead of pixels. It reads ``models.vit`` (depth); ``kernel`` is its option.
"""

from __future__ import annotations

import numpy as np
from timm.models.convmixer import ConvMixer
from torch import nn

from pipeline.config import Params
from pipeline.families.common import Family, Layer, linear, no_position_table, patch_membership

STEP_COST = {"convmixer": 1.2}  # seconds per optimizer step against vit's (the study of 492dbde)
PLOT_COLOUR = {"convmixer": "#661100"}
# The tests' own rule: one token per P x P patch.
EXPECTED_TOKENS = lambda params, **options: (params.geometry.image_size // params.geometry.patch_size) ** 2  # noqa: E731


def build(params: Params, num_classes: int, width: int, kernel: int = 3) -> nn.Module:
    g = params.geometry
    return ConvMixer(dim=width, depth=params.models.vit.depth, kernel_size=kernel, patch_size=g.patch_size,
                     in_chans=g.channels, num_classes=num_classes)


def flops(params: Params, width: int, num_classes: int, kernel: int = 3, **_: object) -> int:
    """Patch projection; per block a depthwise k x k (k^2 multiply-adds per output) and a pointwise convolution."""
    g = params.geometry
    n = g.grid**2
    block = linear(n, kernel * kernel, width) + linear(n, width, width)
    return (linear(n, g.patch_size**2 * g.channels, width) + params.models.vit.depth * block
            + linear(1, width, num_classes))


def _neighbourhood(grid: int, kernel: int) -> np.ndarray:
    """``(N, N)``: a 'same'-padded k x k convolution reads the tokens within k // 2 in each direction."""
    yy, xx = np.divmod(np.arange(grid * grid), grid)
    r = kernel // 2
    return (np.abs(yy[:, None] - yy[None, :]) <= r) & (np.abs(xx[:, None] - xx[None, :]) <= r)


def chain(model: ConvMixer, image_size: int) -> list[Layer]:
    """Patch stem then every block (depthwise + pointwise): each block reaches the k x k neighbourhood."""
    patch, kernel = model.stem[0].kernel_size[0], model.blocks[0][0].fn[0].kernel_size[0]
    grid = image_size // patch
    local = _neighbourhood(grid, kernel)
    return [Layer("stem", model.stem, "nchw", "nchw", patch_membership(grid, patch)),
            *(Layer(f"block{i + 1}", blk, "nchw", "nchw", local) for i, blk in enumerate(model.blocks))]


FAMILY = Family(
    name="convmixer", classes=(ConvMixer,),
    build=build, width_step=lambda params, **_: 1, flops=flops, tokens=lambda params, **_: params.geometry.grid**2,
    chain=chain, position=lambda model: "conv", size_step=lambda model: int(model.stem[0].kernel_size[0]),
    resize=lambda model, size, params, arch: None,  # convolutions and a global pool: nothing to map
    position_checks=no_position_table,
    contract={"conv": "convolutional, no position parameters: nothing to map (global average pool after the last "
                      "stage)"},
    step_cost=STEP_COST, plot_colour=PLOT_COLOUR, expected_tokens=EXPECTED_TOKENS,
)
