"""Architecture factory over timm, with widths solved so every architecture has about the same parameters.

Every name of :data:`pipeline.archs.ARCHS` is built here with ``pretrained=False`` from ``params.geometry``
and ``params.models``: its family picks a builder, its row of :data:`SPECS` (data, not an ``if`` chain)
gives the builder's options and the width step.

Conventions stated once here (the report quotes them):

* **Readout.** The plain ViT family (``vit*`` and ``nomix``) has *no class token* and reads out the mean of
  the patch tokens (timm ``global_pool='avg'``). Without a position signal that makes the whole network
  exactly invariant to permutations of the patch tokens (attention is permutation-equivariant, the mean is
  invariant), which the arrangement-task prediction relies on. DeiT (``deit``, ``deit_labels``) keeps
  timm's class + distillation token readout (its two heads read those tokens): ``deit_labels - vit`` is the
  readout's effect, ``deit - deit_labels`` the teacher's.
* **Position.** ``vit``/``deit``: learned absolute 1D embedding; ``vit_nopos`` and ``nomix``: none;
  ``vit_sincos``: the fixed 2D sin-cos table of timm's ``build_sincos2d_pos_embed``, stored as a buffer (not
  trained, not counted); ``vit_sincos_init``: a learned embedding that starts equal to that table. Swin has
  no absolute position (timm's relative position bias inside windows).
* **Embedding.** Disjoint P x P patches, except ``vit_overlap`` ((P+2) x (P+2) kernel, stride P) and
  ``vit_convstem`` (log2 P overlapping 3x3 stride-2 convolutions, Xiao et al. 2021); all give the same
  (H/P)^2 token grid and width.
* **Downsampling** (ResNet): stride-2 convolutions (``resnet``), none at all (``resnet_s1``: every map at
  full resolution, shift-equivariant up to the border, at several times the FLOPs), or timm's BlurPool
  before every stride 2 (``resnet_aa``, Zhang 2019).
* **Width.** ``width`` is the ViT/DeiT ``embed_dim``, Swin's first-stage ``embed_dim`` and the ResNet's
  first-stage channels (both doubling per stage). Ablations reuse their reference's width
  (``ArchSpec.width_of``), so they change one thing only; ``nomix`` and ``swin_local`` change the parameter
  shapes and solve their own.
* **Parameters** (:func:`param_count`) are trainable parameters; buffers (sin-cos table, Swin masks,
  BlurPool filters, BatchNorm statistics) are not counted.
* **Regularisation.** Stochastic depth and dropout are off everywhere (timm's Swin defaults to
  ``drop_path_rate=0.1``): regularisation belongs to the training recipe, applied to all alike.
* **Swin windows.** timm shrinks a window to the stage resolution and turns the shift off where the window
  covers the whole stage; :func:`swin_block_layout` reports what each block really does, and the params
  schema rejects a layout where no block shifts (``swin`` and ``swin_noshift`` would be identical).
  ``swin_local`` is one stage of ``sum(depths)`` unshifted blocks: its windows never merge.
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
from timm.layers import BlurPool2d
from timm.models.deit import VisionTransformerDistilled
from timm.models.resnet import BasicBlock, ResNet
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from pipeline.archs import ARCHS
from pipeline.config import Params
from pipeline.errors import ConfigError


# --------------------------------------------------------------------------- family builders
def _conv_stem(channels: int, width: int, patch: int) -> nn.Sequential:
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


def _patch_projection(embed: str, channels: int, width: int, patch: int) -> nn.Module | None:
    """The projection replacing timm's disjoint P x P one (None: keep it). Every choice gives an H/P grid."""
    if embed == "overlap":  # kernel P + 2, stride P, padding 1: each patch sees a 1-px ring of its neighbours
        return nn.Conv2d(channels, width, patch + 2, stride=patch, padding=1)
    if embed == "convstem":
        return _conv_stem(channels, width, patch)
    return None


