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
from pipeline.families import family
from pipeline.models import budget_table, build_model, param_count

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
def analytic_forward_flops(arch: str, params: Params, width: int, num_classes: int) -> int:
    """Forward FLOPs per image from the architecture's family formula (convention in the module docstring)."""
    return family(arch).flops(params, width, num_classes, **ARCHS[arch].options)


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
            "description": ARCHS[arch].description,
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


def tokens_per_image(arch: str, params: Params) -> int:
    """Image tokens the first layer of ``arch`` sees (patches, or pixel positions for the CNN): its family's
    count from the geometry, never read off module attribute names."""
    return family(arch).tokens(params, **ARCHS[arch].options)


def count_budget(arch: str, model: nn.Module, params: Params, steps: int, teacher: dict | None) -> dict:
    """Counted (not measured) budget of one run; the convention is stated in ``flops_convention``.

    A distilled student is also charged its teacher's eval-mode forward on every student image and the
    teacher's whole training run (not amortised over the students it teaches).
    """
    batch = params.train.recipe.batch_size
    images = steps * batch
    fwd = measured_forward_flops(model, params)
    tokens = tokens_per_image(arch, params)
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
