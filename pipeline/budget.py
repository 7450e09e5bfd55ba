"""Compute accounting: forward FLOPs per image (counted and analytic), training FLOPs, step matching.

Conventions (the report quotes them):

* **FLOPs** = 2 per multiply-add, counted only for matrix-type ops: convolutions, linear layers (bias adds
  ignored), and the two attention products Q K^T and A V. Ignored: normalisation, softmax, activations,
  residual and position adds, pooling, the attention scale and mask, window shifts and reshapes. This is
  exactly what ``torch.utils.flop_counter.FlopCounterMode`` counts, so the analytic formulas below equal the
  counter to the FLOP.
* **Measured** counts run one image (batch 1) in eval mode under the MATH attention backend: torch's CPU
  fused ``scaled_dot_product_attention`` kernel is not registered with the counter and counts 0, which
  silently drops the attention products of timm's ViT/DeiT (Swin's window attention is explicit matmuls).
* **Training** FLOPs = 3 x forward per image (backward = 2 x forward, the usual "6 N per token"
  convention of Kaplan et al. 2020 and Hoffmann et al. 2022) x images seen. A distillation teacher (eval
  mode, no backward) adds 1 x its forward per student image.
"""

from __future__ import annotations

import contextlib
import math

import pandas as pd
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from pipeline.archs import ARCHS
from pipeline.config import Params
from pipeline.models import arch_spec, budget_table, build_model

TRAIN_FORWARD_MULTIPLE = 3  # forward + backward (2 x forward)


# --------------------------------------------------------------------------- measured
def measured_forward_flops(model: nn.Module, params: Params, math_attention: bool = True) -> int:
    """Forward FLOPs for one (C, H, W) image of ``params.geometry``, counted by ``FlopCounterMode``.

    ``math_attention=False`` counts under the default attention backend, where CPU SDPA counts 0: kept only
    to document that gap. The model's train/eval mode is restored afterwards.
    """
    g = params.geometry
    first = next(model.parameters())
    x = torch.zeros(1, g.channels, g.image_size, g.image_size, device=first.device, dtype=first.dtype)
    was_training = model.training
    model.eval()
    try:
        backend = sdpa_kernel(SDPBackend.MATH) if math_attention else contextlib.nullcontext()
        with torch.no_grad(), backend, FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())


# --------------------------------------------------------------------------- analytic
def _linear(tokens: int, d_in: int, d_out: int) -> int:
    """(tokens, d_in) @ (d_in, d_out)."""
    return 2 * tokens * d_in * d_out


def _attention(tokens: int, keys: int, dim: int) -> int:
    """Q K^T (tokens x keys x dim) plus A V (tokens x keys x dim), summed over heads (dim = all heads)."""
    return 2 * 2 * tokens * keys * dim


def _transformer_block(tokens: int, keys: int, dim: int, hidden: int) -> int:
    """Pre-norm block: qkv, attention, projection, two-layer MLP; ``keys`` = tokens each query sees."""
    return (_linear(tokens, dim, 3 * dim) + _attention(tokens, keys, dim) + _linear(tokens, dim, dim)
            + _linear(tokens, dim, hidden) + _linear(tokens, hidden, dim))


def _embedding(params: Params, width: int, embed: str) -> int:
    """The patch projection onto the (H/P)^2 token grid: disjoint P x P, overlapping (P+2)^2, or a conv stem.

    A k x k convolution is a (k*k*c_in -> c_out) matmul at every output position. The conv stem halves the
    resolution with each 3x3 stride-2 convolution (``width // 4`` hidden channels, ``width`` at the end).
    """
    g = params.geometry
    n = g.grid**2
    if embed == "overlap":
        return _linear(n, (g.patch_size + 2) ** 2 * g.channels, width)
    if embed == "convstem":
        total, res, c_in = 0, g.image_size, g.channels
        steps = int(math.log2(g.patch_size))
        for i in range(steps):
            res = (res + 1) // 2
            c_out = width if i == steps - 1 else width // 4
            total += _linear(res * res, 9 * c_in, c_out)
            c_in = c_out
        return total
    return _linear(n, g.patch_size**2 * g.channels, width)  # the stride-P convolution is this matmul


def _vit_flops(params: Params, width: int, num_classes: int, prefix: int = 0, heads: int = 1,
               embed: str = "patch", mix: bool = True, **_: object) -> int:
    """Patch embedding on N = (H/P)^2 patches, depth blocks over T = N + prefix tokens, ``heads`` heads.

    ``mix=False`` (``nomix``): blocks are the MLP alone, no qkv, attention or projection.
    """
    g, v = params.geometry, params.models.vit
    tokens = g.grid**2 + prefix
    hidden = int(width * v.mlp_ratio)
    mlp = _linear(tokens, width, hidden) + _linear(tokens, hidden, width)
    block = _transformer_block(tokens, tokens, width, hidden) if mix else mlp
    return _embedding(params, width, embed) + v.depth * block + heads * _linear(1, width, num_classes)