class TokenMLPBlock(nn.Module):
    """Pre-norm residual MLP on each token alone, x + MLP(LN(x)): a ViT block without attention.

    Built by timm's ``VisionTransformer`` as its ``block_fn`` (same signature; attention arguments unused).
    """

    def __init__(self, dim: int, mlp_ratio: float, norm_layer: Callable[..., nn.Module],
                 act_layer: Callable[..., nn.Module], mlp_layer: Callable[..., nn.Module], **_: Any):
        super().__init__()
        self.norm = norm_layer(dim)
        self.mlp = mlp_layer(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, d) -> (B, N, d), token by token
        return x + self.mlp(self.norm(x))


def _vit(params: Params, num_classes: int, width: int, **options: Any) -> nn.Module:
    """Plain ViT, no class token, mean of patch tokens.

    ``position``: 'learn' | 'none' | 'sincos' (fixed buffer) | 'sincos_init' (learned, starts at the table);
    ``embed``: 'patch' | 'overlap' | 'convstem'; ``mix=False`` swaps every block for :class:`TokenMLPBlock`.
    """
    g, v = params.geometry, params.models.vit
    position = options.get("position", "learn")
    model = VisionTransformer(
        img_size=g.image_size, patch_size=g.patch_size, in_chans=g.channels, num_classes=num_classes,
        embed_dim=width, depth=v.depth, num_heads=v.num_heads, mlp_ratio=v.mlp_ratio,
        class_token=False, global_pool="avg", pos_embed="none" if position == "none" else "learn",
        block_fn=Block if options.get("mix", True) else TokenMLPBlock,
    )
    proj = _patch_projection(options.get("embed", "patch"), g.channels, width, g.patch_size)
    if proj is not None:  # PatchEmbed keeps its grid bookkeeping and flattening; only the projection changes
        model.patch_embed.proj = proj
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


def _deit(params: Params, num_classes: int, width: int, **options: Any) -> nn.Module:
    """DeiT: class + distillation tokens, learned 1D position (timm ignores ``pos_embed='none'`` here)."""
    g, v = params.geometry, params.models.vit
    return VisionTransformerDistilled(
        img_size=g.image_size, patch_size=g.patch_size, in_chans=g.channels, num_classes=num_classes,
        embed_dim=width, depth=v.depth, num_heads=v.num_heads, mlp_ratio=v.mlp_ratio,
        class_token=True, global_pool="token",
    )


