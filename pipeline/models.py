"""Architecture factory over timm, with widths solved so every architecture has about the same parameters.

Every architecture is a timm module built with ``pretrained=False`` from ``params.geometry`` and
``params.models``; the variants are rows of :data:`SPECS` (data), not branches of an ``if`` chain.

Conventions stated once here (the report quotes them):

* **Readout.** The plain ViT family (``vit``, ``vit_nopos``, ``vit_sincos``) has *no class token* and
  reads out the mean of the patch tokens (timm ``global_pool='avg'``). Without a position signal that makes
  the whole network exactly invariant to permutations of the patch tokens (attention is
  permutation-equivariant, the mean is invariant), which the arrangement-task prediction relies on. DeiT
  keeps timm's class + distillation token readout (its two heads read those tokens), so DeiT differs from
  ``vit`` in readout as well as in the distillation token: compare DeiT runs with each other (teacher vs
  none) for the distillation effect.
* **Position.** ``vit``/``deit``: learned absolute 1D embedding; ``vit_nopos``: none; ``vit_sincos``: the
  fixed 2D sin-cos table of timm's ``build_sincos2d_pos_embed``, stored as a buffer (not a parameter: not
  trained, not counted). Swin has no absolute position (timm's relative position bias inside windows).
* **Width.** ``width`` is the ViT/DeiT ``embed_dim``, Swin's first-stage ``embed_dim`` and the ResNet's
  first-stage channels (both doubling per stage). Ablations reuse their reference's width
  (``ArchSpec.width_of``), so they change one thing only.
* **Parameters** (:func:`param_count`) are trainable parameters; buffers (sin-cos table, Swin masks,
  BatchNorm statistics) are not counted.
* **Regularisation.** Stochastic depth and dropout are off everywhere (timm's Swin defaults to
  ``drop_path_rate=0.1``): regularisation belongs to the training recipe, applied to all alike.
* **Swin windows.** timm shrinks a window to the stage resolution and turns the shift off where the window
  covers the whole stage; :func:`swin_block_layout` reports what each block really does, and the params
  schema rejects a layout where no block shifts (``swin`` and ``swin_noshift`` would be identical).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pandas as pd
import timm.layers
import torch
from timm.models.deit import VisionTransformerDistilled
from timm.models.resnet import BasicBlock, ResNet
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from pipeline.config import Params
from pipeline.errors import ConfigError

ARCHS = ("vit", "vit_nopos", "vit_sincos", "deit", "swin", "swin_noshift", "resnet")


# --------------------------------------------------------------------------- family builders
def _vit(params: Params, num_classes: int, width: int, **options: Any) -> nn.Module:
    """Plain ViT, no class token, mean of patch tokens; ``position``: 'learn' | 'none' | 'sincos'."""
    g, v = params.geometry, params.models.vit
    position = options["position"]
    model = VisionTransformer(
        img_size=g.image_size, patch_size=g.patch_size, in_chans=g.channels, num_classes=num_classes,
        embed_dim=width, depth=v.depth, num_heads=v.num_heads, mlp_ratio=v.mlp_ratio,
        class_token=False, global_pool="avg",
        pos_embed="none" if position == "none" else "learn",
    )
    if position == "sincos":
        # (N, d) table in the patch embedding's row-major token order, swapped in for the learned parameter.
        table = timm.layers.build_sincos2d_pos_embed([g.grid, g.grid], dim=width)
        del model.pos_embed
        model.register_buffer("pos_embed", table.unsqueeze(0))  # (1, N, d); timm adds it in _pos_embed
    return model


def _deit(params: Params, num_classes: int, width: int, **options: Any) -> nn.Module:
    """DeiT: class + distillation tokens, learned 1D position (timm ignores ``pos_embed='none'`` here)."""
    g, v = params.geometry, params.models.vit
    return VisionTransformerDistilled(
        img_size=g.image_size, patch_size=g.patch_size, in_chans=g.channels, num_classes=num_classes,
        embed_dim=width, depth=v.depth, num_heads=v.num_heads, mlp_ratio=v.mlp_ratio,
        class_token=True, global_pool="token",
    )


def _swin(params: Params, num_classes: int, width: int, **options: Any) -> nn.Module:
    """Swin with shifted windows; ``shift=False`` turns every block's shift off (timm's resize path)."""
    g, s = params.geometry, params.models.swin
    model = SwinTransformer(
        img_size=g.image_size, patch_size=s.patch_size, in_chans=g.channels, num_classes=num_classes,
        embed_dim=width, depths=tuple(s.depths), num_heads=tuple(s.num_heads), window_size=s.window_size,
        mlp_ratio=s.mlp_ratio, drop_path_rate=0.0,
    )
    if not options["shift"]:
        for stage in model.layers:
            for block in stage.blocks:
                # target_shift_size is what set_input_size recomputes the shift (and the mask) from.
                block.target_shift_size = (0, 0)
                block.set_input_size(block.input_resolution, block.window_size)
    return model


def _resnet(params: Params, num_classes: int, width: int, **options: Any) -> nn.Module:
    """BasicBlock ResNet with a 3x3 stride-1 stem and no max-pool, channels ``width * 2**stage``, 1-4 stages.

    timm's default stem (7x7 stride 2 + max-pool) would shrink a 16-px image to 4 px before the first block.
    timm fixes the default stem's output at 64 channels; its 'deep' stem outputs ``2 * stem_width``, which is
    how the first stage's input width is set to ``width`` here before the stem itself is replaced.
    """
    g, r = params.geometry, params.models.resnet
    channels = tuple(width * 2**i for i in range(len(r.layers)))
    model = ResNet(
        block=BasicBlock, layers=tuple(r.layers), channels=channels, num_classes=num_classes,
        in_chans=g.channels, stem_type="deep", stem_width=width // 2,
    )
    model.conv1 = nn.Conv2d(g.channels, width, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as timm's init_weights
    model.maxpool = nn.Identity()
    for i in range(len(r.layers) + 1, 5):
        # timm's forward_features calls layer1..layer4 by name; absent stages become identities.
        model.add_module(f"layer{i}", nn.Identity())
    return model


# --------------------------------------------------------------------------- width granularity
def _vit_step(params: Params) -> int:
    # Heads must divide d, and the 2D sin-cos table needs d divisible by 4: one step for the whole ViT family,
    # so the position variants can share one width.
    return math.lcm(params.models.vit.num_heads, 4)


def _swin_step(params: Params) -> int:
    # Stage i has width * 2**i channels, which every stage's head count must divide.
    heads = params.models.swin.num_heads
    return math.lcm(*(h // math.gcd(h, 2**i) for i, h in enumerate(heads)))


def _resnet_step(params: Params) -> int:
    return 2  # the stem width is set through timm's deep stem, whose output is 2 * stem_width


@dataclass(frozen=True)
class ArchSpec:
    """One architecture: a timm family builder, its options, and the width step its constructor requires.

    ``width_of`` names the architecture whose solved width an ablation reuses, so that the ablation changes
    one thing only (the position signal, the shift) and not the width as well; its own parameter count
    must still land within the tolerance.
    """

    family: str  # 'vit' | 'deit' | 'swin' | 'resnet': the layout the analytic FLOP count follows
    build: Callable[..., nn.Module]
    step: Callable[[Params], int]
    description: str
    options: dict[str, Any] = field(default_factory=dict)
    width_of: str | None = None


SPECS: dict[str, ArchSpec] = {
    "vit": ArchSpec("vit", _vit, _vit_step, "ViT, learned 1D position, mean readout",
                    options={"position": "learn"}),
    "vit_nopos": ArchSpec("vit", _vit, _vit_step, "ViT, no position, mean readout",
                          options={"position": "none"}, width_of="vit"),
    "vit_sincos": ArchSpec("vit", _vit, _vit_step, "ViT, fixed 2D sin-cos position, mean readout",
                           options={"position": "sincos"}, width_of="vit"),
    "deit": ArchSpec("deit", _deit, _vit_step, "DeiT, class + distillation tokens, learned 1D position"),
    "swin": ArchSpec("swin", _swin, _swin_step, "Swin, shifted windows", options={"shift": True}),
    "swin_noshift": ArchSpec("swin", _swin, _swin_step, "Swin, windows never shifted",
                             options={"shift": False}, width_of="swin"),
    "resnet": ArchSpec("resnet", _resnet, _resnet_step,
                       "ResNet (BasicBlock), 3x3 stride-1 stem, no max-pool"),
}
assert tuple(SPECS) == ARCHS


def arch_spec(arch: str) -> ArchSpec:
    """The row of :data:`SPECS` for ``arch``; :class:`ConfigError` for an unknown name."""
    try:
        return SPECS[arch]
    except KeyError:
        known = ", ".join(ARCHS)
        raise ConfigError(f"arch: unknown architecture {arch!r}; expected one of {known}") from None


# --------------------------------------------------------------------------- public API
def param_count(model: nn.Module) -> int:
    """Trainable parameters (``requires_grad``); buffers such as a fixed sin-cos table are not counted."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def width_step(arch: str, params: Params) -> int:
    """The granularity of ``width`` for ``arch``: every head count (and the sin-cos table) must divide it."""
    return arch_spec(arch).step(params)


