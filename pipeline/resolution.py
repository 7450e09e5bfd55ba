"""Evaluate a trained model at another image size, same patch size: the position contract in one place.

Changing the image size at a fixed patch size changes the token grid, so every position signal must be
mapped to the new grid. :data:`POSITION_CONTRACT` states, per position kind, how (each family states its own
rows); each family's adapter (:mod:`pipeline.families`) reads the kind off the module itself and does the
mapping, so new variants (a sin-cos-initialised learned embedding, a conv stem, a model without token mixing)
fall into the kind their position signal belongs to. The report prints the table beside the results; the
interface stage checks it (exact at the training size, right shapes at the others).

Images are resized from their native size (CIFAR-10: the archive's 32 px; a synthetic task: its generated
size) by ``evaluation.resolution.image_resize``: ``area`` is torch's adaptive average pooling, rounded half
up, which equals the data stage's exact block mean where the size divides the native one and pixel
repetition where it is a multiple.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeline import families
from pipeline.config import Params
from pipeline.errors import ConfigError, StageError
from pipeline.families import family_of_model
from pipeline.predict import predict
from pipeline.tasks.natural import native_images

# How each position kind maps to another image size: the families' own rows (pipeline/families/<name>.py).
POSITION_CONTRACT: dict[str, str] = families.POSITION_CONTRACT


def position_kind(model: nn.Module) -> str:
    """The position kind of ``model`` (its :data:`POSITION_CONTRACT` row), read by its family off the module."""
    fam = family_of_model(model)
    kind = fam.position(model)
    if kind not in fam.contract:
        raise StageError(f"{type(model).__name__}: position kind {kind!r} is not in family {fam.name!r}'s "
                         f"contract (it states {', '.join(fam.contract)})")
    return kind


def patch_step(model: nn.Module) -> int:
    """Image sizes must be multiples of this (the patch; times 2 per Swin patch merging; 1 for a stride-1 CNN)."""
    return family_of_model(model).size_step(model)


def at_resolution(model: nn.Module, arch: str, params: Params, size: int) -> nn.Module:
    """A copy of ``model`` mapped to ``size`` x ``size`` images at the same patch size (``model`` untouched)."""
    fam = family_of_model(model)
    if fam.resize is None and size != params.geometry.image_size:
        raise ConfigError(f"evaluation.resolution.tasks: {arch} has a fixed token grid ({fam.name} family: "
                          f"{POSITION_CONTRACT[position_kind(model)]}); it cannot be evaluated at {size} px")
    step = patch_step(model)
    if size % step:
        raise ConfigError(f"evaluation.resolution.sizes: {size} px is not a multiple of {step} for {arch}")
    out = copy.deepcopy(model)
    if fam.resize is not None:
        fam.resize(out, size, params, arch)
    return out


# --------------------------------------------------------------------------- evaluation
def native_for(task: str, task_dir: Path, index: np.ndarray, images: np.ndarray) -> np.ndarray:
    """The images a resolution sweep starts from: CIFAR-10's stored 32 px eval rows (``index``: pool rows)
    for ``natural``; for a synthetic task its own ``images`` (generated at ``geometry.image_size``)."""
    if task != "natural":
        return images
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
    method = params.evaluation.resolution.image_resize
    out = {}
    for size in sizes:
        mapped = at_resolution(model, arch, params, size)
        logits = predict(mapped, resize_images(images_native, size, method), batch_size)
        out[int(size)] = {"acc": float((logits.argmax(1) == np.asarray(labels)).mean()), "n": int(len(labels))}
    return out