def _swin_flops(params: Params, width: int, num_classes: int, local: bool = False, **_: object) -> int:
    """Patch embedding, then per stage: patch merging (stages > 0) and window-attention blocks.

    Stage i has dim ``width * 2**i`` on an R_i x R_i grid (R_0 = H / swin patch, halved per stage); a
    window is ``min(window_size, R_i)`` per side (timm's shrink), so every token attends to w_i^2 keys; the
    shifted-window mask changes which keys, not how many products are computed. ``local``: one stage of
    ``sum(depths)`` blocks.
    """
    g, s = params.geometry, params.models.swin
    res = g.image_size // s.patch_size
    total = _linear(res * res, s.patch_size**2 * g.channels, width)
    dim = width
    for i, depth in enumerate([sum(s.depths)] if local else s.depths):
        if i > 0:
            res //= 2
            total += _linear(res * res, 4 * dim, 2 * dim)  # PatchMerging: concat 2x2 neighbours, project
            dim *= 2
        window = min(s.window_size, res)
        total += depth * _transformer_block(res * res, window * window, dim, int(dim * s.mlp_ratio))
    return total + _linear(1, dim, num_classes)


def _resnet_flops(params: Params, width: int, num_classes: int, downsample: str = "stride", **_: object) -> int:
    """3x3 stride-1 stem, BasicBlocks (two 3x3 convs), 1x1 projection where the shape changes, fc head.

    ``downsample``: 'stride' (stride-2 first conv and shortcut), 'none' (every map at full resolution) or
    'blur' (first conv at stride 1 on the larger map, then a depthwise 3x3 stride-2 BlurPool on its output
    and on the shortcut's input: 9 multiply-adds per output value).
    """
    g, r = params.geometry, params.models.resnet
    res, c_in = g.image_size, width
    total = _linear(res * res, 9 * g.channels, width)  # a k x k convolution is a (k*k*c_in -> c_out) matmul
    for i, blocks in enumerate(r.layers):
        c, before = width * 2**i, res
        if i > 0 and downsample != "none":
            res = (res + 1) // 2  # a stride-2 3x3 conv with padding 1 (or a 3x3 blur, padded 1) rounds up
        blurred = downsample == "blur" and res != before
        for j in range(blocks):
            first_in = c_in if j == 0 else c
            conv1_res = before if j == 0 and blurred else res
            total += _linear(conv1_res**2, 9 * first_in, c) + _linear(res * res, 9 * c, c)
            if j == 0 and (i > 0 or c_in != c):
                total += _linear(res * res, c_in, c)  # projection shortcut
            if j == 0 and blurred:
                total += _linear(res * res, 9, c) + _linear(res * res, 9, c_in)  # block blur + shortcut blur
        c_in = c
    return total + _linear(1, c_in, num_classes)


_FAMILY_FLOPS = {
    "vit": _vit_flops,
    "deit": lambda p, w, k, **o: _vit_flops(p, w, k, prefix=2, heads=2),  # class + distillation token, 2 heads
    "swin": _swin_flops,
    "resnet": _resnet_flops,
    "nomix": lambda p, w, k, **o: _vit_flops(p, w, k, mix=False),
}
assert {info.family for info in ARCHS.values()} == set(_FAMILY_FLOPS)


def analytic_forward_flops(arch: str, params: Params, width: int, num_classes: int) -> int:
    """Forward FLOPs per image from the architecture's layout (convention in the module docstring)."""
    spec = arch_spec(arch)
    return _FAMILY_FLOPS[ARCHS[arch].family](params, width, num_classes, **spec.options)


# --------------------------------------------------------------------------- training budget
def train_flops_per_image(forward_flops: int, teacher_forward_flops: int = 0) -> int:
    """Training FLOPs per image: 3 x the student's forward, plus 1 x a distillation teacher's forward."""
    return TRAIN_FORWARD_MULTIPLE * forward_flops + teacher_forward_flops


def training_flops(forward_flops: int, images_seen: int, teacher_forward_flops: int = 0) -> int:
    """Training FLOPs for ``images_seen`` images (teacher cost included when ``teacher_forward_flops``)."""
    return train_flops_per_image(forward_flops, teacher_forward_flops) * images_seen


def teacher_flops(teacher_forward_flops: int, images_seen: int) -> int:
    """What a distillation teacher adds to a student's run: one eval-mode forward per student image."""
    return teacher_forward_flops * images_seen


