"""Architecture factory over timm, with widths solved so every architecture has about the same parameters.

Every name of :data:`pipeline.archs.ARCHS` is built here with ``pretrained=False`` from ``params.geometry``
and ``params.models``: its family's adapter (:mod:`pipeline.families`) builds it with the row's options and
gives the width step; this module solves the width and counts parameters for all of them alike.

Conventions stated once here (the report quotes them):

* **Readout.** The plain ViT family (``vit*``, ``nomix``; ``mixer`` and ``convmixer`` too) has *no class token*
  and reads out the mean of the patch tokens (timm ``global_pool='avg'``). Without a position signal that
  makes the whole network exactly invariant to permutations of the patch tokens (attention is
  permutation-equivariant, the mean is invariant), which the arrangement-task prediction relies on. DeiT
  (``deit``, ``deit_labels``) keeps timm's class + distillation token readout (its two heads read those
  tokens): ``deit_labels - vit`` is the readout's effect, ``deit - deit_labels`` the teacher's.
* **Position.** ``vit``/``deit``/``vit_hybrid``: learned absolute 1D embedding; ``vit_nopos``, ``nomix``:
  none; ``mixer``: no table, but its token MLP's weights are tied to the grid positions;
  ``vit_sincos``: the fixed 2D sin-cos table of timm's ``build_sincos2d_pos_embed``, stored as a buffer (not
  trained, not counted); ``vit_sincos_init``: a learned embedding that starts equal to that table. Swin has
  no absolute position (timm's relative position bias inside windows).
* **Embedding.** Disjoint P x P patches, except ``vit_overlap`` ((P+2) x (P+2) kernel, stride P) and
  ``vit_convstem`` (log2 P overlapping 3x3 stride-2 convolutions, Xiao et al. 2021) and ``vit_hybrid`` (a
  3x3 stem and log2 P stride-2 ResNet BasicBlocks, then timm's ``HybridEmbed`` with 1x1 patches, the ViT
  paper's hybrid); all give the same (H/P)^2 token grid and width. ``convmixer`` keeps the disjoint patches.
* **Downsampling** (ResNet): stride-2 convolutions (``resnet``), none at all (``resnet_s1``: every map at
  full resolution, shift-equivariant up to the border, at several times the FLOPs), or timm's BlurPool
  before every stride 2 (``resnet_aa``, Zhang 2019).
* **Width.** ``width`` is the ViT/DeiT ``embed_dim``, Swin's first-stage ``embed_dim`` and the ResNet's
  first-stage channels (both doubling per stage). Ablations reuse their reference's width
  (``ArchInfo.width_of``), so they change one thing only; ``nomix``, ``swin_local``, ``vit_hybrid``,
  ``mixer`` and ``convmixer`` change the parameter shapes and solve their own.
* **Parameters** (:func:`param_count`) are trainable parameters; buffers (sin-cos table, Swin masks,
  BlurPool filters, BatchNorm statistics) are not counted.
* **Regularisation.** Stochastic depth and dropout are off everywhere (timm's Swin defaults to
  ``drop_path_rate=0.1``): regularisation belongs to the training recipe, applied to all alike.
* **Swin windows.** timm shrinks a window to the stage resolution and turns the shift off where the window
  covers the whole stage; :func:`pipeline.families.swin.block_layout` reports what each block really does, and
  the params schema rejects a layout where no block shifts (``swin`` and ``swin_noshift`` would be identical).
  ``swin_local`` is one stage of ``sum(depths)`` unshifted blocks: its windows never merge.
"""

from __future__ import annotations

import time

import pandas as pd
import torch
from torch import nn

from pipeline.archs import ARCHS
from pipeline.config import Params
from pipeline.errors import ConfigError
from pipeline.families import family
from pipeline.meta_device import SkipMetaWrites


# --------------------------------------------------------------------------- public API
def param_count(model: nn.Module) -> int:
    """Trainable parameters (``requires_grad``); buffers such as a fixed sin-cos table are not counted."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def width_step(arch: str, params: Params) -> int:
    """The granularity of ``width`` for ``arch``: every head count (and the sin-cos table) must divide it."""
    return family(arch).width_step(params, **ARCHS[arch].options)


def build_model(arch: str, params: Params, num_classes: int, width: int | None = None) -> nn.Module:
    """Build ``arch`` (one of :data:`ARCHS`): images (B, C, H, W) -> logits (B, num_classes).

    ``width=None`` uses :func:`solve_width` at ``models.reference_classes`` (closest to the target). DeiT in
    training mode after ``model.set_distilled_training(True)`` returns ``(cls_logits, dist_logits)``;
    otherwise (and always in eval mode) the mean of its two heads' logits.
    """
    fam = family(arch)
    if width is None:
        # Solved once at the reference class count, so an architecture has the same body on every task.
        width = solve_width(arch, params, params.models.reference_classes)
    step = fam.width_step(params, **ARCHS[arch].options)
    if width <= 0 or width % step:
        raise ConfigError(f"width: {width} for {arch} must be a positive multiple of {step}")
    return fam.build(params, num_classes, width, **ARCHS[arch].options)


def _count_at(arch: str, params: Params, num_classes: int, width: int) -> int:
    # The meta device builds the module structure without allocating storage; the weight init it cannot hold is
    # skipped (pipeline/meta_device.py: a third of the time, the same count).
    with torch.device("meta"), SkipMetaWrites():
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
    family(arch)  # an unknown name: one line
    width = _closest_width(ARCHS[arch].width_of or arch, params, num_classes)
    target, tol = params.models.param_target, params.models.param_tolerance
    n = _count_at(arch, params, num_classes, width)
    deviation = n / target - 1
    if abs(deviation) > tol:
        raise ConfigError(
            f"models.param_target: {arch} cannot get within {tol:.0%} of {target} parameters "
            f"(closest: width {width} with {n}, {deviation:+.1%}; its widths step by {width_step(arch, params)}, "
            f"set by models.{ARCHS[arch].section}'s heads and patch keys)"
        )
    return width


def budget_table(params: Params, num_classes: int, archs: tuple[str, ...] = tuple(ARCHS)) -> pd.DataFrame:
    """One row per architecture: arch, width (as every run solves it), params with a ``num_classes`` head,
    deviation (params / target - 1), solve_seconds."""
    rows = []
    for arch in archs:
        t0 = time.perf_counter()
        # the width every run uses (solved at models.reference_classes), counted with a num_classes head
        width = solve_width(arch, params, params.models.reference_classes)
        n = _count_at(arch, params, num_classes, width)
        rows.append({
            "arch": arch, "width": width, "params": n,
            "deviation": n / params.models.param_target - 1,
            "solve_seconds": time.perf_counter() - t0,
        })
    return pd.DataFrame(rows)