def build_model(arch: str, params: Params, num_classes: int, width: int | None = None) -> nn.Module:
    """Build ``arch`` (one of :data:`ARCHS`): images (B, C, H, W) -> logits (B, num_classes).

    ``width=None`` uses :func:`solve_width` at ``models.reference_classes`` (closest to the target). DeiT in
    training mode after ``model.set_distilled_training(True)`` returns ``(cls_logits, dist_logits)``;
    otherwise (and always in eval mode) the mean of its two heads' logits.
    """
    spec = arch_spec(arch)
    if width is None:
        # Solved once at the reference class count, so an architecture has the same body on every task.
        width = solve_width(arch, params, params.models.reference_classes)
    step = spec.step(params)
    if width <= 0 or width % step:
        raise ConfigError(f"width: {width} for {arch} must be a positive multiple of {step}")
    return spec.build(params, num_classes, width, **spec.options)


def _count_at(arch: str, params: Params, num_classes: int, width: int) -> int:
    # The meta device builds the module structure without allocating or initialising real storage.
    with torch.device("meta"):
        return param_count(build_model(arch, params, num_classes, width))


def _closest_width(arch: str, params: Params, num_classes: int) -> int:
    """The multiple of ``width_step`` whose parameter count is closest to ``models.param_target``.

    The count grows strictly with the width, so the two candidates bracketing the target are found by
    doubling then bisection (about a dozen meta-device builds).
    """
    target, step = params.models.param_target, width_step(arch, params)
    counts: dict[int, int] = {}

    def count(k: int) -> int:  # k in units of step
        if k not in counts:
            counts[k] = _count_at(arch, params, num_classes, k * step)
        return counts[k]

    if count(1) > target:
        return step
    lo, hi = 1, 2  # invariant after the doubling: count(lo) <= target < count(hi)
    while count(hi) <= target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count(mid) <= target else (lo, mid)
    return step * min((lo, hi), key=lambda k: abs(count(k) - target))


