"""The ViT family: timm's ``VisionTransformer`` (and ``VisionTransformerDistilled``), every variant by options.

Options (an architecture's row in :data:`pipeline.archs.ARCHS`):

* ``position``: 'learn' (absolute 1D, trained) | 'none' | 'sincos' (timm's fixed 2D table, a buffer) |
  'sincos_init' (learned, starts equal to the table);
* ``embed``: 'patch' (disjoint P x P) | 'overlap' ((P+2)^2 kernel, stride P) | 'convstem' (log2 P 3x3
  stride-2 convolutions) | 'hybrid' (a ResNet stage, then timm's ``HybridEmbed`` with 1 x 1 patches on its
  feature map): every choice gives the same (H/P)^2 token grid and width;
* ``mix``: False swaps attention blocks for per-token MLP blocks (:class:`TokenMLPBlock`);
* ``distilled``: True is DeiT (class + distillation tokens, two heads, learned position).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import timm.layers
import torch
from timm.layers import HybridEmbed, build_sincos2d_pos_embed, resample_abs_pos_embed
from timm.models.deit import VisionTransformerDistilled
from timm.models.resnet import BasicBlock
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from pipeline.config import Params
from pipeline.errors import ConfigError, StageError
from pipeline.families.common import Family, Layer, linear, mlp, patch_membership, transformer_block

# Seconds per optimizer step against vit's, evaluation included (the study of 492dbde; within 10% of vit: 1.0).
STEP_COST = {"vit": 1.0, "vit_nopos": 1.0, "vit_sincos": 1.1, "vit_sincos_init": 1.1, "vit_convstem": 1.2,
             "vit_overlap": 1.0, "vit_hybrid": 1.6, "deit": 1.4, "deit_labels": 1.3, "nomix": 0.7}
PLOT_COLOUR = {"vit": "#0072B2", "vit_nopos": "#E69F00", "vit_sincos": "#009E73", "vit_sincos_init": "#CC79A7",
               "vit_convstem": "#56B4E9", "vit_overlap": "#D55E00", "vit_hybrid": "#882255", "deit": "#999933",
               "deit_labels": "#332288", "nomix": "#EE3377"}
# The tests' own rule (not the adapter's): every embedding gives one token per P x P patch.
EXPECTED_TOKENS = lambda params, **options: (params.geometry.image_size // params.geometry.patch_size) ** 2  # noqa: E731


# --------------------------------------------------------------------------- builder
def conv_stem(channels: int, width: int, patch: int) -> nn.Sequential:
    """log2(P) overlapping 3x3 stride-2 convolutions (Xiao et al. 2021): (B, C, H, W) -> (B, d, H/P, W/P).

    Hidden convolutions have ``width // 4`` channels with BatchNorm + ReLU, so the stem adds few parameters
    over the P x P projection it replaces and the ViT's width can stay the same; the last one projects to
    the width (with a bias, as the patchify projection) and feeds the token grid.
    """
    steps = int(math.log2(patch))
    if 2**steps != patch:
        raise ConfigError(f"geometry.patch_size: {patch} must be a power of 2 for a stride-2 conv stem")
    layers: list[nn.Module] = []
    c_in = channels
    for _ in range(steps - 1):
        layers += [nn.Conv2d(c_in, width // 4, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width // 4),
                   nn.ReLU(inplace=True)]
        c_in = width // 4
    return nn.Sequential(*layers, nn.Conv2d(c_in, width, 3, stride=2, padding=1))


def hybrid_backbone(channels: int, width: int, patch: int) -> nn.Sequential:
    """The ViT paper's hybrid input: a 3x3 stem and log2(P) stride-2 BasicBlocks at ``width // 4`` channels.

    A ResNet stage in miniature (timm's own ``BasicBlock``): (B, C, H, W) -> (B, width // 4, H/P, W/P), which
    ``HybridEmbed`` projects to the width with 1 x 1 patches. Against ``convstem`` (plain convolutions, same
    downsampling) it adds residual blocks; against ``vit`` it replaces the linear patch projection.
    """
    steps, c = int(math.log2(patch)), width // 4
    if 2**steps != patch:
        raise ConfigError(f"geometry.patch_size: {patch} must be a power of 2 for the hybrid's stride-2 stage")
    layers: list[nn.Module] = [nn.Conv2d(channels, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                               nn.ReLU(inplace=True)]
    for _ in range(steps):
        down = nn.Sequential(nn.Conv2d(c, c, 1, stride=2, bias=False), nn.BatchNorm2d(c))
        layers.append(BasicBlock(c, c, stride=2, downsample=down))
    return nn.Sequential(*layers)


class TokenMLPBlock(nn.Module):
    """Pre-norm residual MLP on each token alone, x + MLP(LN(x)): a ViT block without attention.

    Built by timm's ``VisionTransformer`` as its ``block_fn`` (same signature; attention arguments unused).
    """

    def __init__(self, dim: int, mlp_ratio: float, norm_layer, act_layer, mlp_layer, **_: Any):
        super().__init__()
        self.norm = norm_layer(dim)
        self.mlp = mlp_layer(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, d) -> (B, N, d), token by token
        return x + self.mlp(self.norm(x))


def build(params: Params, num_classes: int, width: int, position: str = "learn", embed: str = "patch",
          mix: bool = True, distilled: bool = False) -> nn.Module:
    """Plain ViT: no class token, mean of patch tokens; ``distilled``: timm's DeiT (class + distillation token)."""
    g, v = params.geometry, params.models.vit
    common = dict(img_size=g.image_size, patch_size=g.patch_size, in_chans=g.channels, num_classes=num_classes,
                  embed_dim=width, depth=v.depth, num_heads=v.num_heads, mlp_ratio=v.mlp_ratio)
    if distilled:  # timm's DeiT always has its learned 1D position
        model = VisionTransformerDistilled(**common, class_token=True, global_pool="token")
    else:
        model = VisionTransformer(**common, class_token=False, global_pool="avg",
                                  pos_embed="none" if position == "none" else "learn",
                                  block_fn=Block if mix else TokenMLPBlock)
    if embed == "overlap":  # kernel P + 2, stride P, padding 1: each patch sees a 1-px ring of its neighbours
        model.patch_embed.proj = nn.Conv2d(g.channels, width, g.patch_size + 2, stride=g.patch_size, padding=1)
    elif embed == "convstem":  # PatchEmbed keeps its grid bookkeeping and flattening; only the projection changes
        model.patch_embed.proj = conv_stem(g.channels, width, g.patch_size)
    elif embed == "hybrid":
        model.patch_embed = HybridEmbed(hybrid_backbone(g.channels, width, g.patch_size), img_size=g.image_size,
                                        patch_size=1, in_chans=g.channels, embed_dim=width)
    if position.startswith("sincos"):
        # (1, N, d) table in the patch embedding's row-major token order; timm adds it in _pos_embed.
        table = timm.layers.build_sincos2d_pos_embed([g.grid, g.grid], dim=width).unsqueeze(0)
        if position == "sincos":  # swapped in for the learned parameter: fixed, not trained, not counted
            del model.pos_embed
            model.register_buffer("pos_embed", table)
        else:
            with torch.no_grad():
                model.pos_embed.copy_(table)
    return model


def width_step(params: Params, mix: bool = True, **_: object) -> int:
    # Heads must divide d, and the 2D sin-cos table and the stems' d/4 hidden channels need d divisible by 4:
    # one step for the attention variants, so they can share one width. Without attention (nomix) nothing
    # constrains d.
    return math.lcm(params.models.vit.num_heads, 4) if mix else 1


# --------------------------------------------------------------------------- FLOPs
def _embedding(params: Params, width: int, embed: str) -> int:
    """The projection onto the (H/P)^2 token grid: disjoint P x P, overlapping (P+2)^2, a conv stem, the hybrid."""
    g = params.geometry
    n = g.grid**2
    if embed == "overlap":
        return linear(n, (g.patch_size + 2) ** 2 * g.channels, width)
    if embed == "convstem":
        total, res, c_in = 0, g.image_size, g.channels
        steps = int(math.log2(g.patch_size))
        for i in range(steps):
            res = (res + 1) // 2
            c_out = width if i == steps - 1 else width // 4
            total += linear(res * res, 9 * c_in, c_out)
            c_in = c_out
        return total
    if embed == "hybrid":  # stem, then per BasicBlock two 3x3 convs and the 1x1 stride-2 shortcut; 1x1 projection
        c, res = width // 4, g.image_size
        total = linear(res * res, 9 * g.channels, c)
        for _ in range(int(math.log2(g.patch_size))):
            res = (res + 1) // 2
            total += 2 * linear(res * res, 9 * c, c) + linear(res * res, c, c)
        return total + linear(n, c, width)
    return linear(n, g.patch_size**2 * g.channels, width)  # the stride-P convolution is this matmul


def flops(params: Params, width: int, num_classes: int, embed: str = "patch", mix: bool = True,
          distilled: bool = False, **_: object) -> int:
    """Embedding on N = (H/P)^2 patches, depth blocks over T = N + prefix tokens, one head (DeiT: two)."""
    g, v = params.geometry, params.models.vit
    tokens = g.grid**2 + (2 if distilled else 0)
    hidden = int(width * v.mlp_ratio)
    block = transformer_block(tokens, tokens, width, hidden) if mix else mlp(tokens, width, hidden)
    heads = 2 if distilled else 1
    return _embedding(params, width, embed) + v.depth * block + heads * linear(1, width, num_classes)


def tokens(params: Params, **_: object) -> int:
    return params.geometry.grid**2


# --------------------------------------------------------------------------- token graph
def chain(model: VisionTransformer, image_size: int) -> list[Layer]:
    """Embedding then blocks (DeiT's extra tokens come from ``_pos_embed``)."""
    pe = model.patch_embed
    grid, patch = pe.grid_size[0], pe.patch_size[0]
    n = model.num_prefix_tokens + pe.num_patches

    def embed(x: torch.Tensor) -> torch.Tensor:  # as VisionTransformer.forward_features, before blocks
        return model.norm_pre(model.patch_drop(model._pos_embed(pe(x))))

    # Only a disjoint patchify has a predictable pixel-to-token membership (conv stems, the hybrid and overlapping
    # patches spread a pixel over neighbouring tokens: no prediction, the measurement stands alone).
    disjoint = (not isinstance(pe, HybridEmbed) and isinstance(pe.proj, nn.Conv2d)
                and pe.proj.kernel_size == pe.proj.stride == (patch, patch))
    layers = [Layer("embed", embed, "nchw", "nlc",
                    patch_membership(grid, patch, model.num_prefix_tokens) if disjoint else None)]
    # A block without attention (nomix) mixes nothing across tokens.
    layers += [Layer(f"block{i + 1}", blk, "nlc", "nlc",
                     np.ones((n, n), dtype=bool) if isinstance(blk, Block) else np.eye(n, dtype=bool))
               for i, blk in enumerate(model.blocks)]
    return layers


# --------------------------------------------------------------------------- resolution
def position(model: VisionTransformer) -> str:
    pe = model.pos_embed
    if pe is None:
        return "none"
    return "learned" if isinstance(pe, nn.Parameter) else "sincos"


def _prefix(model: VisionTransformer) -> int:
    """Rows of the position table that belong to class/distillation tokens, not to patches."""
    return 0 if model.no_embed_class else model.num_prefix_tokens


def position_checks(trained: VisionTransformer, mapped: VisionTransformer, size: int) -> list:
    """A learned or sin-cos table has one row per token of the new grid (plus its prefix tokens' rows)."""
    if position(mapped) == "none":
        return []
    return [("position rows == tokens", (size // size_step(mapped)) ** 2 + _prefix(mapped), mapped.pos_embed.shape[1])]


def size_step(model: VisionTransformer) -> int:
    pe = model.patch_embed
    return int(pe.feat_ratio()) if isinstance(pe, HybridEmbed) else int(pe.patch_size[0])


def resize(model: VisionTransformer, size: int, params: Params, arch: str) -> None:
    """The patch grid to ``size`` px; a learned table resampled by timm, a sin-cos table recomputed."""
    old = tuple(model.patch_embed.grid_size)
    if not hasattr(model.patch_embed, "set_input_size"):
        raise StageError(f"{arch}: {type(model.patch_embed).__name__} cannot change its input size")
    model.patch_embed.set_input_size(img_size=(size, size))
    new = tuple(model.patch_embed.grid_size)
    pe = model.pos_embed
    prefix = _prefix(model)
    kind = position(model)
    if kind == "learned":
        table = resample_abs_pos_embed(pe.data, new_size=list(new), old_size=list(old), num_prefix_tokens=prefix,
                                       interpolation=params.evaluation.resolution.interpolation, antialias=True)
        model.pos_embed = nn.Parameter(table, requires_grad=pe.requires_grad)
    elif kind == "sincos":
        dim = pe.shape[-1]
        trained = build_sincos2d_pos_embed(list(old), dim=dim).to(pe)
        if prefix or pe.shape[1:] != trained.shape or not torch.equal(pe[0], trained):
            raise StageError(f"{arch}: its fixed position table is not timm's 2D sin-cos at the grid {old}")
        model.pos_embed = build_sincos2d_pos_embed(list(new), dim=dim).to(pe).unsqueeze(0)


FAMILY = Family(
    name="vit", classes=(VisionTransformer,),
    build=build, width_step=width_step, flops=flops, tokens=tokens, chain=chain,
    position=position, position_checks=position_checks, size_step=size_step, resize=resize,
    contract={
        "learned": "learned absolute embedding (nn.Parameter): timm resample_abs_pos_embed over the patch grid "
                   "with evaluation.resolution.interpolation (antialiased when shrinking); class/distillation "
                   "tokens' entries kept as trained; unchanged at the training grid",
        "sincos": "fixed 2D sin-cos table (buffer): recomputed by timm build_sincos2d_pos_embed for the new grid "
                  "(the trained table is first checked equal to that function at the training grid)",
        "none": "no position embedding: nothing to map (only the patch grid grows or shrinks)",
    },
    step_cost=STEP_COST, plot_colour=PLOT_COLOUR, expected_tokens=EXPECTED_TOKENS,
)
