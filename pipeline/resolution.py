"""Evaluate a trained model at another image size, same patch size: the position contract in one place.

Changing the image size at a fixed patch size changes the token grid, so every position signal must be
mapped to the new grid. :data:`POSITION_CONTRACT` states, per position kind, how; the kind is read
off the module itself (:func:`position_kind`), so new variants (a sin-cos-initialised learned embedding, a conv
stem, a model without token mixing) fall into the kind their position signal belongs to. The report
prints the table beside the results; the interface stage checks it (exact at the training size, right
shapes at the others).

Images are resized from their native size (CIFAR-10: the archive's 32 px; a synthetic task: its generated
size) by ``evaluation.resolution.image_resize``: ``area`` is torch's adaptive average pooling, rounded half
up, which equals the data stage's exact block mean where the size divides the native one and pixel
repetition where it is a multiple.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import torch
from timm.layers import build_sincos2d_pos_embed, resample_abs_pos_embed
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from pipeline.config import Params
from pipeline.errors import ConfigError, StageError

POSITION_CONTRACT: dict[str, str] = {
    "learned": "learned absolute embedding (nn.Parameter): timm resample_abs_pos_embed over the patch grid with "
               "evaluation.resolution.interpolation (antialiased when shrinking); class/distillation tokens' "
               "entries kept as trained; unchanged at the training grid",
    "sincos": "fixed 2D sin-cos table (buffer): recomputed by timm build_sincos2d_pos_embed for the new grid "
              "(the trained table is first checked equal to that function at the training grid)",
    "none": "no position embedding: nothing to map (only the patch grid grows or shrinks)",
    "swin": "relative position bias inside windows: the window stays at its trained (as built) size w per "
            "stage and the bias table is unchanged; blocks trained with a shift shift by w/2 wherever the stage "
            "grid exceeds w, not where the window covers the grid (timm); a grid smaller than w gets one window "
            "of the grid's size whose table is cropped to the offsets that exist (never resampled); a grid w "
            "does not tile is zero-padded to whole windows by timm (the padding tokens are attended to)",
    "conv": "convolutional, no position parameters: nothing to map (global average pool after the last stage)",
}


def position_kind(model: nn.Module) -> str:
    """The position kind of ``model`` (its :data:`POSITION_CONTRACT` row), read from its modules (not its name)."""
    if isinstance(model, SwinTransformer):
        return "swin"
    if isinstance(model, VisionTransformer):
        pe = model.pos_embed
        if pe is None:
            return "none"
        return "learned" if isinstance(pe, nn.Parameter) else "sincos"
    if any(hasattr(m, "pos_embed") or hasattr(m, "relative_position_bias_table") for m in model.modules()):
        raise StageError(f"{type(model).__name__}: a position signal this contract does not cover")
    return "conv"


def patch_step(model: nn.Module) -> int:
    """Image sizes must be multiples of this: the patch, times 2 per Swin patch merging (none for convs)."""
    fam = position_kind(model)
    if fam == "conv":
        return 1
    p = int(model.patch_embed.patch_size[0])
    return p * 2 ** (len(model.layers) - 1) if fam == "swin" else p


def at_resolution(model: nn.Module, arch: str, params: Params, size: int) -> nn.Module:
    """A copy of ``model`` mapped to ``size`` x ``size`` images at the same patch size (``model`` untouched)."""
    step = patch_step(model)
    if size % step:
        raise ConfigError(f"evaluation.resolution.sizes: {size} px is not a multiple of {step} for {arch}")
    out = copy.deepcopy(model)
    fam = position_kind(out)
    if fam == "swin":
        _swin_at(out, size)
    elif fam != "conv":
        _vit_at(out, size, params.evaluation.resolution.interpolation, arch)
    return out


def _vit_at(model: VisionTransformer, size: int, interpolation: str, arch: str) -> None:
    old = tuple(model.patch_embed.grid_size)
    if not hasattr(model.patch_embed, "set_input_size"):
        raise StageError(f"{arch}: {type(model.patch_embed).__name__} cannot change its input size")
    model.patch_embed.set_input_size(img_size=(size, size))
    new = tuple(model.patch_embed.grid_size)
    pe = model.pos_embed
    prefix = 0 if model.no_embed_class else model.num_prefix_tokens
    if position_kind(model) == "learned":
        table = resample_abs_pos_embed(pe.data, new_size=list(new), old_size=list(old), num_prefix_tokens=prefix,
                                       interpolation=interpolation, antialias=True)
        model.pos_embed = nn.Parameter(table, requires_grad=pe.requires_grad)
    elif position_kind(model) == "sincos":
        dim = pe.shape[-1]
        trained = build_sincos2d_pos_embed(list(old), dim=dim).to(pe)
        if prefix or pe.shape[1:] != trained.shape or not torch.equal(pe[0], trained):
            raise StageError(f"{arch}: its fixed position table is not timm's 2D sin-cos at the grid {old}")
        model.pos_embed = build_sincos2d_pos_embed(list(new), dim=dim).to(pe).unsqueeze(0)


def _swin_at(model: SwinTransformer, size: int) -> None:
    """timm's ``set_input_size`` with each stage's trained window, then crop (not interpolate) shrunk tables."""
    trained = {n: (b.attn.window_size, b.attn.relative_position_bias_table.detach().clone())
               for n, b in _swin_blocks(model)}
    windows = tuple(tuple(stage.blocks[0].attn.window_size) for stage in model.layers)  # as built (trained)
    with warnings.catch_warnings():  # timm interpolates a shrunk window's table first (replaced below)
        warnings.simplefilter("ignore", UserWarning)
        model.set_input_size(img_size=(size, size), window_size=windows)
    for name, block in _swin_blocks(model):
        (wh, ww), table = trained[name]
        h, w = block.attn.window_size
        if (h, w) != (wh, ww):  # the grid is smaller than the window: keep the offsets that exist
            grid = table.view(2 * wh - 1, 2 * ww - 1, -1)[wh - h:wh + h - 1, ww - w:ww + w - 1]
            block.attn.relative_position_bias_table = nn.Parameter(grid.reshape(-1, table.shape[-1]).clone())


def _swin_blocks(model: SwinTransformer):
    return [(f"{i}.{j}", b) for i, stage in enumerate(model.layers) for j, b in enumerate(stage.blocks)]


def bias_defect(trained: SwinTransformer, mapped: SwinTransformer) -> float:
    """Largest |bias difference| over every (block, head, relative offset) the mapped windows use.

    Zero means each relative offset keeps exactly its trained bias (the window-fixed contract).
    """
    worst = 0.0
    for (_, a), (_, b) in zip(_swin_blocks(trained), _swin_blocks(mapped), strict=True):
        old, new = _offset_bias(a), _offset_bias(b)
        worst = max([worst, *((new[k] - old[k]).abs().max().item() for k in new)])
    return worst


def _offset_bias(block: nn.Module) -> dict[tuple[int, int], torch.Tensor]:
    """Bias per relative offset (dy, dx) of one Swin block, (heads,) each, read from the bias it applies."""
    h, w = block.attn.window_size
    bias = block.attn._get_rel_pos_bias()[0]  # (heads, h*w, h*w)
    return {(q // w - k // w, q % w - k % w): bias[:, q, k] for q in range(h * w) for k in range(h * w)}


# --------------------------------------------------------------------------- evaluation
def native_for(task: str, task_dir: Path, index: np.ndarray, images: np.ndarray) -> np.ndarray:
    """The images a resolution sweep starts from: CIFAR-10's stored 32 px eval rows (``index``: pool rows)
    for ``natural``; for a synthetic task its own ``images`` (generated at ``geometry.image_size``)."""
    if task != "natural":
        return images
    from pipeline.tasks.natural import native_images

    return native_images(task_dir, index)


def resize_images(images: np.ndarray, size: int, method: str) -> np.ndarray:
    """uint8 (N, S, S, C) -> (N, size, size, C); ``area``: adaptive average pool, rounded half up."""
    if images.shape[1] == size:
        return images
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).double()
    if method == "area":
        y = torch.nn.functional.adaptive_avg_pool2d(x, size)
    else:
        y = torch.nn.functional.interpolate(x, size=(size, size), mode=method, align_corners=False,
                                            antialias=size < images.shape[1])
    return torch.floor(y + 0.5).clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def evaluate_resolutions(model: nn.Module, arch: str, params: Params, images_native: np.ndarray,
                         labels: np.ndarray, sizes: list[int], batch_size: int = 1000) -> dict[int, dict]:
    """``{size: {acc, n}}``: ``model`` mapped to each size (:func:`at_resolution`) on the resized images."""
    from pipeline.predict import predict

    method = params.evaluation.resolution.image_resize
    out = {}
    for size in sizes:
        mapped = at_resolution(model, arch, params, size)
        logits = predict(mapped, resize_images(images_native, size, method), batch_size)
        out[int(size)] = {"acc": float((logits.argmax(1) == np.asarray(labels)).mean()), "n": int(len(labels))}
    return out