def solve_width(arch: str, params: Params, num_classes: int) -> int:
    """The width of ``arch`` at ``models.param_target`` (an ablation reuses its reference's width).

    Raises :class:`ConfigError` naming ``models.param_target`` when the architecture's parameter count at
    that width is outside ``models.param_tolerance`` of the target.
    """
    spec = arch_spec(arch)
    width = _closest_width(spec.width_of or arch, params, num_classes)
    target, tol = params.models.param_target, params.models.param_tolerance
    n = _count_at(arch, params, num_classes, width)
    deviation = n / target - 1
    if abs(deviation) > tol:
        raise ConfigError(
            f"models.param_target: {arch} cannot get within {tol:.0%} of {target} parameters "
            f"(closest: width {width} with {n}, {deviation:+.1%})"
        )
    return width


def budget_table(params: Params, num_classes: int, archs: tuple[str, ...] = ARCHS) -> pd.DataFrame:
    """One row per architecture: arch, width, params, deviation (params / target - 1), solve_seconds."""
    rows = []
    for arch in archs:
        t0 = time.perf_counter()
        width = solve_width(arch, params, num_classes)
        n = _count_at(arch, params, num_classes, width)
        rows.append({
            "arch": arch, "width": width, "params": n,
            "deviation": n / params.models.param_target - 1,
            "solve_seconds": time.perf_counter() - t0,
        })
    return pd.DataFrame(rows)


class BlockLayout(NamedTuple):
    """What one Swin block really does after timm's adjustments."""

    stage: int
    block: int
    resolution: tuple[int, int]  # token grid the block sees
    window: tuple[int, int]  # window actually used (timm shrinks it to the resolution)
    shift: tuple[int, int]  # cyclic shift actually used ((0, 0): none)


def swin_block_layout(model: SwinTransformer) -> list[BlockLayout]:
    """Per-block (resolution, window, shift) of a built timm Swin, read from the blocks themselves."""
    return [
        BlockLayout(i, j, tuple(b.input_resolution), tuple(b.window_size), tuple(b.shift_size))
        for i, stage in enumerate(model.layers)
        for j, b in enumerate(stage.blocks)
    ]