def _swin(params: Params, num_classes: int, width: int, **options: Any) -> nn.Module:
    """Swin with shifted windows; ``shift=False`` turns every block's shift off (timm's resize path).

    ``local=True``: one stage of ``sum(depths)`` blocks with the first stage's heads and no patch merging,
    so the window partition never changes and (without shift) tokens in different windows never meet.
    """
    g, s = params.geometry, params.models.swin
    depths, heads = (s.depths, s.num_heads) if not options.get("local") else ([sum(s.depths)], s.num_heads[:1])
    model = SwinTransformer(
        img_size=g.image_size, patch_size=s.patch_size, in_chans=g.channels, num_classes=num_classes,
        embed_dim=width, depths=tuple(depths), num_heads=tuple(heads), window_size=s.window_size,
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
    ``downsample``: 'stride' (timm's stride-2 convs) | 'none' (every stride 1) | 'blur' (timm's BlurPool
    ``aa_layer`` in the blocks, and a BlurPool before the 1x1 shortcut too, as Zhang 2019).
    """
    g, r = params.geometry, params.models.resnet
    downsample = options.get("downsample", "stride")
    channels = tuple(width * 2**i for i in range(len(r.layers)))
    model = ResNet(
        block=BasicBlock, layers=tuple(r.layers), channels=channels, num_classes=num_classes,
        in_chans=g.channels, stem_type="deep", stem_width=width // 2,
        aa_layer=BlurPool2d if downsample == "blur" else None,
    )
    model.conv1 = nn.Conv2d(g.channels, width, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as timm's init_weights
    model.maxpool = nn.Identity()
    for i in range(len(r.layers) + 1, 5):
        # timm's forward_features calls layer1..layer4 by name; absent stages become identities.
        model.add_module(f"layer{i}", nn.Identity())
    if downsample == "blur":
        _blur_shortcuts(model)
    if downsample == "none":
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                m.stride = (1, 1)  # 3x3 convs keep padding 1 and 1x1 shortcuts padding 0: same-size maps
    return model


def _blur_shortcuts(model: ResNet) -> None:
    """Every strided 1x1 projection shortcut becomes BlurPool (stride 2) then the 1x1 conv at stride 1."""
    for block in model.modules():
        shortcut = getattr(block, "downsample", None)
        if isinstance(shortcut, nn.Sequential) and shortcut[0].stride == (2, 2):
            shortcut[0].stride = (1, 1)
            shortcut.insert(0, BlurPool2d(shortcut[0].in_channels, stride=2))


# --------------------------------------------------------------------------- width granularity
def _vit_step(params: Params) -> int:
    # Heads must divide d, and the 2D sin-cos table and the conv stem's d/4 hidden channels need d divisible
    # by 4: one step for the whole ViT family, so the variants can share one width.
    return math.lcm(params.models.vit.num_heads, 4)


def _swin_step(params: Params) -> int:
    # Stage i has width * 2**i channels, which every stage's head count must divide.
    heads = params.models.swin.num_heads
    return math.lcm(*(h // math.gcd(h, 2**i) for i, h in enumerate(heads)))


def _resnet_step(params: Params) -> int:
    return 2  # the stem width is set through timm's deep stem, whose output is 2 * stem_width


@dataclass(frozen=True)
class ArchSpec:
    """How to build one architecture of :data:`pipeline.archs.ARCHS`: builder options and width step.

    The family (hence the builder) comes from the architecture's :class:`~pipeline.archs.ArchInfo`.
    ``width_of`` names the architecture whose solved width an ablation reuses, so that the ablation changes
    one thing only (the position signal, the shift) and not the width as well; its own parameter count
    must still land within the tolerance.
    """

    step: Callable[[Params], int]
    description: str
    options: dict[str, Any] = field(default_factory=dict)
    width_of: str | None = None


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "vit": _vit, "deit": _deit, "swin": _swin, "resnet": _resnet,
    "nomix": lambda p, k, w, **o: _vit(p, k, w, position="none", mix=False),
}

SPECS: dict[str, ArchSpec] = {
    "vit": ArchSpec(_vit_step, "ViT, learned 1D position, mean readout"),
    "vit_nopos": ArchSpec(_vit_step, "ViT, no position, mean readout", {"position": "none"}, "vit"),
    "vit_sincos": ArchSpec(_vit_step, "ViT, fixed 2D sin-cos position, mean readout", {"position": "sincos"},
                           "vit"),
    "vit_sincos_init": ArchSpec(_vit_step, "ViT, learned position initialised to the 2D sin-cos table",
                                {"position": "sincos_init"}, "vit"),
    "vit_convstem": ArchSpec(_vit_step, "ViT, stride-2 3x3 conv stem", {"embed": "convstem"}, "vit"),
    "vit_overlap": ArchSpec(_vit_step, "ViT, overlapping (P+2)x(P+2) stride-P patches", {"embed": "overlap"},
                            "vit"),
    "deit": ArchSpec(_vit_step, "DeiT, class + distillation tokens, learned 1D position"),
    "deit_labels": ArchSpec(_vit_step, "DeiT trained on labels only", width_of="deit"),
    "swin": ArchSpec(_swin_step, "Swin, shifted windows", {"shift": True}),
    "swin_noshift": ArchSpec(_swin_step, "Swin, windows never shifted", {"shift": False}, "swin"),
    "swin_local": ArchSpec(_swin_step, "Swin, one stage, fixed windows", {"shift": False, "local": True}),
    "resnet": ArchSpec(_resnet_step, "ResNet (BasicBlock), 3x3 stride-1 stem, no max-pool"),
    "resnet_s1": ArchSpec(_resnet_step, "ResNet, every stride 1", {"downsample": "none"}, "resnet"),
    "resnet_aa": ArchSpec(_resnet_step, "ResNet, BlurPool downsampling", {"downsample": "blur"}, "resnet"),
    "nomix": ArchSpec(lambda p: 1, "patch embedding, per-token MLP blocks, mean readout"),
}
assert SPECS.keys() == ARCHS.keys(), "every architecture of pipeline.archs has one build row"


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
    return _BUILDERS[ARCHS[arch].family](params, num_classes, width, **spec.options)


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


def budget_table(params: Params, num_classes: int, archs: tuple[str, ...] = tuple(ARCHS)) -> pd.DataFrame:
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
