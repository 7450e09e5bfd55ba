"""The MLP-Mixer family: timm's ``MlpMixer``, global token mixing that does not depend on the input.

Each block mixes tokens with an MLP over the token axis (weights tied to the N positions of the grid) and
channels with an MLP over the channel axis. Against ``vit`` it keeps global token mixing but drops attention
(mixing weights fixed, not computed from content); against ``nomix`` it adds the token mixing back. It reads
``models.vit`` (depth; ``mlp_ratio`` for the channel MLP) so the pairs share their depth; the token MLP's
hidden size is timm's default half the width. Its token MLP is sized for the training grid, so the family
has no resolution mapping.
"""

from __future__ import annotations

import numpy as np
from timm.models.mlp_mixer import MlpMixer
from torch import nn

from pipeline.config import Params
from pipeline.families.common import Family, Layer, linear, mlp, no_position_table, patch_membership

STEP_COST = {"mixer": 1.0}  # seconds per optimizer step against vit's (the study of 492dbde; within 10%)
PLOT_COLOUR = {"mixer": "#6699CC"}
# The tests' own rule: one token per P x P patch.
EXPECTED_TOKENS = lambda params, **options: (params.geometry.image_size // params.geometry.patch_size) ** 2  # noqa: E731

TOKEN_RATIO = 0.5  # timm's MlpMixer default: the token MLP's hidden size per unit of width


def build(params: Params, num_classes: int, width: int) -> nn.Module:
    g, v = params.geometry, params.models.vit
    return MlpMixer(num_classes=num_classes, img_size=g.image_size, in_chans=g.channels, patch_size=g.patch_size,
                    num_blocks=v.depth, embed_dim=width, mlp_ratio=(TOKEN_RATIO, v.mlp_ratio))


def flops(params: Params, width: int, num_classes: int, **_: object) -> int:
    """Patch projection; per block the token MLP (N -> N/2... on each of the d channels) and the channel MLP."""
    g, v = params.geometry, params.models.vit
    n = g.grid**2
    block = mlp(width, n, int(TOKEN_RATIO * width)) + mlp(n, width, int(v.mlp_ratio * width))
    return linear(n, g.patch_size**2 * g.channels, width) + v.depth * block + linear(1, width, num_classes)


def chain(model: MlpMixer, image_size: int) -> list[Layer]:
    """Patch embedding then blocks; every block's token MLP reaches every token."""
    pe = model.stem
    n = pe.num_patches
    layers = [Layer("embed", pe, "nchw", "nlc", patch_membership(pe.grid_size[0], pe.patch_size[0]))]
    layers += [Layer(f"block{i + 1}", blk, "nlc", "nlc", np.ones((n, n), dtype=bool))
               for i, blk in enumerate(model.blocks)]
    return layers


FAMILY = Family(
    name="mixer", classes=(MlpMixer,),
    build=build, width_step=lambda params, **_: 2,  # the token MLP's hidden size is half the width
    flops=flops, tokens=lambda params, **_: params.geometry.grid**2, chain=chain,
    position=lambda model: "grid", size_step=lambda model: int(model.stem.patch_size[0]),
    resize=None,  # a fixed token grid
    position_checks=no_position_table,
    contract={"grid": "token mixing weights tied to the N positions of the training grid (MLP-Mixer): no mapping "
                      "to another grid exists, so the family is evaluated at its training size only"},
    step_cost=STEP_COST, plot_colour=PLOT_COLOUR, expected_tokens=EXPECTED_TOKENS,
)
