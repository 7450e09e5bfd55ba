"""The Swin family: timm's ``SwinTransformer``; options ``shift`` (windows shifted or not) and ``local``.

``local=True`` is one stage of ``sum(depths)`` blocks with the first stage's heads and no patch merging, so
the window partition never changes and (without shift) tokens in different windows never meet; it reads
``models.swin.local``'s patch and window where set (the same window in pixels on a coarser token grid). timm shrinks
a window to the stage resolution and turns the shift off where the window covers the whole stage;
:func:`block_layout` reports what each block really does.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np
import torch
from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock, window_partition
from torch import nn

from pipeline.config import Params
from pipeline.families.common import Family, Layer, linear, merge_pattern, patch_membership, transformer_block

# Seconds per optimizer step against vit's, evaluation included (the study of 492dbde).
STEP_COST = {"swin": 2.6, "swin_noshift": 2.6, "swin_local": 1.6, "swin_local_shift": 1.6}
PLOT_COLOUR = {"swin": "#44AA99", "swin_noshift": "#AA4499", "swin_local": "#000000", "swin_local_shift": "#CC6677"}
# The tests' own rule: one token per Swin patch (the one-stage pair's own patch where models.swin.local sets it).
EXPECTED_TOKENS = lambda params, local=False, **options: (  # noqa: E731
    params.geometry.image_size // params.models.swin.grid(local)[0]) ** 2


def _stages(params: Params, local: bool) -> tuple[list[int], list[int]]:
    s = params.models.swin
    return ([sum(s.depths)], s.num_heads[:1]) if local else (list(s.depths), list(s.num_heads))


def build(params: Params, num_classes: int, width: int, shift: bool = True, local: bool = False) -> nn.Module:
    g, s = params.geometry, params.models.swin
    depths, heads = _stages(params, local)
    patch, window = s.grid(local)
    model = SwinTransformer(
        img_size=g.image_size, patch_size=patch, in_chans=g.channels, num_classes=num_classes,
        embed_dim=width, depths=tuple(depths), num_heads=tuple(heads), window_size=window,
        mlp_ratio=s.mlp_ratio, drop_path_rate=0.0,
    )
    if not shift:
        for stage in model.layers:
            for block in stage.blocks:
                # target_shift_size is what set_input_size recomputes the shift (and the mask) from.
                block.target_shift_size = (0, 0)
                block.set_input_size(block.input_resolution, block.window_size)
    return model


def width_step(params: Params, **_: object) -> int:
    # Stage i has width * 2**i channels, which every stage's head count must divide.
    heads = params.models.swin.num_heads
    return math.lcm(*(h // math.gcd(h, 2**i) for i, h in enumerate(heads)))


def flops(params: Params, width: int, num_classes: int, local: bool = False, **_: object) -> int:
    """Patch embedding, then per stage: patch merging (stages > 0) and window-attention blocks.

    Stage i has dim ``width * 2**i`` on an R_i x R_i grid (R_0 = H / swin patch, halved per stage); a window is
    ``min(window_size, R_i)`` per side (timm's shrink), so every token attends to w_i^2 keys; the shifted-window
    mask changes which keys, not how many products are computed.
    """
    g, s = params.geometry, params.models.swin
    patch, window_size = s.grid(local)
    res = g.image_size // patch
    total = linear(res * res, patch**2 * g.channels, width)
    dim = width
    for i, depth in enumerate(_stages(params, local)[0]):
        if i > 0:
            res //= 2
            total += linear(res * res, 4 * dim, 2 * dim)  # PatchMerging: concat 2x2 neighbours, project
            dim *= 2
        window = min(window_size, res)
        total += depth * transformer_block(res * res, window * window, dim, int(dim * s.mlp_ratio))
    return total + linear(1, dim, num_classes)


def tokens(params: Params, local: bool = False, **_: object) -> int:
    return (params.geometry.image_size // params.models.swin.grid(local)[0]) ** 2


def window_connectivity(block: SwinTransformerBlock) -> np.ndarray:
    """Which real token each query may attend to, read off the block's own partition and mask.

    Follows the block's forward: roll by ``-shift``, pad to whole windows, ``window_partition``; a pair in
    one window is allowed where ``block.attn_mask`` (``(nW, w*w, w*w)``, None when unshifted) is 0.
    Returns bool ``(N, N)``, ``[query, key]``, tokens numbered row-major on the ``H x W`` grid.
    """
    h, w = block.input_resolution
    (wh, ww), (sh, sw) = block.window_size, block.shift_size
    ids = torch.arange(h * w).reshape(1, h, w, 1)
    ids = torch.roll(ids, shifts=(-sh, -sw), dims=(1, 2))
    ph, pw = (wh - h % wh) % wh, (ww - w % ww) % ww
    ids = torch.nn.functional.pad(ids, (0, 0, 0, pw, 0, ph), value=-1)  # -1: padding token
    win = window_partition(ids, (wh, ww)).reshape(-1, wh * ww)  # (nW, w*w) token id per slot
    mask = block.attn_mask
    allowed = torch.ones(win.shape[0], wh * ww, wh * ww, dtype=torch.bool) if mask is None else mask == 0
    real = (win[:, :, None] >= 0) & (win[:, None, :] >= 0) & allowed
    widx, qi, ki = torch.nonzero(real, as_tuple=True)
    conn = np.zeros((h * w, h * w), dtype=bool)
    conn[win[widx, qi].numpy(), win[widx, ki].numpy()] = True
    return conn


def chain(model: SwinTransformer, image_size: int) -> list[Layer]:
    """Patch embedding then every Swin block; a stage's patch merging is folded into its first block."""
    pe = model.patch_embed
    layers = [Layer("embed", pe, "nchw", "nhwc", patch_membership(pe.grid_size[0], pe.patch_size[0]))]
    for i, stage in enumerate(model.layers):
        for j, blk in enumerate(stage.blocks):
            window = window_connectivity(blk)
            if j == 0 and not isinstance(stage.downsample, nn.Identity):
                merge = merge_pattern(stage.input_resolution[0])
                layers.append(Layer(f"stage{i + 1}.merge+block{j + 1}", nn.Sequential(stage.downsample, blk),
                                    "nhwc", "nhwc", (window.astype(int) @ merge.astype(int)) > 0))
            else:
                layers.append(Layer(f"stage{i + 1}.block{j + 1}", blk, "nhwc", "nhwc", window))
    return layers


def size_step(model: SwinTransformer) -> int:
    """The patch, times 2 per patch merging."""
    return int(model.patch_embed.patch_size[0]) * 2 ** (len(model.layers) - 1)


def resize(model: SwinTransformer, size: int, params: Params, arch: str) -> None:
    """timm's ``set_input_size`` with each stage's trained window, then crop (not interpolate) shrunk tables."""
    trained = {n: (b.attn.window_size, b.attn.relative_position_bias_table.detach().clone())
               for n, b in blocks(model)}
    windows = tuple(tuple(stage.blocks[0].attn.window_size) for stage in model.layers)  # as built (trained)
    with warnings.catch_warnings():  # timm interpolates a shrunk window's table first (replaced below)
        warnings.simplefilter("ignore", UserWarning)
        model.set_input_size(img_size=(size, size), window_size=windows)
    for name, block in blocks(model):
        (wh, ww), table = trained[name]
        h, w = block.attn.window_size
        if (h, w) != (wh, ww):  # the grid is smaller than the window: keep the offsets that exist
            grid = table.view(2 * wh - 1, 2 * ww - 1, -1)[wh - h:wh + h - 1, ww - w:ww + w - 1]
            block.attn.relative_position_bias_table = nn.Parameter(grid.reshape(-1, table.shape[-1]).clone())


def blocks(model: SwinTransformer):
    return [(f"{i}.{j}", b) for i, stage in enumerate(model.layers) for j, b in enumerate(stage.blocks)]


def bias_defect(trained: SwinTransformer, mapped: SwinTransformer) -> float:
    """Largest |bias difference| over every (block, head, relative offset) the mapped windows use.

    Zero means each relative offset keeps exactly its trained bias (the window-fixed contract).
    """
    worst = 0.0
    for (_, a), (_, b) in zip(blocks(trained), blocks(mapped), strict=True):
        old, new = _offset_bias(a), _offset_bias(b)
        worst = max([worst, *((new[k] - old[k]).abs().max().item() for k in new)])
    return worst


def _offset_bias(block: nn.Module) -> dict[tuple[int, int], torch.Tensor]:
    """Bias per relative offset (dy, dx) of one Swin block, (heads,) each, read from the bias it applies."""
    h, w = block.attn.window_size
    bias = block.attn._get_rel_pos_bias()[0]  # (heads, h*w, h*w)
    return {(q // w - k // w, q % w - k % w): bias[:, q, k] for q in range(h * w) for k in range(h * w)}


class BlockLayout(NamedTuple):
    """What one Swin block really does after timm's adjustments."""

    stage: int
    block: int
    resolution: tuple[int, int]  # token grid the block sees
    window: tuple[int, int]  # window actually used (timm shrinks it to the resolution)
    shift: tuple[int, int]  # cyclic shift actually used ((0, 0): none)


def block_layout(model: SwinTransformer) -> list[BlockLayout]:
    """Per-block (resolution, window, shift) of a built timm Swin, read from the blocks themselves."""
    return [BlockLayout(i, j, tuple(b.input_resolution), tuple(b.window_size), tuple(b.shift_size))
            for i, stage in enumerate(model.layers) for j, b in enumerate(stage.blocks)]


FAMILY = Family(
    name="swin", classes=(SwinTransformer,),
    build=build, width_step=width_step, flops=flops, tokens=tokens, chain=chain,
    position=lambda model: "swin", size_step=size_step, resize=resize,
    position_checks=lambda trained, mapped, size: [
        ("every offset keeps its trained bias (max |diff|)", 0, bias_defect(trained, mapped))],
    contract={"swin": "relative position bias inside windows: the window stays at its trained (as built) size w "
                      "per stage and the bias table is unchanged; blocks trained with a shift shift by w/2 wherever "
                      "the stage grid exceeds w, not where the window covers the grid (timm); a grid smaller than "
                      "w gets one window of the grid's size whose table is cropped to the offsets that exist "
                      "(never resampled); a grid w does not tile is zero-padded to whole windows by timm (the "
                      "padding tokens are attended to)"},
    step_cost=STEP_COST, plot_colour=PLOT_COLOUR, expected_tokens=EXPECTED_TOKENS,
)