def steps_for_flops(target_train_flops: int, flops_per_image: int, batch_size: int) -> int:
    """Optimizer steps that spend ``target_train_flops`` (the "equal training FLOPs" matching mode).

    ``flops_per_image`` is a *training* cost per image (:func:`train_flops_per_image`; include the teacher
    when its cost is charged to the student). Rounded to the nearest step, at least one, so the spent
    budget differs from the target by at most half a step's FLOPs.
    """
    for name, value in (("target_train_flops", target_train_flops), ("flops_per_image", flops_per_image),
                        ("batch_size", batch_size)):
        if value <= 0:
            raise ValueError(f"{name}: must be positive, got {value}")
    return max(1, math.floor(target_train_flops / (flops_per_image * batch_size) + 0.5))


# --------------------------------------------------------------------------- per-architecture table
def architecture_table(params: Params, num_classes: int | None = None) -> pd.DataFrame:
    """One row per architecture at its solved width: parameters and forward FLOPs per image.

    Columns: arch, description, partner (the architecture it is a control of), width, params, deviation
    (params / target - 1), forward_flops (analytic), flops_vs_partner (forward FLOPs / the partner's: a
    control's extra compute shown, not hidden), forward_flops_counted (``FlopCounterMode``, MATH attention),
    forward_flops_counted_fused (default CPU attention backend: the attention products vanish),
    train_flops_per_image (3 x forward), solve_seconds. ``num_classes`` defaults to
    ``models.reference_classes``.
    """
    num_classes = num_classes or params.models.reference_classes
    table = budget_table(params, num_classes)
    rows = []
    for arch, width in zip(table.arch, table.width, strict=True):
        model = build_model(arch, params, num_classes, width=int(width))
        analytic = analytic_forward_flops(arch, params, int(width), num_classes)
        rows.append({
            "description": arch_spec(arch).description,
            "partner": ARCHS[arch].partner or "",
            "forward_flops": analytic,
            "forward_flops_counted": measured_forward_flops(model, params),
            "forward_flops_counted_fused": measured_forward_flops(model, params, math_attention=False),
            "train_flops_per_image": train_flops_per_image(analytic),
        })
    out = pd.concat([table, pd.DataFrame(rows)], axis=1)
    flops = dict(zip(out.arch, out.forward_flops, strict=True))
    out["flops_vs_partner"] = [flops[a] / flops[p] if p in flops else float("nan")
                               for a, p in zip(out.arch, out.partner, strict=True)]
    first = ["arch", "description", "partner", "width", "params", "deviation", "forward_flops", "flops_vs_partner"]
    return out[first + [c for c in out.columns if c not in first]]


# --------------------------------------------------------------------------- one run's budget (runcore)
FLOPS_CONVENTION = ("2 FLOPs per multiply-add of matmul/conv ops (torch FlopCounterMode, MATH attention); "
                    "train = 3 x forward")


def tokens_per_image(model: nn.Module, params: Params) -> int:
    """Image tokens the first layer sees: patches for ViT/DeiT/Swin, pixel positions for the CNN."""
    pe = getattr(model, "patch_embed", None)
    if pe is not None and getattr(pe, "num_patches", None):
        return int(pe.num_patches)
    return params.geometry.image_size ** 2


def count_budget(model: nn.Module, params: Params, steps: int, teacher: dict | None) -> dict:
    """Counted (not measured) budget of one run; the convention is stated in ``flops_convention``.

    A distilled student is also charged its teacher's eval-mode forward on every student image and the
    teacher's whole training run (not amortised over the students it teaches).
    """
    from pipeline.models import param_count

    batch = params.train.recipe.batch_size
    images = steps * batch
    fwd = measured_forward_flops(model, params)
    tokens = tokens_per_image(model, params)
    counts = {
        "params": param_count(model), "optimizer_steps": steps, "batch_size": batch, "images_seen": images,
        "tokens_per_image": tokens, "tokens_seen": images * tokens, "forward_flops_per_image": fwd,
        "train_flops": training_flops(fwd, images),
        "teacher_forward_flops": teacher_flops(teacher["forward_flops_per_image"], images) if teacher else 0,
        "teacher_train_flops": teacher["train_flops"] if teacher else 0,
        "flops_convention": FLOPS_CONVENTION,
    }
    counts["total_flops_with_teacher"] = (counts["train_flops"] + counts["teacher_forward_flops"]
                                          + counts["teacher_train_flops"])
    return counts


def optimizer_steps(model: nn.Module, params: Params, num_classes: int, budget_mode: str, steps: int) -> int:
    """``steps`` for every arch (criterion: the cap), or (flops) as many as the reference arch's FLOPs at
    ``steps`` buy."""
    if budget_mode in ("steps", "criterion"):
        return steps
    r = params.train.recipe
    ref = build_model(r.flops_reference_arch, params, num_classes)
    target = training_flops(measured_forward_flops(ref, params), steps * r.batch_size)
    own = train_flops_per_image(measured_forward_flops(model, params))
    return steps_for_flops(target, own, r.batch_size)
